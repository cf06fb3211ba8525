"""The ``scratchgpt`` command line: one subcommand per step of the path from text to model.

Each subcommand lives in ``scratchgpt/commands/<name>.py`` with ``add_parser(subparsers)`` (which
sets ``func``) and keeps heavy imports (torch) inside the function that runs, so ``--help`` is
instant. Bad input raises a :class:`~scratchgpt.errors.ScratchGPTError`, which ends as one
line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from scratchgpt import __version__
from scratchgpt.errors import ScratchGPTError

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




def main(argv: Sequence[str] | None = None) -> int:
    """Entry point. Returns the process exit code (0 ok, 2 bad input, 130 interrupted)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ScratchGPTError as e:
        print(f"scratchgpt {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"scratchgpt {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
