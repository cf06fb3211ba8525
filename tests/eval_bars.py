"""A task's final evaluation run without its bars and with them, for the tests that check the
bars show and change nothing: the figures of each pass and what each wrote on stderr."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from scratchgpt.training.task import EvalSetting


def quiet_and_shown(task: Callable[[], Any], model: torch.nn.Module, batch_size: int,
                    capsys) -> tuple[list[dict[str, float]], str, str]:
    """(the final figures of both passes, stderr without the bars, stderr with them), each
    pass on a fresh ``task()``, in fp32 on the CPU, one batch for the train estimate."""
    figures, errs = [], []
    for progress in (False, True):
        setting = EvalSetting(torch.device("cpu"), "fp32", batch_size, 0, progress)
        figures.append(task().final_metrics(model, 1, setting))
        errs.append(capsys.readouterr().err)
    return figures, errs[0], errs[1]


def last_drawing(err: str, bar: str) -> str:
    """The last drawing of the bar named ``bar`` on a terminal's stderr ``err``."""
    return [line for line in err.split("\r") if line.startswith(bar)][-1]
