"""Command-line flags generated from config dataclasses, so every hyperparameter is a flag
with its default and help text in exactly one place (the dataclass)."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any

from scratchgpt.validation import flag_of

_TYPES = {int: int, float: float, str: str}


def add_dataclass_flags(parser: argparse.ArgumentParser | Any, cls: type,
                        skip: set[str] = frozenset(), seen: set[str] | None = None,
                        shown: dict[str, Any] | None = None,
                        helps: dict[str, str] | None = None) -> None:
    """Add ``--field-name`` for each field of ``cls`` (except ``init=False`` ones, which the
    class fixes itself), and the other names in the field's ``aliases`` metadata. Defaults are
    None (meaning "not given"), so the caller can layer defaults < preset < config file <
    flags. ``shown``: the default a command's help states instead of the field's, where the
    command sets its own; ``helps``: a command's own text for a field, where the field's
    would mislead there."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init or f.name in skip or (seen is not None and f.name in seen):
            continue
        if seen is not None:
            seen.add(f.name)
        flags = [flag_of(f.name), *f.metadata.get("aliases", ())]
        typ = hints[f.name]
        default = f.default if f.default is not dataclasses.MISSING else None
        default = (shown or {}).get(f.name, show_default(default))
        help_text = (helps or {}).get(f.name, f.metadata.get("help", ""))
        help_text = f"{help_text} (default: {default})" if help_text else f"default: {default}"
        if typ is bool:
            parser.add_argument(*flags, dest=f.name, action=argparse.BooleanOptionalAction,
                                default=None, help=help_text)
        else:
            base = typing.get_args(typ)[0] if typing.get_args(typ) else typ
            parser.add_argument(*flags, dest=f.name, type=_TYPES.get(base, str), default=None,
                                metavar=f.name.upper(), help=help_text)


def show_default(value: Any) -> str:
    """A default as --help words it: a switch ``on``/``off``, an unset setting ``unset``, an
    empty string ``none``.

    >>> show_default(False), show_default(None), show_default(""), show_default(0.1)
    ('off', 'unset', 'none', '0.1')
    """
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "unset"
    return str(value) if value != "" else "none"


def given(args: argparse.Namespace, names: set[str]) -> dict[str, Any]:
    """The subset of ``names`` the user set on the command line."""
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


LORA_FLAGS = ("lora_rank", "lora_alpha", "lora_dropout", "lora_targets")


def add_lora_flags(parser: argparse.ArgumentParser) -> None:
    """``--lora`` and ``--lora-rank/-alpha/-dropout/-targets`` (any of them implies ``--lora``,
    as each one's help says); defaults and help from :class:`~scratchgpt.models.lora.LoRAConfig`."""
    from scratchgpt.models.configs.lora import LoRAConfig

    g = parser.add_argument_group(
        "LoRA (low-rank adapters: the base's weights stay frozen, each adapted layer learns "
        "W + (alpha/r) B A; the run also writes adapter.pt, only the trained tensors)")
    g.add_argument("--lora", action="store_true", help="train LoRA adapters instead of the "
                                                       "model's weights")
    for f in dataclasses.fields(LoRAConfig):
        typ = {"int": int, "float": float}.get(str(f.type), str)
        g.add_argument(f"--lora-{f.name}", dest=f"lora_{f.name}", type=typ, default=None,
                       metavar=f.name.upper(),
                       help=f"{f.metadata.get('help', '')} (default: {f.default}; "
                            "implies --lora)")


def lora_flags(args: argparse.Namespace) -> list[str]:
    """The LoRA flags given, as typed (``--lora``, ``--lora-rank`` ...): each turns LoRA on
    (:func:`scratchgpt.finetune.plan.lora_named` names them in an error)."""
    return (["--lora"] if args.lora else []) + [
        flag_of(name) for name in LORA_FLAGS
        if getattr(args, name, None) is not None]


def lora_from_args(args: argparse.Namespace) -> Any:
    """The :class:`~scratchgpt.models.lora.LoRAConfig` the flags ask for, or None."""
    from scratchgpt.finetune.plan import lora_flags_named
    from scratchgpt.models.configs.lora import LoRAConfig

    values = {name[len("lora_"):]: getattr(args, name) for name in LORA_FLAGS
              if getattr(args, name, None) is not None}
    if not (args.lora or values):
        return None
    with lora_flags_named():  # (LoRAConfig names its fields: rank must be >= 1)
        return LoRAConfig(**values)
