"""Where training text comes from: user files, named datasets, and the offline default corpus.

Named datasets carry a canonical URL and, once pinned, a sha256. They are looked up, in order,
in ``$SCRATCHGPT_DATA_DIR``, then in the cache directory (:func:`scratchgpt.paths.cache_dir`:
``$SCRATCHGPT_CACHE_DIR``, else ``$XDG_CACHE_HOME/scratchgpt``, else ``~/.cache/scratchgpt``),
and only then downloaded into the cache. A checksum mismatch is always
an error: a corrupt or different file is never used silently. A download that fails (an error
status, no network, a transfer cut short) is a one-line error and leaves nothing in the cache.
A dataset whose ``sha256`` is None is *not pinned* (nobody here could download it to measure
it): its file is used, its checksum is printed, and the user is told to pin it.

Some downloads are zip archives holding the file (``archive_member``): the member is extracted
into the cache and its own sha256 is the one checked. A dataset may also be found in
``$SCRATCHGPT_DATA_DIR`` under another name (``local_names``, e.g. ``sms-spam.tsv`` for the
``SMSSpamCollection`` file), with the same bytes and checksum.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import sys
import sysconfig
import tempfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from scratchgpt.errors import DataError
from scratchgpt.paths import cache_dir


@dataclass(frozen=True)
class NamedDataset:
    """A downloadable text. ``sha256=None`` means not pinned yet (see the module docstring)."""

    name: str
    filename: str
    url: str
    sha256: str | None
    description: str
    tokenizer: str = "char"  # tokenizer used when the dataset is prepared implicitly
    gutenberg: bool = False  # strip the Project Gutenberg header and licence footer
    archive_member: str | None = None  # the URL is a zip archive holding this file
    local_names: tuple[str, ...] = ()  # other names it may have in $SCRATCHGPT_DATA_DIR


DATASETS: dict[str, NamedDataset] = {
    "shakespeare": NamedDataset(
        name="shakespeare",
        filename="tinyshakespeare.txt",
        url="https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
        sha256="86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
        description="Tiny Shakespeare (Karpathy's char-rnn), 1,115,394 characters",
    ),
    "warandpeace": NamedDataset(
        name="warandpeace",
        filename="pg2600.txt",
        url="https://www.gutenberg.org/cache/epub/2600/pg2600.txt",
        sha256=None,  # not pinned: never downloaded where this entry was written
        description="Tolstoy, War and Peace (Maude translation), Project Gutenberg eBook #2600",
        tokenizer="char-prose",
        gutenberg=True,
    ),
    # Fine-tuning data (scratchgpt finetune): not text corpora to pretrain on.
    "sms-spam": NamedDataset(
        name="sms-spam",
        filename="SMSSpamCollection",
        url="https://archive.ics.uci.edu/static/public/228/sms+spam+collection.zip",
        sha256="7d039a24a6083ed9ef0f806ebad56bbb976e3aeb8de05669173bfdc4996c239d",
        description="UCI SMS Spam Collection: 5,574 SMS messages labelled ham or spam "
                    "(747 spam), one 'label<TAB>text' line each",
        archive_member="SMSSpamCollection",
        local_names=("sms-spam.tsv",),
    ),
    "instruction-data": NamedDataset(
        name="instruction-data",
        filename="instruction-data.json",
        url="https://raw.githubusercontent.com/rasbt/LLMs-from-scratch/main/ch07/"
            "01_main-chapter-code/instruction-data.json",
        sha256="7e09a9af353722ca15c18bc580f093f9c39d3178335a75177319cb1e1d163944",
        description="1,100 Alpaca-style instruction/input/output records (Raschka, Build a "
                    "Large Language Model From Scratch, chapter 7; Apache-2.0)",
    ),
}

DEFAULT_CORPUS = "python-stdlib"
# every name --dataset takes: the downloadable ones, and the offline default
DATASET_NAMES = (*DATASETS, DEFAULT_CORPUS)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _verified(path: Path, ds: NamedDataset, remedy: str = "delete it to download again"
              ) -> Path:
    """``path`` if its sha256 is the dataset's pinned one; otherwise a DataError ending with
    ``remedy``, what the user can do about it."""
    digest = sha256_file(path)
    if ds.sha256 is None:
        print(f"note: dataset {ds.name!r} is not pinned; {path} has sha256 {digest} "
              f"({path.stat().st_size:,} bytes). Check it is the file from {ds.url} and pin "
              f"it as sha256 in scratchgpt/data/sources.py", file=sys.stderr)
        return path
    if digest != ds.sha256:
        raise DataError(
            f"{path} has sha256 {digest[:12]}…, expected {ds.sha256[:12]}… for dataset "
            f"{ds.name!r}; refusing to use it ({remedy})"
        )
    return path


def _copy_response(url: str, out: BinaryIO, timeout: float) -> None:
    """Write the body at ``url`` to ``out``; a body shorter than its Content-Length is an error
    (urllib returns a cut-off body without complaint)."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        announced = resp.headers.get("Content-Length", "")
        received = 0
        for chunk in iter(lambda: resp.read(1 << 20), b""):
            out.write(chunk)
            received += len(chunk)
    if announced.isdigit() and received != int(announced):
        raise DataError(f"transfer interrupted: received {received:,} of {int(announced):,} bytes")


def _reason(e: Exception) -> str:
    """One line saying why a download failed."""
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code} {e.reason}"
    if isinstance(e, urllib.error.URLError):  # wraps the socket's error, or says why itself
        if not isinstance(e.reason, Exception):
            return " ".join(str(e.reason).split())
        e = e.reason
    if isinstance(e, http.client.IncompleteRead):
        return "transfer interrupted: the connection closed before the end of the body"
    return " ".join(str(e).split()) or type(e).__name__


def download(url: str, dest: Path, timeout: float = 30.0) -> None:
    """Download ``url`` to ``dest`` atomically: into a temporary file beside it, renamed only
    once the whole body has arrived. Any failure (an HTTP error status, an unreachable host, a
    timeout, a transfer cut short) raises a one-line DataError and leaves nothing behind."""
    tmp = None
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".", suffix=".part")
        with os.fdopen(fd, "wb") as out:
            _copy_response(url, out, timeout)
        os.replace(tmp, dest)
    except (OSError, ValueError, http.client.HTTPException, DataError) as e:
        raise DataError(f"download of {url} failed: {_reason(e)}") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def download_member(url: str, member: str, dest: Path, timeout: float = 30.0) -> None:
    """Download the zip archive at ``url`` and write its file ``member`` to ``dest`` (the
    archive itself is not kept). Atomic, with one-line errors, like :func:`download`."""
    archive = dest.with_name(dest.name + ".zip")
    download(url, archive, timeout)
    tmp = None
    try:
        with zipfile.ZipFile(archive) as z:
            data = z.read(member)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".", suffix=".part")
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, dest)
    except KeyError:
        raise DataError(f"{url}: the archive holds no {member!r}") from None
    except (OSError, zipfile.BadZipFile) as e:
        raise DataError(f"{url}: not a readable zip archive ({_reason(e)})") from None
    finally:
        archive.unlink(missing_ok=True)
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def fetch_named(name: str) -> Path:
    """Path of the verified raw file of named dataset ``name`` (downloading it if needed)."""
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; known: {', '.join(DATASET_NAMES)}"
                        + _unknown_hint(name))
    ds = DATASETS[name]
    data_dir = os.environ.get("SCRATCHGPT_DATA_DIR")
    for local in (ds.filename, *ds.local_names):
        if data_dir and (Path(data_dir) / local).is_file():
            return _verified(Path(data_dir) / local, ds,
                             f"SCRATCHGPT_DATA_DIR should hold the file from {ds.url}")
    cached = cache_dir() / "downloads" / ds.filename
    if cached.is_file():
        return _verified(cached, ds)
    try:
        if ds.archive_member:
            download_member(ds.url, ds.archive_member, cached)
        else:
            download(ds.url, cached)
    except DataError as e:
        raise DataError(f"dataset {name!r} is not available offline: {e}; "
                        f"{offline_remedy(ds, data_dir)}") from None
    try:
        return _verified(cached, ds)
    except DataError:
        cached.unlink(missing_ok=True)
        raise


def offline_remedy(ds: NamedDataset, data_dir: str | None) -> str:
    """Where to put a named dataset's file to read it offline: in a folder named by
    SCRATCHGPT_DATA_DIR, or, where that is set already (and holds no such file), in it."""
    names = " or ".join((ds.filename, *ds.local_names))
    if data_dir:
        return f"SCRATCHGPT_DATA_DIR is {data_dir}, which holds no {names}: put it there"
    return f"put {names} in a folder and set SCRATCHGPT_DATA_DIR to it"


def _unknown_hint(name: str) -> str:
    """What a name that is no dataset's may mean: a file or folder of text (which ``--data``
    reads), a dataset prepared already, or a typo of a dataset's name."""
    from scratchgpt.data.prepare import META_FILE
    from scratchgpt.validation import did_you_mean

    path = Path(name)
    if (path / META_FILE).is_file():
        return (f"; {name} is a prepared dataset, which train and eval read as --dataset "
                f"{name}")
    if path.is_dir() or path.is_file():
        return f"; {name} is a {'folder' if path.is_dir() else 'file'}: give it as --data {name}"
    return did_you_mean(name, DATASET_NAMES)


# "*** START OF THE PROJECT GUTENBERG EBOOK ...", or "OF THIS" in files made before 2020
GUTENBERG_MARKER = r"\*\*\* ?{} OF TH(?:E|IS) PROJECT GUTENBERG EBOOK"
GUTENBERG_START = re.compile(GUTENBERG_MARKER.format("START"), re.IGNORECASE)
GUTENBERG_END = re.compile(GUTENBERG_MARKER.format("END"), re.IGNORECASE)


def strip_gutenberg(text: str) -> str:
    """The book between Project Gutenberg's ``*** START OF ...`` and ``*** END OF ...`` lines
    (case-insensitive; "OF THE" or the older "OF THIS"), without surrounding blank lines or a
    byte-order mark; text without the markers is kept whole."""
    start_marker, end_marker = GUTENBERG_START.search(text), GUTENBERG_END.search(text)
    start = 0
    if start_marker is not None:  # the line after the marker
        start = text.find("\n", start_marker.start()) + 1 or len(text)
    end = end_marker.start() if end_marker is not None else len(text)
    if end < start:
        end = len(text)
    return text[start:end].strip("\ufeff\r\n ")


def default_corpus_files() -> list[Path]:
    """The offline default corpus: the top-level modules of this Python's standard library
    (``Lib/*.py``), sorted by name. Every Python install has them, so it needs no network."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py") if p.is_file())
    if not files:
        raise DataError(f"no standard library sources found in {stdlib}")
    return files


def read_files(files: list[Path]) -> str:
    """Read and join UTF-8 text files (separated by a blank line), with one-line errors. A
    byte-order mark that opens a file (Windows editors write one) is not text: it goes. Line
    endings are Python's universal newlines: ``\\r\\n`` and a lone ``\\r`` are read as ``\\n``,
    so one text prepares the same ids whichever system saved it."""
    parts = []
    for path in files:
        try:
            raw = path.read_bytes()
        except OSError as e:
            raise DataError(f"cannot read {path}: {e.strerror}") from None
        parts.append(decode_text(raw, path))
    return "\n\n".join(parts)


STDIN = "-"  # the file name that reads standard input, where a reader takes it


def read_text_file(name: str | Path, what: str) -> tuple[str, bytes]:
    """(text, bytes) of the file a user named (the string ``-``: standard input; a Path is a
    file, even one named ``-``), decoded by :func:`decode_text`. A message names it as
    ``what`` and the name (``prompt file p.txt``; ``standard input``) and reads alike
    whichever flag named it: the file does not exist, is a directory or not a regular file
    (:func:`~scratchgpt.validation.file_source_problem`), cannot be read (the system's reason:
    a symlink loop, no permission), or is not UTF-8 text. A prompt file and fine-tuning data
    read through it."""
    if isinstance(name, str) and name == STDIN:
        raw, where = sys.stdin.buffer.read(), "standard input"
    else:
        path, where = Path(name), f"{what} {name}"
        raw = _read_bytes(path, where)
    return decode_text(raw, where), raw


def _read_bytes(path: Path, where: str) -> bytes:
    from scratchgpt.validation import file_source_problem

    problem = file_source_problem(path)
    # a link that leads nowhere (a loop) is no "does not exist": the read says what it is
    if problem is not None and (path.exists() or not path.is_symlink()):
        raise DataError(f"{where} {problem}")
    try:
        return path.read_bytes()
    except OSError as e:
        raise DataError(f"cannot read {where}: {e.strerror or e}") from None


def decode_text(raw: bytes, where: str | Path) -> str:
    """:func:`decode_utf8`, with ``read_text``'s universal newlines: ``\\r\\n`` and a lone
    ``\\r`` read as ``\\n``, so a text saved on Windows reads as one saved elsewhere.

    >>> decode_text(b"a\\r\\nb\\rc\\n", "a.txt")
    'a\\nb\\nc\\n'
    """
    return decode_utf8(raw, where).replace("\r\n", "\n").replace("\r", "\n")


def decode_utf8(raw: bytes, where: str | Path) -> str:
    """``raw`` as UTF-8 text, the byte-order mark that may open it dropped; bytes that are not
    UTF-8 are a DataError naming ``where`` (the file) and the first bad byte, with a hint where
    the file is UTF-16 (its byte-order mark), and so is UTF-16 without one
    (:func:`not_nul_padded`). Every reader of a user's text file decodes through it: a corpus,
    fine-tuning data, parallel text.

    >>> decode_utf8("caf\u00e9".encode("utf-16"), "a.txt")
    Traceback (most recent call last):
    ...
    scratchgpt.errors.DataError: a.txt is not valid UTF-8 text (byte 0): it is UTF-16 text; \
save it as UTF-8
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        utf16 = raw[:2] in (b"\xff\xfe", b"\xfe\xff")  # its byte-order mark
        hint = ": it is UTF-16 text; save it as UTF-8" if utf16 else ""
        raise DataError(f"{where} is not valid UTF-8 text (byte {e.start}){hint}") from None
    return not_nul_padded(text.removeprefix("\ufeff"), where)


# A text with this share of NUL characters or more is refused: no text holds them, and ASCII
# saved as UTF-16 without a byte-order mark is valid UTF-8 with a NUL after every letter.
NUL_SHARE = 0.1


def not_nul_padded(text: str, where: str | Path) -> str:
    """``text``, unless NUL characters make up :data:`NUL_SHARE` of it or more: then a
    DataError naming ``where`` (the file), since it is UTF-16 without a byte-order mark, or
    no text at all. Every reader of a user's text file checks it: a corpus, fine-tuning
    data, parallel text."""
    nuls = text.count("\0")
    if nuls and nuls >= NUL_SHARE * len(text):
        raise DataError(f"{where} is {nuls / len(text):.0%} NUL characters: UTF-16 text saved "
                        "without a byte-order mark (save it as UTF-8), or not text at all")
    return text


def text_lines(text: str) -> list[str]:
    """The lines of ``text`` as an editor numbers them, ended by ``\\n``, ``\\r\\n`` or
    ``\\r``. (``str.splitlines`` also ends one at ``\\x0b``, ``\\x0c``, ``\\x1c`` to
    ``\\x1e``, ``\\x85``, ``\\u2028`` and ``\\u2029``: a record holding one was cut in
    two, and every line after it named by the wrong number.) Every reader of a user's file of
    lines splits it so: parallel text, fine-tuning data.

    >>> text_lines("a\\tb\\u2028c\\r\\nd\\te\\n")
    ['a\\tb\\u2028c', 'd\\te']
    """
    lines = re.split(r"\r\n|\r|\n", text)
    return lines[:-1] if lines[-1] == "" else lines  # (no line after the last line break)


def text_files_under(folder: Path) -> list[Path]:
    """The ``.txt`` files (``.TXT`` too) under ``folder``, its subfolders included, following
    links to folders (each real folder once, so a link back up does not loop), sorted by path.
    Hidden files and folders (``.git``, ``.ipynb_checkpoints``: copies of the text) are
    left out."""
    found: list[Path] = []
    seen: set[str] = set()
    for root, dirs, files in os.walk(folder, followlinks=True):
        real = os.path.realpath(root)
        if real in seen:
            dirs.clear()  # reached again through a link: already read
            continue
        seen.add(real)
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [Path(root) / f for f in files if not f.startswith(".")
                  and f.lower().endswith(".txt") and (Path(root) / f).is_file()]
    return sorted(found)


def read_text_source(path: str | Path) -> tuple[str, str]:
    """Text from a file or a folder of .txt files. Returns (text, description)."""
    if not str(path):
        raise DataError("the data path is empty; name a text file or a folder of .txt files")
    path = Path(path)
    if path.is_dir():
        files = text_files_under(path)
        if not files:
            raise DataError(f"folder {path} contains no .txt files")
        try:
            return read_files(files), f"{len(files)} .txt files under {path}"
        except DataError as e:  # (a file the user may not know the folder holds)
            if len(files) == 1:
                raise
            raise DataError(f"{e} (one of the {len(files):,} .txt files under {path}, all of "
                            "which are read: move it out if it is not text)") from None
    if not path.exists():
        if path.is_symlink():
            raise DataError(f"data file {path} is a symbolic link that leads nowhere (a loop, "
                            "or its target is missing)")
        raise DataError(f"data file {path} does not exist")
    return read_files([path]), str(path)
