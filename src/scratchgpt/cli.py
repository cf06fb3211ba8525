"""The ``scratchgpt`` command line: one subcommand per step of the path from text to model.

Each subcommand lives in ``scratchgpt/commands/<name>.py`` with ``add_parser(subparsers)`` (which
sets ``func``) and keeps heavy imports (torch) inside the function that runs, so ``--help`` is
instant. Bad input raises a :class:`~scratchgpt.errors.ScratchGPTError`, which ends as one
line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import signal
import sys
import threading
from collections.abc import Iterator, Sequence

from scratchgpt import __version__
from scratchgpt.errors import ScratchGPTError, Terminated

# Order here is the order in `scratchgpt --help`.
COMMAND_MODULES = (
    "prepare",
    "train",
    "finetune",
    "sample",
    "chat",
    "classify",
    "eval",
    "inspect",
    "attention",
    "seq2seq",
    "experiment",
    "convert",
    "serve",
    "bench",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scratchgpt",
        description="Build language models from scratch: prepare text, train, sample, evaluate.",
        epilog="Run 'scratchgpt COMMAND --help' for the options of a command.",
    )
    parser.add_argument("--version", action="version", version=f"scratchgpt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(f"scratchgpt.commands.{name}").add_parser(sub)
    return parser


def _terminate(signum: int, frame: object) -> None:
    raise Terminated


@contextlib.contextmanager
def _sigterm_stops() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` for the duration of the block (where it would
    otherwise kill the process on the spot: the main thread, default handler)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM are recorded, not raised, for the duration of the block, then raised
    once it is over. For imports: torch's and numpy's import machinery sometimes swallows a
    KeyboardInterrupt raised inside it, leaving a half-imported module, and the command would
    run on as if never interrupted (or fail with a traceback)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: pending.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)
                if signal.getsignal(sig) not in (signal.SIG_IGN, None)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if pending:
        raise Terminated if pending[0] == signal.SIGTERM else KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point. Returns the process exit code (0 ok, 2 bad input or a file that cannot be
    written, 130 interrupted, 143 terminated)."""
    command = "scratchgpt"
    try:
        with _sigterm_stops():
            with _signals_held():  # the command modules import torch
                parser = build_parser()
            args = parser.parse_args(argv)
            command = f"scratchgpt {args.command}"
            return int(args.func(args) or 0)
    except ScratchGPTError as e:
        return _fail(command, str(e))
    except KeyboardInterrupt as e:
        stopped = "terminated" if isinstance(e, Terminated) else "interrupted"
        print(f"{command}: {stopped}", file=sys.stderr)
        return 143 if isinstance(e, Terminated) else 130
    except BrokenPipeError:
        return 0
    except OSError as e:  # the machine, not scratchgpt: a full disk, a read-only directory
        where = f": {e.filename}" if e.filename else ""
        return _fail(command, f"{e.strerror or e}{where}")


def _fail(command: str, message: str) -> int:
    """One line on stderr, exit code 2."""
    print(f"{command}: error: {' '.join(message.split())}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
