"""What the first stop signal says a run will do (training/stopping.py)."""

from __future__ import annotations

import signal

from scratchgpt.training import distributed
from scratchgpt.training.stopping import StopFlag


def announced(capsys, saves: bool = True) -> str:
    """The message of a first SIGINT, delivered to a fresh flag as the handler would be."""
    flag = StopFlag(distributed.current(), saves=saves)
    flag._request(signal.SIGINT, None)
    assert flag.requested and flag.exit_code == 130
    return capsys.readouterr().err.strip()


def test_a_run_with_a_directory_is_told_it_saves_last_pt(capsys):
    said = announced(capsys)
    assert said.startswith("SIGINT: stopping after this step and saving last.pt"), said


def test_a_run_that_keeps_no_files_is_not_promised_a_last_pt(capsys):
    said = announced(capsys, saves=False)
    assert said.startswith("SIGINT: stopping after this step (send it again"), said
