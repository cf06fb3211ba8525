"""Text -> tokenizer + memory-mapped token files with a 90/10 train/val split.

A prepared dataset is a directory::

    train.bin   tokens of the first 90% of the text (uint16, or uint32 for vocabularies > 65536);
                with BPE-dropout, several sampled segmentations of it, one after another
    val.bin     tokens of the last 10%
    meta.json   tokenizer kind, vocab size, dtype, token and character counts, sha256 of the
                source text
    tokenizer.json (+ any tokenizer files)

A dataset is written whole or not at all: into a temporary directory beside ``out``
(``.<name>.<pid>.<random>.tmp``), which is renamed into place once every file is on disk (on
Linux, swapped with an old dataset in one step). A full disk or a kill mid-way leaves the
previous dataset (or nothing), never a mix of old and new files; the temporaries of a process
that no longer runs are removed by the next prepare.
An existing dataset is replaced only when asked (``overwrite``).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import random
import shutil
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from scratchgpt.bars import progress_over
from scratchgpt.checkpoints.io import (
    TEMP_SUFFIX,
    dead_temporaries,
    exchange,
    fsync_dir,
    missing_folders,
    remove_folders,
    temporary_name,
)
from scratchgpt.errors import DataError, StorageError
from scratchgpt.tokenizers import Tokenizer, build_tokenizer
from scratchgpt.tokenizers.base import TOKENIZER_FILE
from scratchgpt.tokenizers.bpe_files import MERGES_FILE
from scratchgpt.tokenizers.pretokenize import PIECE_CHARS, piece_bounds
from scratchgpt.validation import FLAGS, KEYWORDS, named
from scratchgpt.wording import first_of, plural

if TYPE_CHECKING:
    from scratchgpt.tokenizers.bpe import BPETokenizer

META_FILE = "meta.json"
META_VERSION = 1
MIN_SPLIT_TOKENS = 2  # the least window: a context of one token, and the token after it


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds every token id."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def encode_corpus(tok: Tokenizer, text: str, unknown: str = "replace") -> list[int]:
    """Encode training text. A literal ``<|endoftext|>`` in a corpus is a document separator
    (as in GPT-2's training data), so byte-level BPE maps it to its special id. Characters a
    char vocabulary lacks follow ``unknown`` (see :meth:`Tokenizer.encode`). A prompt is read
    the same way, so that a model sees it as it saw its training text."""
    from scratchgpt.tokenizers.bpe import BPETokenizer

    if isinstance(tok, BPETokenizer):
        return tok.encode(text, unknown, allowed_special="all")
    return tok.encode(text, unknown=unknown)


def _cuttable(tok: Tokenizer) -> bool:
    """Whether ``tok`` encodes a text to the ids of its pieces (:func:`piece_bounds`) joined:
    character level, or byte-level BPE with GPT-2's pre-tokenizer."""
    from scratchgpt.tokenizers.bpe import BPETokenizer
    from scratchgpt.tokenizers.char import CharTokenizer
    from scratchgpt.tokenizers.pretokenize import GPT2_PATTERN

    return (type(tok) is CharTokenizer
            or isinstance(tok, BPETokenizer) and tok.pattern == GPT2_PATTERN)


def _bounds(tok: Tokenizer, text: str, piece_chars: int | None) -> list[tuple[int, int]]:
    """The pieces ``tok`` may encode ``text`` in: :func:`piece_bounds`, or the whole text."""
    return piece_bounds(text, piece_chars or PIECE_CHARS) if _cuttable(tok) else [(0, len(text))]


def encode_pieces(tok: Tokenizer, text: str, dtype: np.dtype, progress: bool = False,
                  desc: str = "encoding", piece_chars: int | None = None) -> Iterator[np.ndarray]:
    """:func:`encode_corpus` of ``text``, a piece at a time (:func:`piece_bounds`, pieces of
    ``piece_chars``, default :data:`PIECE_CHARS`) where the tokenizer allows it (character
    level, or byte-level BPE with GPT-2's pre-tokenizer), else whole: one array of ``dtype``
    a piece, whose ids joined are the whole text's. Only one piece's ids are Python ints at a
    time. ``progress`` shows a bar over the pieces."""
    bounds = _bounds(tok, text, piece_chars)
    for a, b in progress_over(bounds, progress and len(bounds) > 1, desc, "piece"):
        yield np.asarray(encode_corpus(tok, text[a:b]), dtype=dtype)


def encode_to_array(tok: Tokenizer, text: str, dtype: np.dtype, progress: bool = False,
                    desc: str = "encoding", piece_chars: int | None = None) -> np.ndarray:
    """:func:`encode_corpus` of ``text`` as one array of ``dtype``, encoded a piece at a time
    (:func:`encode_pieces`): memory holds the ids at 2 or 4 bytes each."""
    arrays = list(encode_pieces(tok, text, dtype, progress, desc, piece_chars))
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype=dtype)


def sample_training_copies(tok: Tokenizer, text: str, bpe_dropout: float, copies: int,
                           dtype: np.dtype, seed: int = 0, progress: bool = False,
                           piece_chars: int | None = None) -> Iterator[np.ndarray]:
    """``copies`` segmentations of the training text, each sampled by BPE-dropout
    (:meth:`~scratchgpt.tokenizers.bpe.BPETokenizer.encode_with_dropout`), one after another,
    as arrays of ``dtype`` of a piece each (as :func:`encode_pieces` cuts the text): the ids
    of every copy sampled whole from one ``random.Random(seed)``, without their Python ints
    held beyond one piece, so that a prepare can write each piece as it comes. The trainer
    samples windows anywhere in ``train.bin``, so it sees each word spelt several ways; a
    window that runs from one copy into the next reads the end of the text, then its start. A
    literal ``<|endoftext|>`` stays the special id, as in :func:`encode_corpus`."""
    from scratchgpt.tokenizers.bpe import BPETokenizer

    if not isinstance(tok, BPETokenizer):
        raise DataError(f"BPE-dropout needs a BPE tokenizer, not {tok.kind!r}")
    if not 0.0 < bpe_dropout < 1.0:
        raise DataError(f"BPE-dropout must be in (0, 1), got {bpe_dropout:g}")
    if copies < 1:
        raise DataError(f"the training split needs at least one copy, got {copies}")
    return _sampled(tok, text, bpe_dropout, copies, dtype, random.Random(seed),
                    _bounds(tok, text, piece_chars), progress)


def _sampled(tok: BPETokenizer, text: str, bpe_dropout: float, copies: int, dtype: np.dtype,
             rng: random.Random, bounds: list[tuple[int, int]],
             progress: bool) -> Iterator[np.ndarray]:
    # (a cut is where no chunk of the pre-tokenizer spans, so the pieces draw from rng in the
    # order the whole text does, and sample the same ids)
    for _ in progress_over(range(copies), progress, "BPE-dropout copies", "copy"):
        for a, b in bounds:
            yield np.asarray(tok.encode_with_dropout(text[a:b], bpe_dropout, rng,
                                                     allowed_special="all"), dtype=dtype)


def prepare_text(text: str, out: str | Path, tokenizer: str | Tokenizer = "char",
                 vocab_size: int | None = None, val_fraction: float = 0.1,
                 source: str = "", progress: bool = False,
                 overwrite: bool = False, bpe_dropout: float = 0.0,
                 train_copies: int = 1, options: Mapping[str, str] = KEYWORDS) -> dict[str, Any]:
    """Tokenize ``text`` and write a prepared dataset into ``out`` (see the module docstring);
    an existing dataset there is an error unless ``overwrite``. Returns the meta dict.

    ``bpe_dropout`` > 0 writes ``train_copies`` segmentations of the training split sampled by
    BPE-dropout (:func:`sample_training_copies`); the validation split is always encoded
    exactly, so its loss is comparable with any other run on the same tokenizer. ``progress``
    shows bars on stderr for the slow steps (BPE training, encoding a long text, the sampled
    copies), each once it has run for a second. ``options``: how refusals name ``out`` and
    ``overwrite`` (the Python API's keywords; ``scratchgpt prepare`` passes its flags,
    validation.FLAGS)."""
    if len(text.strip()) < 2:
        raise DataError(f"the data ({source or 'text'}) is empty" if not text.strip() else
                        f"the data ({source or 'text'}) is a single character: too little "
                        "to split into training and validation text")
    digest = _sha256_of_text(text, source)
    if not 0.0 < val_fraction < 1.0:
        raise DataError(f"val_fraction must be in (0, 1), got {val_fraction}")
    check_destination(Path(out), overwrite, options)
    # A symbolic link is followed, as the checks follow it: the dataset it leads to is written
    # (swapping the link itself away would leave it, unremovable, among the temporaries).
    out = Path(os.path.realpath(out))
    split = int(len(text) * (1.0 - val_fraction))
    train_text, val_text = text[:split], text[split:]
    if not train_text or not val_text:
        empty = "training" if not train_text else "validation"
        raise DataError(f"the data ({source or 'text'}) has {len(text)} characters: a "
                        f"validation fraction of {val_fraction:g} leaves the {empty} split "
                        "empty")
    with _staging(out) as tmp:  # fail early (a read-only --out) before tokenizing
        # The tokenizer is learned on the training split only, so validation stays unseen.
        tok = tokenizer if isinstance(tokenizer, Tokenizer) else build_tokenizer(
            tokenizer, train_text, vocab_size=vocab_size, progress=progress)
        dtype = token_dtype(tok.vocab_size)
        sampled = bool(bpe_dropout) or train_copies != 1
        if sampled:
            _check_room(tok, train_text, train_copies, dtype, tmp, options)
        # Each piece of ids is written as it is encoded: memory holds one piece's, not the
        # split's (sixteen BPE-dropout copies of a text as Python ints ran a laptop out of it).
        train_pieces = (sample_training_copies(tok, train_text, bpe_dropout, train_copies,
                                               dtype, progress=progress) if sampled
                        else encode_pieces(tok, train_text, dtype, progress, "training split"))
        counts = {"training": _write_ids(tmp / "train.bin", train_pieces),
                  "validation": _write_ids(tmp / "val.bin", encode_pieces(
                      tok, val_text, dtype, progress, "validation split"))}
        _check_encoded(tok, counts, source)
        meta = {
            "version": META_VERSION,
            "tokenizer": tok.kind,
            "vocab_size": tok.vocab_size,
            "dtype": dtype.name,
            "train_tokens": counts["training"],
            "val_tokens": counts["validation"],
            "chars": len(text),
            "train_chars": len(train_text),
            "val_chars": len(val_text),  # bits per character = nats/token * tokens / chars / ln 2
            "source": source,
            "source_sha256": digest,
            "val_fraction": val_fraction,
        }
        replaced = {f"{name}_unknown_chars": tok.unknown_count(part)
                    for name, part in (("train", train_text), ("val", val_text))}
        meta.update({k: n for k, n in replaced.items() if n})  # substituted as encoded
        if sampled:
            meta |= {"bpe_dropout": bpe_dropout, "train_copies": train_copies}
        tok.save(tmp)
        _write_file(tmp / META_FILE, json.dumps(meta, indent=1).encode())
        _move_into_place(tmp, out, overwrite)
    return meta


def _check_room(tok: Tokenizer, text: str, copies: int, dtype: np.dtype, where: Path,
                options: Mapping[str, str]) -> None:
    """``copies`` sampled segmentations of ``text`` fit in the space free at ``where``: each
    holds at least the tokens of the exact encoding (a skipped merge only adds tokens), so a
    ``train.bin`` that needs more than is free is refused before its first copy is sampled
    (``--train-copies 100000000`` of a small text began writing some 90 GB). ``options`` name
    the copies in the refusal."""
    tokens = sum(ids.size for ids in encode_pieces(tok, text, dtype))
    need, free = copies * tokens * dtype.itemsize, shutil.disk_usage(where).free
    if need > free:
        from scratchgpt.memory import _size

        raise StorageError(f"{named(options, 'train_copies', copies)}: the BPE-dropout copies "
                           f"of the training split ({tokens:,} tokens or more each) need at "
                           f"least {_size(need)} for train.bin, more than the {_size(free)} "
                           "free there; ask for fewer (nothing was written)")


def _sha256_of_text(text: str, source: str) -> str:
    """The sha256 of ``text`` as UTF-8. A lone surrogate (a ``str`` decoded with
    ``errors="surrogateescape"``, or ``os.fsdecode`` of a name that is not UTF-8) has no UTF-8
    spelling, so neither a dataset's record of its text nor a character vocabulary could be
    written: it is refused, where it is, before anything is written.

    >>> _sha256_of_text("ab\\udce9c", "notes.txt")
    Traceback (most recent call last):
    ...
    scratchgpt.errors.DataError: the data (notes.txt) holds a lone surrogate, U+DCE9, at \
character 2: not text that UTF-8 can store (bytes decoded with errors='surrogateescape'?); \
decode the bytes with errors='replace' (nothing was written)
    """
    try:
        return hashlib.sha256(text.encode("utf-8")).hexdigest()
    except UnicodeEncodeError as e:
        raise DataError(f"the data ({source or 'text'}) holds a lone surrogate, "
                        f"U+{ord(text[e.start]):04X}, at character {e.start}: not text "
                        "that UTF-8 can store (bytes decoded with errors='surrogateescape'?); "
                        "decode the bytes with errors='replace' (nothing was written)") from None


def _check_encoded(tok: Tokenizer, counts: dict[str, int], source: str) -> None:
    """Each split holds one context window of the least size, a token and the next one to
    predict (``counts``: tokens a split). A tokenizer that folds text away (``char-prose``
    drops newlines and symbols) can leave a split with characters but no token; a text of two
    characters left one in each split, prepared without a word though no run could train or
    evaluate on it."""
    for name, count in counts.items():
        if not count:
            raise DataError(f"the {name} split of the data ({source or 'text'}) encodes to no "
                            f"tokens: the {tok.kind} tokenizer folds all of it away; use more "
                            "data or another validation fraction (nothing was written)")
        if count < MIN_SPLIT_TOKENS:
            raise DataError(f"the {name} split of the data ({source or 'text'}) is "
                            f"{plural(count, 'token')}, too few for a context window of any "
                            f"size (one token and the next to predict need "
                            f"{MIN_SPLIT_TOKENS}); use more data or another validation "
                            "fraction (nothing was written)")


def repeated_token(directory: str | Path, meta: Mapping[str, Any]) -> int | None:
    """The token id that the training split of the dataset in ``directory`` (``meta``: its
    ``meta.json``) holds alone, repeated, or None where it holds more than one. A model trained
    on one token repeated has nothing to learn: its loss falls to 0 at once. A character text
    of one character does so, and a BPE's of a run of one (GPT-2 writes "aaaa...", and
    "abab...", as one token). Read a piece at a time, the first piece of another token ends
    it."""
    from scratchgpt.data.dataset import CHUNK

    ids = np.memmap(Path(directory) / "train.bin", dtype=np.dtype(meta["dtype"]), mode="r")
    first = int(ids[0])
    if any((ids[i:i + CHUNK] != first).any() for i in range(0, len(ids), CHUNK)):
        return None
    return first


DATASET_FILES = ("train.bin", "val.bin", META_FILE)
OWN_FILES = (*DATASET_FILES, TOKENIZER_FILE, MERGES_FILE)  # all that prepare writes


def is_dataset(path: Path) -> bool:
    """True if ``path`` holds (part of) a prepared dataset."""
    return path.is_dir() and any((path / f).exists() for f in DATASET_FILES)


def check_destination(out: Path, overwrite: bool, options: Mapping[str, str] = FLAGS) -> None:
    """``out`` may receive a dataset: it does not exist, is an empty directory, or holds a
    dataset that ``overwrite`` replaces, and this user may write it. Anything else is left
    alone. ``options`` name the arguments in a refusal (validation.FLAGS, or KEYWORDS from
    Python)."""
    if not out.exists():
        return
    if not out.is_dir():
        raise DataError(f"{named(options, 'out', str(out))} is a file, not a directory")
    if out.resolve() == Path.cwd().resolve():
        raise DataError(f"{named(options, 'out', str(out))} is the current directory, which "
                        "prepare would replace whole and leave you in a deleted directory; run "
                        "it from the parent directory with "
                        f"{named(options, 'out', out.resolve().name)} (nothing was written)")
    _check_replaceable(out, overwrite, options)
    if not os.access(out, os.W_OK):  # renamed over, it would be a new, writable directory
        raise StorageError(f"cannot write the dataset {out}: "
                           f"{os.strerror(errno.EACCES)} (nothing was changed)")


def _check_replaceable(out: Path, overwrite: bool, options: Mapping[str, str]) -> None:
    """The directory ``out`` holds a dataset that ``overwrite`` replaces whole, or nothing."""
    if is_dataset(out):
        if not overwrite:
            raise DataError(f"{out} already holds a prepared dataset; pass "
                            f"{named(options, 'overwrite')} to replace it")
        others = sorted(p.name for p in out.iterdir() if p.name not in OWN_FILES)
        if others:  # the whole directory is replaced: they would go with the old dataset
            shown = first_of(others, 5)
            raise DataError(f"{out} also holds files prepare did not write ({shown}); "
                            f"{named(options, 'overwrite')} replaces the whole directory, so "
                            "move them out first (nothing was written)")
        return
    if any(out.iterdir()):
        raise DataError(f"{out} is not empty and holds no prepared dataset; choose another "
                        f"{named(options, 'out')} (nothing was written)")


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _write_ids(path: Path, pieces: Iterable[np.ndarray]) -> int:
    """Write the arrays ``pieces`` to ``path`` one after another, as they come, and sync it;
    returns how many ids were written."""
    count = 0
    with open(path, "wb") as f:
        for ids in pieces:
            f.write(ids.tobytes())
            count += ids.size
        f.flush()
        os.fsync(f.fileno())
    return count


@contextlib.contextmanager
def _staging(out: Path) -> Iterator[Path]:
    """A temporary directory beside ``out`` to write the dataset into; removed afterwards
    (it is empty then, unless the dataset failed), and so are the folders above ``out`` made
    for it when the dataset failed (a refusal, Ctrl-C), each while empty. An OSError (a full
    disk, a read-only directory) becomes a one-line StorageError."""
    tmp, made = None, missing_folders(out.parent)
    done = False
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_staging(out)
        staged = out.parent / temporary_name(out.name)  # (the name the cleaner above reads)
        staged.mkdir()  # (tmp only once made: one already there is another prepare's)
        tmp = staged
        yield tmp
        done = True
    except OSError as e:
        raise StorageError(f"cannot write the dataset {out}: {e.strerror or e} (nothing was "
                           "changed)") from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if not done:
            remove_folders(made)


def _move_into_place(tmp: Path, out: Path, overwrite: bool) -> None:
    """Rename the finished dataset ``tmp`` to ``out``. An old dataset there is swapped with the
    new one in one atomic step where the system can (``tmp`` then holds the old one, which the
    staging removes), so a reader never finds ``out`` missing; elsewhere it is moved aside
    first and deleted once the new one is in place (put back if the rename fails)."""
    fsync_dir(tmp)
    replacing = overwrite and is_dataset(out)
    if replacing and exchange(tmp, out):
        fsync_dir(out.parent)
        return
    old = None
    if replacing:
        old = out.parent / f".{out.name}.{os.getpid()}.old{TEMP_SUFFIX}"
        os.replace(out, old)
    try:
        os.replace(tmp, out)  # (over an empty directory too)
    except OSError:
        if old is not None:
            os.replace(old, out)
        raise
    fsync_dir(out.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _remove_stale_staging(out: Path) -> None:
    """Temporaries of earlier prepares of ``out`` whose process no longer runs: a dataset
    moved aside by a process killed before it renamed the new one in comes back; the rest
    goes."""
    # ".NAME.PID.RANDOM.tmp" or ".NAME.PID.old.tmp"
    for tmp in dead_temporaries(out.parent, out.name):
        if tmp.name.endswith(f".old{TEMP_SUFFIX}") and not out.exists():
            os.replace(tmp, out)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
