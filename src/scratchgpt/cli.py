"""The ``scratchgpt`` command line: one subcommand per step of the path from text to model.

Each subcommand lives in ``scratchgpt/commands/<name>.py`` with ``add_parser(subparsers)`` (which
sets ``func``) and keeps heavy imports (torch) inside the function that runs, so ``--help`` is
instant. Bad input raises a :class:`~scratchgpt.errors.ScratchGPTError`, which ends as one
line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import gc
import importlib
import os
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from scratchgpt import __version__, figure_helper
from scratchgpt.errors import ConfigError, ScratchGPTError, Terminated
from scratchgpt.signals import forget_interrupts_caught_in_exec, signals_held, sigterm_stops
from scratchgpt.validation import did_you_mean, file_above, flag_of, rename_setting

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
# Commands that end by drawing a figure (a run's loss curve): for them a helper process imports
# matplotlib on an idle core while this one imports torch (scratchgpt/figure_helper.py).
FIGURE_COMMANDS = ("train", "finetune")


class Parser(argparse.ArgumentParser):
    """argparse as the command line wants it (every subcommand's parser is one: argparse
    builds subparsers of the parent's class):

    - no abbreviated flags: ``--lr 1`` must not quietly mean ``--lr-decay-iters 1`` because no
      other flag happens to start with ``--lr``; an unknown flag is named with the flags it
      may have meant instead;
    - an error is one line, naming the subcommand, not the whole usage before it;
    - a value that starts with a minus and a digit (``--time-budget -5s``, ``--lr -1e-3``) is a
      value, which then meets its flag's own check: argparse takes only plain negative numbers
      (``-5``, ``-0.5``) for values and answered the rest with "expected one argument".
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        # argparse's private pattern for "a negative number, not a flag" (no flag of ours
        # starts with a minus and a digit, so widening it takes no flag away).
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> Any:
        # (what this parser was given, for error's guess at a bare path a flag was meant for)
        self._given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        hint = _closest_choice(message)
        if not hint and message.startswith("the following arguments are required"):
            hint = _did_you_mean(self, _bare_words(getattr(self, "_given", [])))
        self.exit(2, f"{self.prog}: error: {message}{hint} (see '{self.prog} --help')\n")

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            chosen = _chosen_parser(self, parsed)
            chosen.error(f"unrecognized arguments: {' '.join(unknown)}"
                         + _did_you_mean(chosen, unknown))
        return parsed


def _chosen_parser(parser: argparse.ArgumentParser,
                   parsed: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost subcommand's parser the arguments chose (``scratchgpt bench train``'s)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            name = getattr(parsed, action.dest, None)
            if name in action.choices:
                return _chosen_parser(action.choices[name], parsed)
    return parser


def _closest_choice(message: str) -> str:
    """'; did you mean 'train'?' for argparse's "invalid choice: 'trian' (choose from ...)"
    where one of the choices nearly reads as the word given ('' otherwise).

    >>> _closest_choice("argument COMMAND: invalid choice: 'trian' (choose from 'prepare', "
    ...                 "'train')")
    "; did you mean 'train'?"
    """
    found = re.search(r"invalid choice: '?([^']*?)'? \(choose from (.*)\)$", message)
    if not found:
        return ""
    # (Python 3.11 quotes the choices; later versions list them bare)
    choices = [c.strip().strip("'") for c in found.group(2).split(",")]
    return did_you_mean(found.group(1), choices)


# The flags that name a file or folder to read, by what a bare path on the command line most
# likely meant: a folder a run directory (or prepare's folder of .txt files), a file a text.
PATH_FLAGS = {True: ("--checkpoint", "--data"), False: ("--data", "--file", "--checkpoint")}


def _did_you_mean(parser: argparse.ArgumentParser, unknown: list[str]) -> str:
    """'; did you mean --x?' for the first unknown flag that starts, or nearly reads, as
    some of the parser's flags, or '; did you mean --data PATH?' for a bare PATH that exists
    and one of the parser's flags reads ('' when none does)."""
    flags = [f for a in parser._actions for f in a.option_strings if f.startswith("--")]
    for arg in unknown:
        name = arg.split("=", 1)[0]
        if not name.startswith("--"):
            path_flag = _path_flag(flags, arg)
            if path_flag:
                return f"; did you mean {path_flag} {arg}?"
            continue
        close = ([f for f in flags if f.startswith(name)]
                 or difflib.get_close_matches(name, flags, n=3, cutoff=0.75))
        if close:
            return f"; did you mean {' or '.join(close[:3])}?"
    return ""


def _bare_words(given: list[str]) -> list[str]:
    """The words of ``given`` that are no flag nor, by their place, a flag's value."""
    return [w for i, w in enumerate(given)
            if not w.startswith("-") and (i == 0 or not given[i - 1].startswith("-"))]


def _path_flag(flags: list[str], arg: str) -> str | None:
    """The flag of ``flags`` that a bare ``arg`` naming an existing file or folder most likely
    belongs to (``scratchgpt prepare story.txt``: ``--data``), or None.

    >>> _path_flag(["--data", "--out"], ".")
    '--data'
    >>> _path_flag(["--data"], "no/such/file") is None
    True
    """
    if not os.path.exists(arg):
        return None
    return next((f for f in PATH_FLAGS[os.path.isdir(arg)] if f in flags), None)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
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
    """Entry point. Returns the process exit code (0 ok, 2 bad input or a file that cannot be
    written, 130 interrupted, 143 terminated)."""
    return _guarded(argv, entry=False)


def run() -> int:
    """The process's entry (the ``scratchgpt`` script, ``python -m scratchgpt``): :func:`main`,
    with the garbage collector told that what start-up made stays.

    Python's collector looks for reference cycles by walking the objects it tracks. With torch
    loaded, that is hundreds of thousands of them: ~0.28 s of collections in a 600-step train
    run at nanoGPT's recipe shape, and a last walk at shutdown (~0.4 s) to free memory the
    operating system takes back anyway. Objects frozen by :func:`gc.freeze` are left out of those
    walks: the modules once imported, and everything once the command is done. Everything else
    about the shutdown (``atexit`` functions, flushed streams) stays as it was. Only here, not in
    :func:`main`, which tests and programs call in a process that goes on."""
    try:
        return _guarded(None, entry=True)
    finally:  # argparse's --help and errors end in SystemExit
        gc.freeze()


def _guarded(argv: Sequence[str] | None, entry: bool) -> int:
    try:
        return _main(argv, entry)
    finally:
        forget_interrupts_caught_in_exec()


def _main(argv: Sequence[str] | None, entry: bool) -> int:
    command, chosen = "scratchgpt", None
    argv = sys.argv[1:] if argv is None else list(argv)
    if entry:
        _start_figure_helper(argv)
    try:
        with sigterm_stops():
            with signals_held(), _collector_paused(freeze_after=entry):
                parser = build_parser()
            if not argv:  # a bare `scratchgpt`: the map
                parser.print_help(sys.stderr)
                return 2
            args = parser.parse_args(argv)
            chosen = _chosen_parser(parser, args)
            command = chosen.prog  # "scratchgpt seq2seq train", not "scratchgpt seq2seq"
            refuse_empty_paths(args)
            if entry:  # the flags are good: the command will run, and import torch
                with signals_held(), _collector_paused(freeze_after=True):
                    import torch  # noqa: F401
            return int(args.func(args) or 0)
    except ScratchGPTError as e:
        return _fail(command, str(e) if chosen is None else as_typed(str(e), chosen, argv))
    except KeyboardInterrupt as e:
        stopped = "terminated" if isinstance(e, Terminated) else "interrupted"
        if not another_rank():  # (torchrun's Ctrl-C reaches every process: rank 0 says it)
            print(f"{command}: {stopped}", file=sys.stderr)
        return 143 if isinstance(e, Terminated) else 130
    except BrokenPipeError:
        return 0
    except OSError as e:  # the machine, not scratchgpt: a full disk, a read-only directory
        return _fail(command, _os_error_message(e))


def another_rank() -> bool:
    """Whether this process is one of torchrun's other than rank 0 (``RANK`` and
    ``WORLD_SIZE`` set, as torchrun sets them): read from the environment, since a Ctrl-C
    while the processes still import torch comes before any process group."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1 and int(os.environ["RANK"]) != 0
    except (KeyError, ValueError):
        return False


def as_typed(message: str, parser: argparse.ArgumentParser, argv: Sequence[str]) -> str:
    """``message`` with the setting it opens with named as the flag the user typed for it.
    The library names settings as its configs do ("batch_size must be >= 1"), and cannot know
    they came from ``--batch-size`` (one from a config file is named so where the settings
    are layered: :meth:`~scratchgpt.training.settings.Settings.naming_errors`).

    >>> p = argparse.ArgumentParser()
    >>> _ = p.add_argument("--batch-size", "--bs", type=int)
    >>> as_typed("batch_size must be >= 1, got 0", p, ["--bs=0"])
    '--bs must be >= 1, got 0'
    >>> as_typed("batch_size must be >= 1, got 0", p, [])
    'batch_size must be >= 1, got 0'
    """
    typed = {a.split("=", 1)[0] for a in argv if a.startswith("-")}

    def flag(setting: str) -> str | None:
        return next((f for a in parser._actions if a.dest == setting
                     for f in a.option_strings if f in typed), None)

    return rename_setting(message, flag)


# The flags (by their setting's name) that name a file or folder, in every command: an empty
# value there is a mistake (an unset shell variable), never a path. Path("") is ".", so it
# used to read or write the current directory, or fall back to a default.
PATH_SETTINGS = ("out", "checkpoint", "dataset", "data", "draft", "json", "config",
                 "tokenizer_from", "base", "init_from", "merge", "file", "eval", "confusion",
                 "prompt_file", "plot", "nanogpt")


def refuse_empty_paths(args: argparse.Namespace) -> None:
    """A path flag given as "" (or blanks) is refused, naming the flag."""
    for name in PATH_SETTINGS:
        value = getattr(args, name, None)
        if isinstance(value, str) and not value.strip():
            raise ConfigError(f"{flag_of(name)} is empty (an unset shell "
                              "variable?); give a value")
    source = getattr(args, "source", None)  # convert --from FORMAT PATH
    if args.command == "convert" and source and not source[1].strip():
        raise ConfigError("--from's PATH is empty (an unset shell variable?); give a value")


def _start_figure_helper(args: Sequence[str]) -> None:
    """The figure helper, for a command that will draw one (not for its ``--help``)."""
    if args and args[0] in FIGURE_COMMANDS and not {"-h", "--help"} & set(args):
        figure_helper.start()


@contextlib.contextmanager
def _collector_paused(freeze_after: bool = False) -> Iterator[None]:
    """The garbage collector off for the block: importing torch makes hundreds of thousands of
    objects and almost no garbage, and the collections it would trigger on the way take ~0.08 s.
    ``freeze_after``: then leave what the block made out of every later collection (only where
    the process ends with the command: anything of a caller's frozen too would never be freed).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        if freeze_after:
            gc.freeze()
    finally:
        if was_enabled:
            gc.enable()


def _os_error_message(e: OSError) -> str:
    """The system's words and the path; where a folder on the way to it is a file (``mkdir``
    then says "File exists" or "Not a directory"), which one."""
    if not e.filename:
        return str(e.strerror or e)
    path = Path(e.filename)
    if isinstance(e, (FileExistsError, NotADirectoryError)) and e.filename2 is None:
        blocking = path if path.exists() and not path.is_dir() else file_above(path)
        if blocking is not None:
            return f"cannot write under {blocking}: it is a file, not a folder"
    return f"{e.strerror or e}: {e.filename}"


def _fail(command: str, message: str) -> int:
    """One line on stderr, exit code 2."""
    print(f"{command}: error: {' '.join(message.split())}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(run())
