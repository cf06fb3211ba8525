"""Benchmarks, one module each (see scratchgpt.commands.bench)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import argparse
    from contextlib import AbstractContextManager


def refuse_repeats(flag: str, names: list[str]) -> None:
    """A list flag (``--archs``, ``--cells``) naming one choice twice is refused: each one
    ran again, a row of the table each time (``bench seq2seq``: another ``--budget`` of
    training, 10 minutes by default)."""
    from scratchgpt.errors import ConfigError

    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{flag} names {', '.join(twice)} more than once")


def _within_cores(n: int, text: str, low: str) -> int:
    """``n`` (``--threads``, as typed: ``text``), refused above :func:`cores`: threads beyond
    the cores take turns on them, and the figures would time the turns, not the benchmark."""
    import argparse

    from scratchgpt.cpu import cores
    from scratchgpt.wording import plural

    most = cores()
    if n > most:
        raise argparse.ArgumentTypeError(
            f"expected {low} to {plural(most, 'thread')} (this machine's CPU cores: more would "
            f"take turns on them, and the figures would time the turns), got {text!r}")
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


STDOUT = "-"  # what --json holds when given no FILE (and --json - asks the same)
JSON_HELP = ("the figures as one JSON object: on stdout without FILE (what the benchmark "
             "prints otherwise then goes to stderr), into FILE with it (checked before the "
             "benchmark runs; an existing FILE is kept unless --overwrite); a run stopped by "
             "Ctrl-C gives what it measured, marked \"interrupted\": true")


def add_json_argument(p: argparse.ArgumentParser, overwrite: bool = True) -> None:
    """Every benchmark's ``--json [FILE]`` (and ``--overwrite`` of FILE, unless the benchmark
    has its own ``--overwrite`` that covers FILE too): see :class:`JsonOutput`."""
    p.add_argument("--json", nargs="?", const=STDOUT, metavar="FILE", help=JSON_HELP)
    if overwrite:
        p.add_argument("--overwrite", action="store_true", help="replace --json FILE if it exists")


class JsonOutput:
    """Where a benchmark's figures go: ``--json`` alone prints one JSON object on stdout,
    ``--json FILE`` writes it (``FILE`` checked by :func:`results_file` when this is made,
    before any work), no ``--json`` neither. Every figures object says whether Ctrl-C (or
    SIGTERM) stopped the run: ``"interrupted"``."""

    def __init__(self, args: argparse.Namespace) -> None:
        import sys

        from scratchgpt.commands.argtypes import results_file

        self.stdout = sys.stdout if args.json == STDOUT else None
        self.file = None if self.stdout is not None else results_file(args.json, args.overwrite)

    def emit(self, figures: dict[str, Any], interrupted: bool = False) -> None:
        import json

        from scratchgpt.commands.argtypes import write_results

        figures = {**figures, "interrupted": interrupted}
        if self.stdout is not None:
            print(json.dumps(figures), file=self.stdout, flush=True)
        else:
            write_results(self.file, figures)

    def printing(self) -> AbstractContextManager[Any]:
        """A context for the benchmark's run: what it prints goes to stderr while the JSON
        object has stdout, so that stdout holds that object alone."""
        import contextlib
        import sys

        if self.stdout is None:
            return contextlib.nullcontext()
        return contextlib.redirect_stdout(sys.stderr)

    def kept_on_interrupt(self, measured: Callable[[], dict[str, Any] | None],
                          show: Callable[[dict[str, Any]], None] | None = None
                          ) -> AbstractContextManager[None]:
        """A context in which Ctrl-C (or SIGTERM) emits ``measured()`` (the figures so far,
        or None while nothing is measured yet), marked interrupted, and goes on stopping the
        run (exit 130, or 143). ``show``, for a benchmark that prints its table at the end,
        prints those figures first as the table: without --json a stopped run printed
        nothing of what it had measured."""
        import contextlib

        @contextlib.contextmanager
        def kept() -> Any:
            try:
                yield
            except KeyboardInterrupt:
                figures = measured()
                if figures is not None:
                    if show is not None:
                        with self.printing():
                            show(figures)
                    self.emit(figures, interrupted=True)
                raise

        return kept()
