"""The CPU cores this process may run on, and whether other work keeps them busy.

Why the second matters: torch's operators and scratchgpt's C kernels split their work between
threads that meet at the end of each parallel region. On an idle machine that is what makes two
threads faster than one; where other processes keep the cores busy, a step waits at every
region for the thread the system is not running, and training can be ten times slower than on
one thread (docs/BENCHMARKS.md, "On a busy machine"). A command that trains says so
(:func:`busy_load`), rather than choosing the threads itself: the load average it reads lags
a minute behind, and a run lasts longer than the load it began with.

>>> cores() >= 1
True
"""

from __future__ import annotations

import os


def cores() -> int:
    """The CPU cores this process may run on (its affinity, where the system reports one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity call
        return os.cpu_count() or 1


def busy_load() -> float | None:
    """The load average of the last minute where it is above :func:`cores` (more threads
    ready to run than there are cores to run them), else None (an idle or calm machine, or a
    system that reports no load average)."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # (Windows has none)
        return None
    return load if load > cores() else None
