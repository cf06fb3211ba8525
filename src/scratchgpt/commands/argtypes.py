"""argparse ``type=`` helpers shared by several commands."""

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
