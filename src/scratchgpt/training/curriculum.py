"""The shape of a language model's training batch at each update: the sequence-length warmup
and the batch-size ramp of the training speedruns (modded-nanogpt).

Early in training a model learns mostly short-range statistics, which short windows and few
rows teach as well as long ones at a fraction of the cost: the same wall time buys more
updates. Both grow linearly with the update number to the full ``block_size`` and
``batch_size``, so they are pure functions of the step and a resumed run draws exactly the
batches an uninterrupted one would.

>>> [window_length(s, 300, 64) for s in (0, 100, 200, 299, 300)]
[16, 32, 48, 56, 64]
>>> [batch_rows(s, 100, 16) for s in (0, 50, 100)]
[4, 10, 16]
"""

from __future__ import annotations

START = 0.25  # both start at a quarter of their full size
WINDOW_STEP = 8  # window lengths are multiples of this (few distinct shapes to run)


def _grown(step: int, iters: int, full: int) -> float:
    """Linear from ``START * full`` at step 0 to ``full`` at step ``iters``."""
    return full * (START + (1.0 - START) * min(step / iters, 1.0))


def window_length(step: int, iters: int, block_size: int) -> int:
    """Training window length at ``step`` under a warmup of ``iters`` updates (0 = none):
    rounded down to a multiple of 8 tokens, at least 8 (or the whole context, if shorter)."""
    if iters <= 0 or step >= iters:
        return block_size
    length = int(_grown(step, iters, block_size)) // WINDOW_STEP * WINDOW_STEP
    return min(block_size, max(length, WINDOW_STEP))


def batch_rows(step: int, iters: int, batch_size: int) -> int:
    """Rows of the batch at ``step`` under a ramp of ``iters`` updates (0 = none), at least 1."""
    if iters <= 0 or step >= iters:
        return batch_size
    return max(1, round(_grown(step, iters, batch_size)))
