"""Keep the memory a training step frees for the next step (glibc's malloc on Linux).

Why: every step allocates and frees the same tensors: activations, gradients, temporaries,
most of them between 100 KB and a few MB. By default glibc's ``malloc`` serves blocks above a
threshold with fresh ``mmap`` pages and gives them back on ``free``, and gives back the top of
its heap once more than a threshold of it is free. Both thresholds move as the program runs,
so from one run to the next a CPU training process either reuses its memory or faults in,
zeroes and returns megabytes of pages every step. At nanoGPT's CPU recipe shape (600 steps of a
4-layer, 128-dim model) we counted 0.2 to 1.3 million page faults in the steps of one run and
another 0.55 million in the final evaluation, against ~11,000 with the settings below; the runs
with the most faults were the slowest, by seconds (docs/BENCHMARKS.md).

What: :func:`keep_freed_memory` fixes both thresholds once, for the whole process: blocks up to
32 MiB (glibc's largest allowed threshold) come from the heap, and the heap is not trimmed
until 1 GiB of it is free. A process then holds on to its peak working set until it ends,
which is what a training process reuses every step anyway (and ``scratchgpt eval`` every
batch); blocks above 32 MiB (a large vocabulary's logits) are still mapped and returned as
before.

It does nothing where the C library is not glibc (macOS, musl), when ``MALLOC_MMAP_THRESHOLD_``
or ``MALLOC_TRIM_THRESHOLD_`` is set (the user's own tuning wins), or with
``SCRATCHGPT_MALLOC=default``.
"""

from __future__ import annotations

import ctypes
import functools
import os

M_TRIM_THRESHOLD = -1  # mallopt's parameter numbers, from glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 1 << 30
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


@functools.cache
def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds as the module docstring says, once per process.
    True when they were set."""
    if os.environ.get("SCRATCHGPT_MALLOC", "").lower() == "default":
        return False
    if any(name in os.environ for name in USER_SETTINGS):
        return False
    if not _glibc():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    # mallopt returns 1 on success; setting either one also stops glibc moving both.
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def _glibc() -> bool:
    """Whether this process runs on glibc (``confstr`` knows only there)."""
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") is not None
    except (ValueError, OSError, AttributeError):  # no such name on this system
        return False
