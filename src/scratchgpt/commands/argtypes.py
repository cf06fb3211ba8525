"""argparse ``type=`` helpers shared by several commands."""

from __future__ import annotations

import argparse
import re

_UNITS = {"s": 1, "m": 60, "h": 3600}


def duration(text: str) -> float:
    """``"90"``, ``"90s"``, ``"10m"``, ``"1.5h"`` -> seconds (> 0)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([smh]?)\s*", text)
    if not m or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r} (use e.g. 90s, 10m, 1.5h)")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return n
