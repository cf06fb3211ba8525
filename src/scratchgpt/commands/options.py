"""Command-line flags generated from config dataclasses, so every hyperparameter is a flag
with its default and help text in exactly one place (the dataclass)."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any

_TYPES = {int: int, float: float, str: str}


def add_dataclass_flags(parser: argparse.ArgumentParser | Any, cls: type,
                        skip: set[str] = frozenset(), seen: set[str] | None = None) -> None:
    """Add ``--field-name`` for each field of ``cls`` (except ``init=False`` ones, which the
    class fixes itself). Defaults are None (meaning "not given"), so the caller can layer
    defaults < preset < config file < flags."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init or f.name in skip or (seen is not None and f.name in seen):
            continue
        if seen is not None:
            seen.add(f.name)
        flag = "--" + f.name.replace("_", "-")
        typ = hints[f.name]
        default = f.default if f.default is not dataclasses.MISSING else None
        help_text = f.metadata.get("help", "")
        help_text = f"{help_text} (default: {default})" if help_text else f"default: {default}"
        if typ is bool:
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                                default=None, help=help_text)
        else:
            base = typing.get_args(typ)[0] if typing.get_args(typ) else typ
            parser.add_argument(flag, dest=f.name, type=_TYPES.get(base, str), default=None,
                                metavar=f.name.upper(), help=help_text)


def given(args: argparse.Namespace, names: set[str]) -> dict[str, Any]:
    """The subset of ``names`` the user set on the command line."""
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
