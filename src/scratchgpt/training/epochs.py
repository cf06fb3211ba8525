"""Epochs over a list of examples, batched by length, and over the windows of a token stream;
both resumable exactly.

Tasks that train on examples (seq2seq pairs, labelled texts, instructions) rather than windows
of a token stream draw their batches here: each epoch sorts the examples by length (ties in
random order), cuts them into batches (little padding) and shuffles the batches, all with the
training core's generator. :class:`EpochBatches` remembers the generator state at the epoch's
start and how far into the epoch it is, so a resumed run rebuilds the same epoch and continues
with the very next batch.

>>> epochs = EpochBatches([3, 1, 2, 5, 4])
>>> gen = torch.Generator().manual_seed(0)
>>> seen = [i for _ in range(3) for i in epochs.next(2, gen)]
>>> sorted(seen)  # one epoch: every example once
[0, 1, 2, 3, 4]

A language model trains on windows of one long token stream. :class:`EpochWindows` takes them
epoch by epoch: every window of a random phase once, in random order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor


def length_batches(lengths: Sequence[int], batch_size: int,
                   generator: torch.Generator) -> list[list[int]]:
    """One epoch of index batches: sorted by length (ties in random order), cut into batches,
    batches shuffled. Similar lengths share a batch, so little of it is padding."""
    ties = torch.rand(len(lengths), generator=generator).tolist()
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], ties[i]))
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


class EpochBatches:
    """The batch stream of a task that trains on examples of these ``lengths``."""

    def __init__(self, lengths: Sequence[int]):
        self.lengths = list(lengths)
        self._epoch_rng: Tensor | None = None  # generator state at the current epoch's start
        self._shape = (0, False)  # (global batch size, last short batch dropped)
        self._batches: list[list[int]] = []
        self._pos = 0

    def next(self, batch_size: int, generator: torch.Generator,
             shard: tuple[int, int] = (0, 1)) -> list[int]:
        """This process's indices of the next global batch (``shard`` = (rank, world size);
        each process takes its ``batch_size`` rows of a ``batch_size * world`` batch)."""
        rank, world = shard
        if self._pos >= len(self._batches):
            self._new_epoch(batch_size * world, generator, drop_last=world > 1)
        idx = self._batches[self._pos][rank * batch_size:(rank + 1) * batch_size]
        self._pos += 1
        return idx

    def _new_epoch(self, global_batch: int, generator: torch.Generator, drop_last: bool) -> None:
        self._epoch_rng = generator.get_state()
        self._shape = (global_batch, drop_last)
        self._batches = length_batches(self.lengths, global_batch, generator)
        if drop_last:  # every process needs its full share of every batch
            self._batches = [b for b in self._batches if len(b) == global_batch]
        self._pos = 0

    def state_dict(self) -> dict[str, Any]:
        global_batch, drop_last = self._shape
        return {"epoch_rng": self._epoch_rng, "pos": self._pos, "global_batch": global_batch,
                "drop_last": drop_last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("epoch_rng") is None:
            return
        generator = torch.Generator()
        generator.set_state(state["epoch_rng"])
        self._new_epoch(state["global_batch"], generator, state["drop_last"])
        self._pos = state["pos"]


class EpochWindows:
    """Start offsets of a language model's training windows, epoch by epoch.

    Each epoch draws a phase ``p`` in ``[0, block_size)`` and takes every window starting at
    ``p + k * block_size`` once, in random order: the windows of an epoch tile the stream, so
    every token is trained on once per epoch, and the phase moves the cuts between epochs.
    Independent random starts (nanoGPT's ``get_batch``) leave about a third of the stream
    unseen after one stream's worth of windows (e^-1), and repeat other parts.

    A window holds ``block_size + 1`` tokens (inputs and their next-token targets); one of a
    shorter length (a sequence-length warmup) is the start of the same window.

    >>> w = EpochWindows(n_tokens=41, block_size=8)  # 4 windows an epoch
    >>> gen = torch.Generator().manual_seed(0)
    >>> starts = [int(s) for _ in range(2) for s in w.next(2, gen)]
    >>> sorted(s // 8 for s in starts), len({s % 8 for s in starts})  # one epoch, one phase
    ([0, 1, 2, 3], 1)
    """

    def __init__(self, n_tokens: int, block_size: int):
        if n_tokens < block_size + 1:
            raise ValueError(f"{n_tokens} tokens hold no window of {block_size} + 1")
        self.block_size = block_size
        # as many windows as every phase can fit, and the phases that fit them (fewer than
        # block_size only for a stream shorter than two windows)
        self.per_epoch = max(1, (n_tokens - block_size) // block_size)
        self.phases = min(block_size, n_tokens - self.per_epoch * block_size)
        self._epoch_rng: Tensor | None = None  # generator state at the current epoch's start
        self._starts = np.zeros(0, dtype=np.int64)
        self._pos = 0

    def next(self, batch_size: int, generator: torch.Generator,
             shard: tuple[int, int] = (0, 1)) -> np.ndarray:
        """This process's start offsets of the next global batch, (batch_size,) int64
        (``shard`` = (rank, world size): each process takes its ``batch_size`` rows of a
        ``batch_size * world`` batch). A batch that runs past an epoch's end goes on into the
        next epoch."""
        rank, world = shard
        need, parts = batch_size * world, []
        while need:
            if self._pos >= len(self._starts):
                self._new_epoch(generator)
            part = self._starts[self._pos:self._pos + need]
            self._pos += len(part)
            need -= len(part)
            parts.append(part)
        return np.concatenate(parts)[rank * batch_size:(rank + 1) * batch_size]

    def _new_epoch(self, generator: torch.Generator) -> None:
        self._epoch_rng = generator.get_state()
        phase = int(torch.randint(self.phases, (1,), generator=generator))
        order = torch.randperm(self.per_epoch, generator=generator).numpy()
        self._starts = phase + order.astype(np.int64) * self.block_size
        self._pos = 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch_rng": self._epoch_rng, "pos": self._pos}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("epoch_rng") is None:
            return
        generator = torch.Generator()
        generator.set_state(state["epoch_rng"])
        self._new_epoch(generator)
        self._pos = state["pos"]


def steps_per_epoch(n_examples: int, global_batch: int) -> int:
    """Optimizer steps in one pass over ``n_examples`` (the last batch may be short)."""
    return max(1, -(-n_examples // global_batch))
