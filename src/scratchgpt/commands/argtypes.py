"""argparse helpers shared by several commands: ``type=`` functions, and the flags that mean
the same in every command."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from scratchgpt.errors import ConfigError, TokenizerError
from scratchgpt.validation import SEED_MAX, THREADS_MAX, file_above, file_target_problem


def _int_within(text: str, low: int, high: int | None, expected: str) -> int:
    """``text`` as an integer in [low, high] (no upper bound when ``high`` is None), else
    argparse's one-line refusal: "expected ``expected``, got ..."."""
    try:
        n = int(text)
    except ValueError:
        n = None
    if n is None or n < low or (high is not None and n > high):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return n


def positive_int(text: str) -> int:
    return _int_within(text, 1, None, "a positive integer")


def non_negative_int(text: str) -> int:
    return _int_within(text, 0, None, "0 or a positive integer")


def bpe_vocab_size(text: str) -> int:
    """``--vocab-size`` of a byte-level BPE: more than its 256 byte tokens, checked before any
    text is read or encoded.

    >>> bpe_vocab_size("257")
    257
    """
    return _int_within(text, 257, None, "a whole number above 256 (the byte tokens)")


def thread_count(text: str) -> int:
    """``--threads``: 0 (torch's default, one per core) up to :data:`THREADS_MAX`.

    >>> thread_count("0"), thread_count("3")
    (0, 3)
    """
    return _int_within(text, 0, THREADS_MAX, f"0 (one per core) to {THREADS_MAX} threads")


def finite_float(text: str) -> float:
    """A float that is neither infinite nor NaN (argparse's ``float`` takes both).

    >>> finite_float("-0.5")
    -0.5
    """
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if not math.isfinite(x):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return x


def new_tokens(text: str) -> int:
    """A number of tokens to generate: 1 to
    :data:`~scratchgpt.generation.stopping.MAX_NEW_TOKENS`.

    >>> new_tokens("500")
    500
    """
    from scratchgpt.generation.stopping import MAX_NEW_TOKENS

    return _int_within(text, 1, MAX_NEW_TOKENS, f"1 to {MAX_NEW_TOKENS} new tokens")


def duration(text: str) -> str:
    """A wall-clock time such as ``90s``, ``10m`` or ``1.5h``, checked and kept as typed (as a
    config's ``time_budget`` is); unlike one, never empty, which would mean no limit at all.

    >>> duration("1.5m")
    '1.5m'
    """
    from scratchgpt.training.config import parse_duration

    try:
        seconds = parse_duration(text)
    except ConfigError:
        seconds = None
    if seconds is None:
        raise argparse.ArgumentTypeError(f"expected a positive duration such as 90s, 10m or "
                                         f"1.5h, got {text!r}")
    return text


def seed_int(text: str) -> int:
    """``--seed``: an integer torch's generators take, 0 to 2^64 - 1."""
    return _int_within(text, 0, SEED_MAX, "a seed from 0 to 2^64 - 1")


def add_unknown_flag(p: argparse.ArgumentParser, what: str) -> None:
    """``--unknown error|replace``: what to do with characters of ``what`` (the prompt, the
    text) that a character vocabulary lacks; :func:`encode` applies it."""
    p.add_argument("--unknown", choices=("error", "replace"), default="error",
                   help=f"{what} characters missing from the vocabulary: error (default) or "
                        "replace them with a stand-in token")


def encode(tok: Any, text: str, unknown: str) -> list[int]:
    """``tok.encode(text)`` as ``--unknown`` says, reading special-token text such as
    ``<|endoftext|>`` as prepare read it in the training text (its special id); a refusal
    names the flag that would have let it through."""
    from scratchgpt.data.prepare import encode_corpus

    try:
        return encode_corpus(tok, text, unknown)
    except TokenizerError as e:
        raise TokenizerError(f"{e} (use --unknown replace to substitute them)") from None


def add_which_flag(p: argparse.ArgumentParser) -> None:
    """``--which best|last``: which checkpoint of a run directory a command reads; not given
    (None), the loaders take best.pt, or last.pt for a run that has not evaluated yet."""
    p.add_argument("--which", choices=("best", "last"), default=None,
                   help="checkpoint of a run directory to use: best.pt or last.pt, nothing "
                        "else in its place (default: best.pt, or last.pt for a run that has "
                        "not evaluated yet)")


def results_dir(out: str | Path, files: Iterable[str], overwrite: bool) -> Path:
    """``--out`` for a command's result files, checked before anything runs: not a file nor
    below one, a folder where a file can be made (or the nearest folder above it that
    exists), and not holding any of ``files`` already unless ``overwrite``."""
    out_dir = Path(out)
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out {out} is a file; give a directory for the results")
    above = file_above(out_dir)
    if above is not None:  # found only by the mkdir after the work
        raise ConfigError(f"--out {out} is below {above}, a file, not a folder; give a "
                          "directory for the results")
    problem = _unwritable(out_dir / "results")  # also found only by the writes after the work
    if problem is not None:
        raise ConfigError(f"--out {out}: {problem}; give a directory where you can write")
    there = [name for name in files if (out_dir / name).exists()]
    if there and not overwrite:
        raise ConfigError(f"{out_dir} already holds {' and '.join(there)}; pass --overwrite to "
                          f"replace {'it' if len(there) == 1 else 'them'}")
    return out_dir


def results_file(path: str | Path | None, overwrite: bool, flag: str = "--json") -> Path | None:
    """``flag FILE`` (None when not given), checked before anything runs, so that a long
    benchmark does not end unable to write its figures: FILE is not a directory, nor inside a
    file (its folders may be missing: the writer makes them), a file can be made in the
    nearest of its folders that exists, and it holds no earlier results unless
    ``overwrite``."""
    if path is None:
        return None
    file = Path(path)
    problem = file_target_problem(file)
    if problem is not None:
        raise ConfigError(f"{flag} {file}: {problem}; give a file name")
    problem = _unwritable(file)
    if problem is not None:
        raise ConfigError(f"{flag} {file}: {problem}; give a file where you can write")
    if file.exists() and not overwrite:
        raise ConfigError(f"{file} already holds results; pass --overwrite to replace it")
    return file


def _unwritable(file: Path) -> str | None:
    """Why no file can be made beside ``file`` (in the nearest of its folders that exists),
    found by making one and removing it; None where one can. (A read-only folder was found
    by the write after the benchmark, its figures lost: 'Permission denied'.)"""
    import tempfile

    folder = next(p for p in (file.parent, *file.parent.parents) if p.exists())
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        return f"no file can be written in {folder} ({e.strerror})"
    return None


def figure_file(path: str | None, overwrite: bool, flag: str) -> Path | None:
    """An optional figure flag's file (``flag FILE``; None when not given), checked before any
    work (:func:`scratchgpt.viz.check_figure_path`); ``--overwrite`` replaces that file, so
    without ``flag`` it is refused rather than ignored."""
    if path is None:
        if overwrite:
            raise ConfigError(f"--overwrite replaces the {flag} file; it goes with {flag}")
        return None
    from scratchgpt.viz import check_figure_path

    return check_figure_path(path, overwrite)


def write_results(file: Path | None, figures: dict[str, Any]) -> None:
    """``figures`` as JSON into ``file``, the ``--json FILE`` :func:`results_file` checked
    (nothing when None), its missing folders made."""
    if file is None:
        return
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(figures, indent=1) + "\n")


def pick_index(index: int | None, count: int, flag: str) -> list[int]:
    """All of ``range(count)``, or the one ``index`` (negative from the end), checked."""
    if index is None:
        return list(range(count))
    if not -count <= index < count:
        raise ConfigError(f"{flag} must be in [0, {count - 1}] (or negative from the end), "
                          f"got {index}")
    return [index % count]


def help_text(doc: str) -> str:
    """A module's docstring as ``--help`` shows it: without its doctest paragraphs, and
    without the double backquotes that mark code in a docstring (--help prints them as typed).

    >>> help_text("``scratchgpt serve``: a server.\\n\\n>>> 1 + 1\\n2\\n")
    'scratchgpt serve: a server.'
    """
    return "\n\n".join(p for p in doc.strip().split("\n\n")
                       if ">>>" not in p).replace("``", "")
