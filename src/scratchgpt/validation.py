"""Checking dataclass configs built from untrusted data (config files, checkpoints, flags).

A config file may say ``batch_size = "12"`` or ``learning_rate = inf``; a checkpoint may claim a
billion layers. :func:`check_types` and :func:`check_range` turn such values into one-line
:class:`~scratchgpt.errors.ConfigError` messages that name the setting, before anything is built.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import re
import types
import typing
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from scratchgpt.errors import ConfigError

T = TypeVar("T")


def _allowed(annotation: Any) -> tuple[type, ...]:
    """The runtime types a field annotation admits (``float`` admits ``int`` too)."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return tuple(t for a in args for t in _allowed(a))
    if annotation is float:
        return (float, int)
    if annotation is type(None):
        return (type(None),)
    return (annotation,) if isinstance(annotation, type) else (object,)


def check_types(config: Any) -> None:
    """Every field of the dataclass instance ``config`` holds a value of its declared type.

    >>> @dataclasses.dataclass
    ... class C:
    ...     n: int = 1
    >>> check_types(C(n="2"))
    Traceback (most recent call last):
    ...
    scratchgpt.errors.ConfigError: n must be int, got '2'
    """
    check_values(type(config), {f.name: getattr(config, f.name)
                                for f in dataclasses.fields(config)})


def check_values(cls: type, values: dict[str, Any]) -> None:
    """``values`` (field name -> value) have the types the dataclass ``cls`` declares; call it
    before building ``cls`` from untrusted data, so that its own checks compare like with
    like."""
    hints = typing.get_type_hints(cls)
    for name, value in values.items():
        if name not in hints:
            continue
        allowed = _allowed(hints[name])
        bad_bool = isinstance(value, bool) and bool not in allowed
        if bad_bool or not isinstance(value, allowed):
            names = " or ".join(sorted({t.__name__ for t in allowed}))
            raise ConfigError(f"{name} must be {names}, got {value!r}")


SEED_MAX = 2**64 - 1  # the largest seed torch's generators take
# More CPU threads than any machine has cores; far beyond it, OpenMP's thread creation can
# hang or crash the process (99,999 did) rather than fail.
THREADS_MAX = 1024
COUNT_MAX = 2**63 - 1  # the largest count torch takes (an int64)


def offset_seed(seed: int, offset: int) -> int:
    """``seed + offset`` for a second stream of random numbers, wrapped into the seeds torch
    takes (so the largest seed a user may give has its neighbours too).

    >>> offset_seed(1337, 1), offset_seed(SEED_MAX, 1)
    (1338, 0)
    """
    return (seed + offset) % (SEED_MAX + 1)


def check_range(name: str, value: float, low: float = -math.inf, high: float = math.inf,
                low_open: bool = False, high_open: bool = False) -> None:
    """``value`` is finite and within [low, high] (``*_open``: the bound itself excluded).

    >>> check_range("dropout", 1.0, 0, 1, high_open=True)
    Traceback (most recent call last):
    ...
    scratchgpt.errors.ConfigError: dropout must be in [0, 1), got 1.0

    Infinity and NaN are refused as what they are, not as past a bound (``inf`` is no
    learning rate though it is above 0; NaN is neither above nor below any):

    >>> check_range("learning_rate", float("inf"), 0, low_open=True)
    Traceback (most recent call last):
    ...
    scratchgpt.errors.ConfigError: learning_rate must be a finite number, got inf
    """
    if value is None:
        return
    if not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {value!r}")
    ok = (value > low if low_open else value >= low) and \
        (value < high if high_open else value <= high)
    if not ok:
        bounds = _bounds(low, high, low_open, high_open)
        if high >= COUNT_MAX and value > high:  # the one bound the message left out
            bounds = f"at most {COUNT_MAX} (the largest count torch takes)"
        raise ConfigError(f"{name} must be {bounds}, got {value!r}")


def _bounds(low: float, high: float, low_open: bool, high_open: bool) -> str:
    """The range as a reader wants it: an interval, or one side where the other is no real
    bound (infinity, or the int64 limit of a count, whose 19 digits say nothing).

    >>> _bounds(0, 1, False, True), _bounds(1, COUNT_MAX, False, False)
    ('in [0, 1)', '>= 1')
    """
    if high >= COUNT_MAX:
        return f"{'>' if low_open else '>='} {_num(low)}"
    if math.isinf(low):
        return f"{'<' if high_open else '<='} {_num(high)}"
    lo, hi = "(" if low_open else "[", ")" if high_open else "]"
    return f"in {lo}{_num(low)}, {_num(high)}{hi}"


def flag_of(name: str) -> str:
    """The command-line flag of the setting or argparse destination ``name``.

    >>> flag_of("batch_size")
    '--batch-size'
    """
    return "--" + name.replace("_", "-")


# How a refusal names what the user gives: the commands' flags, or the keywords of the Python
# API (``scratchgpt.train(..., resume=True)``), whose users have no flags to pass. A refusal
# that both reach takes one of them as ``options`` and names through :func:`named`; a setting
# not listed here is its flag (:func:`flag_of`) or its keyword (its own name).
FLAGS: Mapping[str, str] = {"resume": "--resume", "overwrite": "--overwrite", "out": "--out"}
KEYWORDS: Mapping[str, str] = {"resume": "resume=True", "overwrite": "overwrite=True",
                               "out": "out directory"}


def named(options: Mapping[str, str], name: str, *value: Any) -> str:
    """``name``, and its ``value`` where one is given, as ``options`` names them.

    >>> named(FLAGS, "max_iters", 4), named(KEYWORDS, "max_iters", 4)
    ('--max-iters 4', 'max_iters=4')
    >>> named(FLAGS, "overwrite"), named(KEYWORDS, "overwrite")
    ('--overwrite', 'overwrite=True')
    """
    python = keywords(options)
    if value and python:
        return f"{name}={value[0]!r}"
    if value:  # (a float as the user types it: 2, not 2.0)
        shown = _num(value[0]) if isinstance(value[0], float) else value[0]
        return f"{named(options, name)} {shown}"
    return options.get(name) or (name if python else flag_of(name))


def keywords(options: Mapping[str, str]) -> bool:
    """Whether ``options`` are the Python API's :data:`KEYWORDS` (a refusal then says what to
    give, where the command line's says which flag to drop)."""
    return options["resume"] == KEYWORDS["resume"]


def give(options: Mapping[str, str]) -> str:
    """The verb of advice to change a setting: the Python caller is told to "give" a keyword,
    the command's user to "pass" a flag."""
    return "give" if keywords(options) else "pass"


def rename_setting(message: str, rename: Callable[[str], str | None]) -> str:
    """``message``, a refusal opening with a setting ("batch_size must ...", "time_budget:
    ...", "n_embd (30) must ...", "unet_skips needs ..."), with that setting and any other it
    names in snake_case ("... by n_head (4)") named as ``rename`` calls them, where it has a
    name for one (not None): the configs name settings by field, and only their caller knows
    whether the user wrote a flag or a key.

    >>> rename_setting("batch_size must be >= 1, got 0", flag_of)
    '--batch-size must be >= 1, got 0'
    >>> rename_setting("n_embd (30) must be divisible by n_head (4)", flag_of)
    '--n-embd (30) must be divisible by --n-head (4)'
    >>> rename_setting("unet_skips needs n_layer >= 2", flag_of)
    '--unet-skips needs --n-layer >= 2'
    """
    found = re.match(r"([a-z][a-z0-9_]*)(?= (?:must|needs) | \([^()]*\) (?:must|needs) |: )",
                     message)
    if found is None:  # not a setting's refusal (e.g. a config file's, naming its keys)
        return message
    name = rename(found.group(1)) or found.group(1)
    # the other settings it names: snake_case words, not inside a path or a file name
    rest = _SNAKE_WORD.sub(lambda m: rename(m.group(0)) or m.group(0), message[found.end():])
    return name + rest


_SNAKE_WORD = re.compile(r"(?<![\w/.-])[a-z][a-z0-9]*(?:_[a-z0-9]+)+(?![\w/-]|\.\w)")


def json_loads(text: str | bytes) -> Any:
    """``json.loads(text)``, where a document nested too deeply for Python's parser (it recurses
    once per level) is a ValueError as any other malformed JSON is, so the reader's one-line
    error covers it too, not a RecursionError traceback.

    >>> json_loads("[" * 100_000)
    Traceback (most recent call last):
    ...
    ValueError: arrays or objects nested too deeply
    """
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("arrays or objects nested too deeply") from None


def file_target_problem(path: Path) -> str | None:
    """Why a file cannot be written at ``path`` (its missing folders made first), or None:
    it is a directory, or one of the folders above it is a file.

    >>> file_target_problem(Path("/"))
    'it is a directory'
    """
    if path.is_dir():
        return "it is a directory"
    folder = file_above(path)
    if folder is not None:
        return f"{folder} is a file, not a directory"
    return None


def file_above(path: Path) -> Path | None:
    """The nearest existing path above ``path`` where it is no folder (a file, a device), so
    that nothing can be made at ``path``; None where the folders above it can hold it. Found
    before any work, not by the ``mkdir`` after it ("Not a directory").

    >>> file_above(Path("/dev/null/run")), file_above(Path("/tmp/run")), file_above(Path("."))
    (PosixPath('/dev/null'), None, None)
    """
    # (the root or "." is there; "." and "/" themselves have nothing above: --out . raised
    # StopIteration)
    above = next((p for p in path.parents if p.exists()), None)
    return None if above is None or above.is_dir() else above


def file_source_problem(path: Path) -> str | None:
    """Why ``path`` cannot be read as an input file, or None: it does not exist, or it is a
    directory, a device or a pipe (each said as such, not "does not exist").

    >>> file_source_problem(Path("/"))
    'is a directory, not a file'
    """
    if path.is_file():
        return None
    if path.is_dir():
        return "is a directory, not a file"
    if path.exists():
        return "is not a regular file (a device, a pipe: give a file's path)"
    return "does not exist"


def _num(x: float) -> str:
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return str(int(x)) if float(x).is_integer() else str(x)


def did_you_mean(word: str, choices: Any) -> str:
    """``"; did you mean 'x'?"`` for the one of ``choices`` that nearly reads as ``word``
    (a typo's likely meaning), else ``""``: the tail of a one-line refusal.

    >>> did_you_mean("shakespere", ["shakespeare", "warandpeace"])
    "; did you mean 'shakespeare'?"
    >>> did_you_mean("zzz", ["train"])
    ''

    A snake_case choice also answers to its initials, the usual abbreviation of a setting:

    >>> did_you_mean("lr", ["learning_rate", "log_interval", "min_lr"])
    "; did you mean 'learning_rate'?"
    """
    choices = list(choices)
    initials = [c for c in choices if isinstance(c, str) and "_" in c
                and "".join(part[:1] for part in c.split("_")) == word]
    close = initials[:1] if len(initials) == 1 else \
        difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def refuse_unknown(given: Iterable[str], known: Collection[str], what: str) -> None:
    """A ConfigError naming the settings in ``given`` that ``what`` (a config, a model) does
    not take, and the one of ``known`` a lone unknown setting nearly reads as.

    >>> refuse_unknown(["n_layers"], ["n_layer", "n_head"], "model 'gpt'")
    Traceback (most recent call last):
    ...
    scratchgpt.errors.ConfigError: model 'gpt' does not take n_layers; did you mean 'n_layer'?
    """
    unknown = [name for name in given if name not in known]
    if unknown:
        tail = did_you_mean(unknown[0], known) if len(unknown) == 1 else ""
        raise ConfigError(f"{what} does not take {', '.join(unknown)}{tail}")


def refuse_unknown_fields(cls: type[T]) -> type[T]:
    """Class decorator for a config dataclass that users build from Python: a keyword it does
    not take is a one-line ConfigError naming it, with the field it nearly reads as, instead
    of the dataclass's ``TypeError: __init__() got an unexpected keyword argument``.
    (Put it above ``@dataclass``: it wraps the ``__init__`` that one writes.)

    >>> @refuse_unknown_fields
    ... @dataclasses.dataclass
    ... class C:
    ...     learning_rate: float = 1e-3
    >>> C(learning_rat=0.1)
    Traceback (most recent call last):
    ...
    scratchgpt.errors.ConfigError: C does not take learning_rat; did you mean 'learning_rate'?
    """
    init = cls.__init__
    names = [f.name for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]

    @functools.wraps(init)
    def checked_init(self: Any, *args: Any, **kwargs: Any) -> None:
        refuse_unknown(kwargs, names, cls.__name__)
        init(self, *args, **kwargs)

    cls.__init__ = checked_init  # type: ignore[method-assign]
    return cls
