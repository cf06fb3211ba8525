"""Where a run stands, saved in every checkpoint so that ``--resume`` continues exactly."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from scratchgpt.errors import CheckpointError


@dataclass
class TrainState:
    """Progress and random state of a run.

    ``rng`` holds the generator states: ``batch`` (the batch stream, shared by every process of
    a data-parallel group), ``torch``/``cuda`` (each process's dropout, one entry per rank).
    ``task`` holds whatever the task needs to continue its batches exactly (e.g. an epoch's
    order). ``val_loss`` is the evaluation this checkpoint was saved after (None: saved without
    one, e.g. on Ctrl-C). ``final``: the figures of the final evaluation, once the run has
    made it at this step (a resumed run with nothing left to train reports them again rather
    than evaluating and logging twice); empty until then.
    """

    step: int = 0
    tokens: int = 0
    elapsed_s: float = 0.0
    best_val_loss: float = math.inf
    val_loss: float | None = None
    rng: dict[str, Any] = field(default_factory=dict)
    task: dict[str, Any] = field(default_factory=dict)
    final: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any], where: str = "checkpoint") -> TrainState:
        try:
            return cls(**values)
        except TypeError as e:
            raise CheckpointError(f"{where}: damaged training state ({e})") from None


def capture_rng(batch_gen: torch.Generator, device: torch.device) -> dict[str, Any]:
    """This process's generator states (the per-rank lists are filled in by the trainer)."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return {"batch": batch_gen.get_state(), "torch_per_rank": [torch.get_rng_state()],
            "cuda_per_rank": [cuda]}


def restore_rng(rng: dict[str, Any], batch_gen: torch.Generator, rank: int, world: int,
                device: torch.device) -> None:
    """Put back the batch stream, and this rank's dropout generators when the group has the
    size it had (a different group size starts fresh dropout seeds: nothing else to do)."""
    batch_gen.set_state(rng["batch"])
    torch_states = rng.get("torch_per_rank") or []
    if len(torch_states) != world:
        return
    torch.set_rng_state(torch_states[rank])
    cuda_states = rng.get("cuda_per_rank") or [None] * world
    if device.type == "cuda" and cuda_states[rank] is not None:
        torch.cuda.set_rng_state(cuda_states[rank], device)
