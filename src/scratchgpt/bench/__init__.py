"""Benchmarks, one module each (see scratchgpt.commands.bench)."""


def refuse_repeats(flag: str, names: list[str]) -> None:
    """A list flag (``--archs``, ``--cells``) naming one choice twice is refused: each one
    ran again, a row of the table each time (``bench seq2seq``: another ``--budget`` of
    training, 10 minutes by default)."""
    from scratchgpt.errors import ConfigError

    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{flag} names {', '.join(twice)} more than once")


def cores() -> int:
    """The CPU cores this process may run on (its affinity, where the system reports one)."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity call
        return os.cpu_count() or 1


def _within_cores(n: int, text: str, low: str) -> int:
    """``n`` (``--threads``, as typed: ``text``), refused above :func:`cores`: threads beyond
    the cores take turns on them, and the figures would time the turns, not the benchmark."""
    import argparse

    most = cores()
    if n > most:
        raise argparse.ArgumentTypeError(
            f"expected {low} to {most} threads (this machine's CPU cores: more would take "
            f"turns on them, and the figures would time the turns), got {text!r}")
    return n


def bench_threads(text: str) -> int:
    """A benchmark's ``--threads``: 0 (torch's default, one per core) up to the cores.

    >>> bench_threads("0"), bench_threads("1")
    (0, 1)
    """
    from scratchgpt.commands.argtypes import thread_count

    return _within_cores(thread_count(text), text, "0 (one per core)")


def bench_threads_positive(text: str) -> int:
    """A benchmark's ``--threads`` where 0 has no meaning: 1 up to the cores.

    >>> bench_threads_positive("1")
    1
    """
    from scratchgpt.commands.argtypes import positive_int

    return _within_cores(positive_int(text), text, "1")
