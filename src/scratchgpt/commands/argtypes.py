"""argparse helpers shared by several commands: ``type=`` functions, and the flags that mean
the same in every command."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return n


def add_which_flag(p: argparse.ArgumentParser) -> None:
    """``--which best|last``: which checkpoint of a run directory a command reads."""
    p.add_argument("--which", choices=("best", "last"), default="best",
                   help="checkpoint of a run directory to use (default: best)")
