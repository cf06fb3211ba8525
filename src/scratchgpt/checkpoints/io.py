"""Checkpoints: one typed format for every model, written atomically, loaded with checks.

A checkpoint file (``last.pt``, ``best.pt``) holds a :class:`Checkpoint`: the model (type,
config, weights), its tokenizers, where its data came from, and, for a run that can resume,
the training settings, the optimizer and the :class:`~scratchgpt.training.state.TrainState`.
It is the one source of truth of a run; ``config.json`` beside it is a copy for people to read.

Every write goes to a temporary file in the same directory, is flushed to disk, and is then
renamed over the old file, so a crash or Ctrl-C at any moment leaves the previous good file
intact. Reading checks each part of the file against the CRC-32 that ``torch.save`` wrote
with it, so a file damaged later (a disk, a copy) is refused rather than loaded as other
weights.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import glob
import io
import os
import re
import shutil
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from scratchgpt.errors import CheckpointError, ConfigError, ScratchGPTError, StorageError
from scratchgpt.validation import FLAGS, KEYWORDS, keywords, named
from scratchgpt.wording import a_kind, first_of

if TYPE_CHECKING:  # (hf imports this module)
    from scratchgpt.checkpoints.hf import HFConfig

FORMAT = "scratchgpt-checkpoint"
ADAPTER_FORMAT = "scratchgpt-adapter"  # a LoRA adapter file (scratchgpt.finetune.adapter)
FORMAT_VERSION = 2  # version 1 files (before typed checkpoints) are read too
TEMP_SUFFIX = ".tmp"


def atomic_write(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    """Call ``write(file_object)`` on a temp file next to ``path``, fsync, then rename.

    The temporary file is named ``.<name>.<random>.tmp``: a process killed mid-write leaves
    only such a file, which :func:`remove_stale_temporaries` clears later. A write that fails
    (a full disk, a read-only directory) removes its temporary file and raises a one-line
    :class:`StorageError`; the previous ``path`` is untouched."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
        os.fchmod(fd, 0o666 & ~current_umask())  # as open() makes a file, not mkstemp's 0600
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise write_failure(path, e) from None
    finally:
        if tmp is not None and Path(tmp).exists():
            Path(tmp).unlink(missing_ok=True)
    fsync_dir(path.parent)


def write_failure(path: Path, e: Exception, previous: str | None = "file") -> StorageError:
    """The one-line :class:`StorageError` of a write to ``path`` that failed with ``e`` (a full
    disk, a file size limit, a read-only directory), saying that the ``previous`` one there is
    intact (None: nothing to say of what is there). A short write with no error number
    (numpy's "3072 requested and 536 written"), or a library's own error, is said as such,
    with what usually causes it."""
    reason = getattr(e, "strerror", None)
    if not reason:
        text = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        reason = f"only part of it was written ({text}): is the disk full?"
    intact = f" (the previous {previous} is intact)" if previous and path.exists() else ""
    return StorageError(f"cannot write {path}: {reason}{intact}")


def current_umask() -> int:
    """The process's umask (read by setting it and putting it back: there is no getter)."""
    umask = os.umask(0)
    os.umask(umask)
    return umask


def atomic_write_text(path: Path, text: str) -> None:
    """:func:`atomic_write` of UTF-8 text."""
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def missing_folders(path: Path) -> list[Path]:
    """``path`` and the folders above it that do not exist yet, innermost first: what
    ``path.mkdir(parents=True)`` makes, and a write that fails removes again
    (:func:`remove_folders`)."""
    return [d for d in (path, *path.parents) if not d.exists()]


def remove_folders(folders: list[Path]) -> None:
    """Remove ``folders`` (innermost first), each only while empty: another process may have
    written into one since."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def exchange(a: Path, b: Path) -> bool:
    """Swap the two existing paths ``a`` and ``b`` in one atomic step (Linux's ``renameat2``
    with ``RENAME_EXCHANGE``), so that at no moment does either name stand empty. False, with
    nothing changed, where the system cannot: another OS, an older kernel or C library, a file
    system without it."""
    try:
        rename = ctypes.CDLL(None).renameat2
    except (OSError, AttributeError):
        return False
    at_cwd, rename_exchange = -100, 2  # AT_FDCWD, RENAME_EXCHANGE from <fcntl.h>, <stdio.h>
    return rename(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), rename_exchange) == 0


def remove_stale_temporaries(directory: Path) -> list[Path]:
    """Delete the temporary files (and directories) a killed write left in ``directory``;
    returns them. Call it only holding the directory's lock: another writer's temporaries
    are not stale."""
    stale = list(directory.glob(f".*{TEMP_SUFFIX}"))
    for p in stale:
        _remove(p)
    return stale


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def temporary_name(name: str) -> str:
    """``.NAME.PID.RANDOM.tmp``: a temporary file or folder this process writes for ``name``,
    which a later write of ``name`` clears (:func:`remove_dead_temporaries`) once this process
    is gone, killed before it could remove it itself."""
    return f".{name}.{os.getpid()}.{os.urandom(4).hex()}{TEMP_SUFFIX}"


def dead_temporaries(directory: Path, name: str, untagged: str | None = None) -> list[Path]:
    """The temporaries of ``name`` in ``directory`` (``.NAME.PID.X.tmp``, as
    :func:`temporary_name` makes them) whose process no longer runs: a live process's are
    its own, and a name with a dot more (``NAME.5``'s) is not ``name``'s.

    ``untagged``: the pattern (a regular expression of the whole name) of the temporaries an
    older scratchgpt wrote for ``name``, before they held a process id; one of those that
    nothing has changed in for :data:`UNTAGGED_AFTER_S` is dead too: a writer changes its
    temporary as it writes, and no export runs for a day."""
    ours = re.compile(rf"\.{re.escape(name)}\.(\d+)\.[^.]+{re.escape(TEMP_SUFFIX)}")
    dead = [p for p in directory.glob(f".{glob.escape(name)}.*{TEMP_SUFFIX}")
            if (m := ours.fullmatch(p.name)) is not None and not process_alive(int(m[1]))]
    if untagged is not None:
        old = re.compile(untagged)
        dead += [p for p in directory.glob(f".*{TEMP_SUFFIX}")
                 if old.fullmatch(p.name) and untouched_for(p, UNTAGGED_AFTER_S)]
    return dead


UNTAGGED_AFTER_S = 24 * 3600  # see dead_temporaries


def untouched_for(path: Path, seconds: float) -> bool:
    """Whether nothing in ``path`` (a file, or a folder and all it holds) has been modified for
    ``seconds``; False where it changes as it is read."""
    limit = time.time() - seconds
    try:
        inside = list(path.rglob("*")) if path.is_dir() and not path.is_symlink() else []
        return all(p.lstat().st_mtime < limit for p in (path, *inside))
    except OSError:
        return False


def remove_dead_temporaries(directory: Path, name: str,
                            untagged: str | None = None) -> list[Path]:
    """Delete :func:`dead_temporaries`; returns them."""
    dead = dead_temporaries(directory, name, untagged)
    for p in dead:
        _remove(p)
    return dead


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (another user's too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


@contextlib.contextmanager
def held_lock(path: Path, in_use: Callable[[str], ScratchGPTError]) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the file ``path`` for the block, this process's id
    written in it; the file, and the folders made for it (each only while empty), go at the
    end. Held by another process: ``in_use(the id it wrote)`` is raised, and nothing made
    stays. The system drops a dead process's lock, so a file left by one killed outright is
    taken over, whatever its id has become since. An OSError (a read-only folder) is raised
    as it is, nothing made staying."""
    created = missing_folders(path.parent)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = _lock(path)
    except BaseException:
        remove_folders(created)
        raise
    if isinstance(fd, str):
        remove_folders(created)
        raise in_use(fd)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)  # (still held: no other process has it in between)
        os.close(fd)
        remove_folders(created)


def _lock(path: Path) -> int | str:
    """A descriptor of ``path`` holding its exclusive lock, or the id its holder wrote."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        holder = take_lock(fd)
        if holder is not None:
            os.close(fd)
            return holder
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # the last holder removed the file between the open and the lock


def take_lock(fd: int) -> str | None:
    """Take the exclusive ``flock`` of the lock file open at ``fd`` without waiting, and write
    this process's id in it: None once taken, else the id its holder wrote (the lock of a
    run directory and of an export are taken so)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return lock_holder(fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return None


def lock_holder(fd: int) -> str:
    """The process id the lock file open at ``fd`` records ("unknown" where it is empty)."""
    return os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"


@dataclass
class Checkpoint:
    """Everything a checkpoint file holds.

    ``tokenizers`` maps a role to a tokenizer's saved state: ``"text"`` for language models,
    ``"source"``/``"target"`` for seq2seq. ``data`` says where the run's data came from (e.g.
    ``{"dataset": "data/shakespeare"}``), so ``eval`` and ``--resume`` find it again. A run's
    checkpoints share its ``run_id``. ``path`` is where it was read from (not saved).
    """

    model_type: str
    model_config: Any  # the typed config of ``model_type`` (see scratchgpt.models)
    # (the weights and the optimizer's state stay out of the repr: printing a load_model
    # source gave ~100 KB of tensors for a 2-layer model)
    model: dict[str, Tensor] = field(repr=False)
    tokenizers: dict[str, dict[str, Any]] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    run_id: str = ""
    train_config: Any = None  # scratchgpt.training.config.TrainConfig, for runs that resume
    state: Any = None  # scratchgpt.training.state.TrainState
    optimizer: dict[str, Any] | None = field(default=None, repr=False)
    path: Path | None = None
    file_version: tuple[int, int, int] | None = None  # see RunDir.last_version (not saved)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``torch.save`` (loadable with ``weights_only=True``)."""
        from scratchgpt.models import config_dict

        return {"format": FORMAT, "version": FORMAT_VERSION, "run_id": self.run_id,
                "model_type": self.model_type, "model_config": config_dict(self.model_config),
                "model": self.model, "tokenizers": self.tokenizers, "data": self.data,
                "train_config": None if self.train_config is None else self.train_config.to_dict(),
                "state": None if self.state is None else self.state.to_dict(),
                "optimizer": self.optimizer}

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str) -> Checkpoint:
        """Validate and type what a checkpoint file held (version 1 or 2)."""
        from scratchgpt.models import model_config
        from scratchgpt.training.config import TrainConfig
        from scratchgpt.training.state import TrainState

        if d.get("version") == 1:
            d = _from_version_1(d)
        if d.get("version") != FORMAT_VERSION:
            raise CheckpointError(f"{where} has checkpoint format version {d.get('version')}, "
                                  f"this scratchgpt reads versions 1 and {FORMAT_VERSION}")
        for key in ("model_type", "model_config", "model"):
            if key not in d:
                raise CheckpointError(f"{where} lacks {key!r}; it is damaged or from another "
                                      "program")
        try:
            config = model_config(d["model_type"], **dict(d["model_config"]))
            train = d.get("train_config")
            train = None if train is None else TrainConfig.from_dict(dict(train))
        except (ScratchGPTError, TypeError, ValueError) as e:
            raise CheckpointError(f"{where}: damaged or incompatible settings ({e})") from None
        state = d.get("state")
        return cls(d["model_type"], config, d["model"], dict(d.get("tokenizers") or {}),
                   dict(d.get("data") or {}), str(d.get("run_id", "")), train,
                   None if state is None else TrainState.from_dict(dict(state), where),
                   d.get("optimizer"), Path(where))

    def tokenizer(self, role: str = "text") -> Any:
        """The tokenizer saved under ``role`` (a language model's: ``"text"``); an older
        checkpoint without one uses the ``tokenizer.json`` beside the file. A tokenizer whose
        ids the model cannot take is a CheckpointError (see :meth:`check_tokenizer`)."""
        from scratchgpt.tokenizers import load_tokenizer, tokenizer_from_dict

        directory = self.path.parent if self.path is not None else None
        if role in self.tokenizers:
            tok = tokenizer_from_dict(self.tokenizers[role], directory, where=str(self.path))
        elif role == "text" and directory is not None:
            self._check_not_weights_only(directory)
            tok = load_tokenizer(directory)
        else:
            raise CheckpointError(f"{self.path}: holds no {role} tokenizer")
        self.check_tokenizer(tok, role)
        return tok

    def _check_not_weights_only(self, directory: Path) -> None:
        """A model imported from a Hugging Face directory without tokenizer files holds
        weights only (``convert --from hf`` said so); a command that needs its tokenizer says
        that, where it said 'no tokenizer found: DIR/tokenizer.json does not exist', as if
        the run had lost a file."""
        from scratchgpt.tokenizers import TOKENIZER_FILE

        origin = self.data.get("converted_from")
        if origin is None or (directory / TOKENIZER_FILE).is_file():
            return
        raise CheckpointError(f"{self.path} holds weights only: it was converted from {origin}, "
                              "which had no tokenizer files; put the model's tokenizer there "
                              f"and convert again with --overwrite")

    def check_tokenizer(self, tok: Any, role: str = "text") -> None:
        """A tokenizer larger than the model's vocabulary makes ids the model cannot embed; a
        smaller one, in a run trained here, lets the model emit ids it cannot decode (a model
        imported with a padded vocabulary may have more ids than its tokenizer)."""
        key = {"text": "vocab_size", "source": "src_vocab", "target": "tgt_vocab"}.get(role)
        vocab = getattr(self.model_config, key, None) if key else None
        n = getattr(tok, "vocab_size", None)
        if vocab is None or n is None or n == vocab or (n < vocab and self.train_config is None):
            return
        raise CheckpointError(f"{self.path}: its {role} tokenizer has {n:,} tokens but the "
                              f"model's vocabulary has {vocab:,}; the checkpoint is damaged, or "
                              "its tokenizer belongs to another model")

    def check_weights(self) -> None:
        """The model the config describes fits in memory, and the weights fit that model;
        checked before the model is built, so that a config claiming a million layers is
        refused in one line instead of being allocated."""
        from scratchgpt import memory

        where = self.path or "the checkpoint"
        memory.check_fits(memory.inference_estimate(self.model_config, 1, 1),
                          f"the model of {where}", error=CheckpointError)
        if not isinstance(self.model, dict) or not all(
                isinstance(k, str) and isinstance(v, Tensor) for k, v in self.model.items()):
            raise CheckpointError(f"{where}: its weights are not a mapping of names to tensors")
        depth = memory.depth(self.model_config)  # (a classifier's or LoRA model's GPT's)
        if depth > memory.DIRECT_DEPTH:
            # too deep to build on the meta device in good time: compare sizes instead (a
            # state dict holds every parameter, shared ones twice, and some buffers)
            stored, needed = (sum(v.numel() for v in self.model.values()),
                              memory.parameter_count(self.model_config))
            if stored < needed:
                raise CheckpointError(f"{where}: its weights hold {stored:,} numbers but the "
                                      f"model its settings describe has {needed:,} parameters "
                                      f"(n_layer {depth:,})")
            return  # the names are checked by load_state_dict once built
        from scratchgpt.models import build_model

        with torch.device("meta"):  # names and shapes only
            expected = {k: tuple(v.shape) for k, v in build_model(
                self.model_config).state_dict().items()}
        reason = state_dict_difference(expected, {k: tuple(v.shape)
                                                  for k, v in self.model.items()})
        if reason:
            raise CheckpointError(f"{where}: its weights do not fit the model its settings "
                                  f"describe: {reason}")


NAMES_SHOWN = 3  # the tensors a refusal of weights names of those missing (or unexpected)


def state_dict_difference(expected: dict[str, tuple[int, ...]],
                          found: dict[str, tuple[int, ...]]) -> str:
    """What differs between two {name: shape} maps, most telling first, in one short line
    ("" when they agree).

    >>> state_dict_difference({"a": (2,), "b": (3,)}, {"a": (4,), "c": (1,)})
    'missing b; unexpected c; a has shape (4,), the model needs (2,)'
    """
    missing = [k for k in expected if k not in found]
    unexpected = [k for k in found if k not in expected]
    shapes = [f"{k} has shape {found[k]}, the model needs {expected[k]}"
              for k in expected if k in found and found[k] != expected[k]]
    parts = ([f"missing {first_of(missing, NAMES_SHOWN)}"] if missing else []) + \
        ([f"unexpected {first_of(unexpected, NAMES_SHOWN)}"] if unexpected else []) + shapes[:2]
    return "; ".join(parts)


def _from_version_1(d: dict[str, Any]) -> dict[str, Any]:
    """A version-1 checkpoint (flat keys, one tokenizer, dataset path) as version 2."""
    train = dict(d["train_config"]) if d.get("train_config") else None
    if train is not None:
        train.pop("model", None)  # the model type lives with the model now
    rng = dict(d.get("rng") or {})
    if rng and "torch_per_rank" not in rng:
        rng["torch_per_rank"], rng["cuda_per_rank"] = [rng.get("torch")], [rng.get("cuda")]
    state = None
    if "step" in d:
        state = {"step": d["step"], "tokens": d.get("tokens", 0),
                 "elapsed_s": d.get("elapsed_s", 0.0),
                 "best_val_loss": d.get("best_val_loss", float("inf")),
                 "val_loss": d.get("val_loss"),
                 "rng": {k: rng[k] for k in ("batch", "torch_per_rank", "cuda_per_rank")
                         if k in rng}}
    return {**d, "version": FORMAT_VERSION, "train_config": train, "state": state,
            "tokenizers": {"text": d["tokenizer"]} if d.get("tokenizer") else {},
            "data": {"dataset": d["dataset"]} if d.get("dataset") else {}}


def atomic_link(source: Path, path: Path) -> bool:
    """Make ``path`` another name of the finished file ``source`` (a hard link, renamed into
    place and made durable like :func:`atomic_write`): the same bytes at the cost of a rename,
    where writing them again costs a second flush to disk. False where the file system has no
    hard links (or ``source`` is on another one); ``path`` is then untouched."""
    tmp = path.with_name(f".{path.name}.{os.urandom(4).hex()}{TEMP_SUFFIX}")
    try:
        os.link(source, tmp)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        return False
    fsync_dir(path.parent)
    return True


def save_checkpoint(path: str | Path, checkpoint: Checkpoint,
                    copies: Iterable[str | Path] = ()) -> None:
    """Atomically save ``checkpoint`` to ``path`` and to each of ``copies`` (serialized once,
    in the order given: the first file written, the others hard links to it where the file
    system has them; every later save replaces a name with a new file, so the names never
    share a change)."""
    buf = io.BytesIO()
    torch.save(checkpoint.to_dict(), buf)
    def write(f: IO[bytes]) -> None:
        f.write(buf.getbuffer())

    first, *others = [Path(t) for t in (*copies, path)]
    atomic_write(first, write)
    for target in others:
        if not atomic_link(first, target):
            atomic_write(target, write)


def resolve_checkpoint(path: str | Path, which: str | None = None,
                       options: Mapping[str, str] = KEYWORDS) -> Path:
    """A checkpoint file from a file path or a run directory: by default (``which`` None) the
    run's ``best.pt``, or its ``last.pt`` for a run that has not evaluated yet. ``which``
    "best" or "last" insists on that file: ``path`` must then be a run directory holding it,
    as nothing else is taken in its place. ``options`` name ``which`` in a refusal: the
    keyword (validation.KEYWORDS), or a command's ``--which`` (validation.FLAGS)."""
    path = Path(path)
    if which not in (None, "best", "last"):  # (it looked for WHICH.pt and named the others)
        raise CheckpointError(f"which is 'best', 'last' or None (the run's best.pt, or its "
                              f"last.pt before it has one), got {which!r}")
    if which is not None and path.is_file():
        raise CheckpointError(f"{path} is a checkpoint file; {named(options, 'which', which)} "
                              f"picks a run directory's {which}.pt (name the directory, or "
                              f"{_without_which(options)})")
    if path.is_dir():
        other = {"best": "last", "last": "best"}.get(which or "")
        if other and not (path / f"{which}.pt").is_file() and (path / f"{other}.pt").is_file():
            why = " (the run has not evaluated yet)" if which == "best" else ""
            raise CheckpointError(f"{path} has no {which}.pt, only {other}.pt{why}; "
                                  f"{_without_which(options, which)}")
        order = [f"{which}.pt"] if which else ["best.pt", "last.pt"]
        for name in order:
            if (path / name).is_file():
                return path / name
        from scratchgpt.checkpoints.rundir import REPLACED_DIR  # (rundir imports this module)
        from scratchgpt.data.prepare import is_dataset

        if is_dataset(path):  # (given where a model goes, it was "no checkpoint" in it)
            raise CheckpointError(f"{path} holds a prepared dataset (train.bin, val.bin, "
                                  "meta.json), not a model; give a run directory or a "
                                  f"checkpoint (train one with scratchgpt train --dataset "
                                  f"{path})")
        aside = (f" (an --overwrite stopped before its first checkpoint left the old run in "
                 f"{REPLACED_DIR}/: 'scratchgpt train --out DIR --resume' brings it back)"
                 if (path / REPLACED_DIR).is_dir() else "")
        raise CheckpointError(f"no checkpoint (best.pt or last.pt) in {path}{aside}")
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist{_hub_hint(path)}")
    return path


def _hub_hint(path: Path) -> str:
    """For a bare name that is no file (``gpt2``), how to name the hub model: " (a Hugging
    Face model is hf:gpt2)"; else ""."""
    from scratchgpt.checkpoints.hub import hub_spelling, is_bare  # (hub imports this module)

    return f" ({hub_spelling(str(path))})" if is_bare(str(path)) else ""


def _without_which(options: Mapping[str, str], *which: str) -> str:
    """How to stop insisting on one checkpoint of a run: drop ``--which`` (``which``, where
    given, its value), or, from Python, leave the keyword at its default."""
    return "leave which None" if keywords(options) else f"drop {named(options, 'which', *which)}"


def load_checkpoint(path: str | Path, which: str | None = None,
                    options: Mapping[str, str] = KEYWORDS) -> Checkpoint:
    """Load and validate a checkpoint; every failure is a one-line :class:`CheckpointError`
    (``which`` and ``options``: :func:`resolve_checkpoint`)."""
    file = resolve_checkpoint(path, which, options)
    data = read_torch_file(file, "checkpoint")
    if isinstance(data, dict) and data.get("format") == ADAPTER_FORMAT:
        from scratchgpt.finetune.adapter import checkpoint_from_adapter

        return checkpoint_from_adapter(data, str(file))  # its base, with the adapter over it
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"{file} is not a scratchgpt checkpoint")
    return Checkpoint.from_dict(data, str(file))


def read_torch_file(file: str | Path, what: str) -> Any:
    """``torch.load`` of ``file``, plain tensors and data only; a file it cannot read is a
    one-line :class:`CheckpointError` saying it is not a readable ``what``."""
    other = _not_torch_save(file)
    if other:
        raise CheckpointError(f"{file} is not a readable {what}: {other}")
    damaged = _damaged_part(file)
    if damaged:
        raise CheckpointError(f"{file} is not a readable {what}: it is damaged ({damaged} does "
                              "not match the checksum saved with it)")
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - the weights-only unpickler raises whatever the
        # bytes of a file that is not a checkpoint provoke (KeyError, IndexError, ...)
        raise CheckpointError(f"{file} is not a readable {what}: {_load_failure(e)}") from None


GGUF_MAGIC = b"GGUF"  # the first bytes of every GGUF file
GGUF_NOT_READ = "scratchgpt writes GGUF (convert --to gguf) but does not read it"


def is_gguf(file: str | Path) -> bool:
    """Whether ``file`` is a GGUF file (llama.cpp's); False where it cannot be read."""
    try:
        with open(file, "rb") as f:
            return f.read(len(GGUF_MAGIC)) == GGUF_MAGIC
    except OSError:
        return False


def _not_torch_save(file: str | Path) -> str | None:
    """Why ``file`` cannot be what ``torch.save`` wrote, from its first bytes and its end, or
    None when it may be: torch writes a zip archive ("PK"), or before archives a pickle
    (protocol 2 and later begin with 0x80). A text file, where the unpickler had called it a
    file of Python objects; a GGUF file (llama.cpp's, which ``convert --to gguf`` writes); a
    zip archive without its end, which torch reported as ``[Errno 22] Invalid argument``. A
    file that cannot be read is None: torch.load then says why."""
    try:
        with open(file, "rb") as f:
            head = f.read(4)
    except OSError:
        return None
    if head.startswith(GGUF_MAGIC):
        return (f"it is a GGUF file, for llama.cpp: {GGUF_NOT_READ}; give the run directory or "
                ".pt file it was made from")
    if head.startswith(b"PK") and not zipfile.is_zipfile(file):
        return ("it is truncated or corrupt: a zip archive without its end (a copy, download "
                "or write cut short?)")
    if not head.startswith((b"PK", b"\x80")):
        return "not a file torch.save wrote (a zip archive, or a pickle from an older torch)"
    return None


def _damaged_part(file: str | Path) -> str | None:
    """The first part of ``torch.save``'s zip archive whose bytes no longer match their CRC-32
    (None when all do, or when ``file`` is no zip archive: ``torch.load`` then says what it
    is). A part whose CRC is 0 is skipped: torch writes 0 when told not to compute them
    (``torch.utils.serialization.config.save.compute_crc32``)."""
    try:
        with zipfile.ZipFile(file) as archive:
            for part in archive.infolist():
                if part.CRC == 0:
                    continue
                try:
                    with archive.open(part) as f:  # compares the CRC-32 once read to the end
                        while f.read(1 << 22):
                            pass
                except (zipfile.BadZipFile, EOFError):
                    return part.filename
    except (zipfile.BadZipFile, OSError, ValueError):
        return None
    return None


def _load_failure(e: BaseException) -> str:
    """Why ``torch.load`` failed, in a few words. Its weights-only refusal is a long message
    whose useful part (the Python object the file wanted to create) comes last."""
    text = " ".join(str(e).split())
    if isinstance(e, OSError) and e.errno in (errno.EACCES, errno.EISDIR, errno.ELOOP,
                                              errno.EIO, errno.ENOENT):
        return e.strerror
    if "Weights only load failed" in text:
        found = re.search(r"(Unsupported global: GLOBAL \S+|Unsupported operand \S+)", text)
        what = found.group(1) if found else "Python objects"
        return (f"it holds Python objects, not plain tensors and data ({what}); scratchgpt does "
                "not run code from a checkpoint")
    if isinstance(e, (KeyError, IndexError)) or not text:  # pickle's opcodes met other bytes
        return f"not a file torch.save wrote ({type(e).__name__})"
    return f"truncated or corrupt? {_first_sentence(text)}"


def _first_sentence(text: str, limit: int = 160) -> str:
    """The first sentence of ``text``, cut at a word (with "...") past ``limit`` characters.

    >>> _first_sentence("The archive ends early. This is an internal error.")
    'The archive ends early.'
    """
    end = text.find(". ")
    if end >= 0:
        text = text[:end + 1]
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " ..."


@dataclass
class ModelSource:
    """Where a loaded model came from: a scratchgpt checkpoint, or a Hugging Face directory
    (``hf_dir``, no checkpoint, and its ``config.json`` as read for the model, which the
    tokenizer and chat template are read with too). ``path`` is the file the weights were read
    from."""

    path: Path
    checkpoint: Checkpoint | None = None
    hf_dir: Path | None = None
    hf_config: HFConfig | None = None
    _tokenizer: Any = field(default=None, init=False, repr=False, compare=False)

    @property
    def model_type(self) -> str:
        """The registry name of the model (a Hugging Face GPT-2 is a ``gpt``)."""
        return self.checkpoint.model_type if self.checkpoint is not None else "gpt"

    def tokenizer(self) -> Any:
        """The tokenizer the model was trained with (for a Hugging Face directory, its
        tokenizer files), read once: a GPT-2 tokenizer's 50,000 merges take a while."""
        if self._tokenizer is None:
            if self.checkpoint is not None:
                self._tokenizer = self.checkpoint.tokenizer("text")
            else:
                from scratchgpt.checkpoints.hf import hf_tokenizer

                self._tokenizer = hf_tokenizer(self.hf_dir, config=self.hf_config)
        return self._tokenizer


def model_from_checkpoint(checkpoint: Checkpoint) -> nn.Module:
    """The model a checkpoint holds, with its weights (eval mode, CPU). LoRA adapters are
    merged into the weights they adapt (the same function, computed by plain layers)."""
    from scratchgpt.models import build_model
    from scratchgpt.models.lora import merge_lora

    checkpoint.check_weights()
    model = build_model(checkpoint.model_config)
    try:
        model.load_state_dict(checkpoint.model)
    except RuntimeError as e:
        lines = [line.strip() for line in str(e).splitlines()[1:] if line.strip()]
        raise CheckpointError(f"{checkpoint.path}: its weights do not fit the model: "
                              f"{' '.join(lines)[:300]}") from None
    merge_lora(model)
    return model.eval()


def load_model(path: str | Path, which: str | None = None,
               options: Mapping[str, str] = KEYWORDS) -> tuple[nn.Module, ModelSource]:
    """Rebuild the model saved in a checkpoint (eval mode, CPU): returns (model, source).

    ``path`` may also be a Hugging Face GPT-2 directory (config.json + model.safetensors, its
    shards or pytorch_model.bin), converted on the fly (see :mod:`scratchgpt.checkpoints.hf`), or
    ``hf:`` and a hub model id (``hf:gpt2``), downloaded once into the hub's cache
    (:mod:`scratchgpt.checkpoints.hub`). ``which``: :func:`resolve_checkpoint`; a refusal
    names it as ``options`` do (the keyword; a command passes validation.FLAGS)."""
    from scratchgpt.checkpoints.hf import is_hf_dir, load_hf, read_hf_config
    from scratchgpt.checkpoints.hub import HF_PREFIX, download

    if str(path).startswith(HF_PREFIX):
        path = download(str(path)[len(HF_PREFIX):])
    if is_hf_dir(path):
        if which is not None:
            raise CheckpointError(f"{path} is a Hugging Face model directory, one model; "
                                  f"{named(options, 'which', which)} picks a run directory's "
                                  f"{which}.pt ({_without_which(options)})")
        config = read_hf_config(path)
        model, weights = load_hf(path, config)
        return model, ModelSource(weights, hf_dir=Path(path), hf_config=config)
    checkpoint = load_checkpoint(path, which, options)
    return model_from_checkpoint(checkpoint), ModelSource(checkpoint.path, checkpoint)


# what to use instead of a command that continues text, for a checkpoint of another kind
NOT_LANGUAGE_MODELS = {"gpt-classifier": "label texts with scratchgpt classify",
                       "rnn-classifier": "it labels texts; it does not write them",
                       "seq2seq": "decode with scratchgpt seq2seq translate"}


def load_language_model(path: str | Path, which: str | None = None,
                        command: str = "this command") -> tuple[nn.Module, ModelSource]:
    """:func:`load_model` for ``command``, which continues text: a checkpoint of another kind
    of model (a classifier, a seq2seq model) is a ConfigError saying what to use instead."""
    model, source = load_model(path, which, FLAGS)
    if not hasattr(model, "new_cache"):
        use = NOT_LANGUAGE_MODELS.get(source.model_type, "it is not a language model")
        raise ConfigError(f"{path} holds {a_kind(source.model_type)} model; {command} needs a "
                          f"language model, one that predicts the next token ({use})")
    return model, source


def load_for_generation(path: str | Path, which: str | None = None,
                        command: str = "this command") -> tuple[nn.Module, ModelSource]:
    """:func:`load_language_model` for ``command``, which turns the ids it generates into text:
    a GPT whose vocabulary is padded past its tokenizer's (a Hugging Face model's may be) has
    it cut to the tokenizer's ids (:func:`~scratchgpt.models.gpt.with_vocabulary`), so it never
    picks an id the tokenizer cannot decode."""
    from scratchgpt.models.gpt import GPT, with_vocabulary

    model, source = load_language_model(path, which, command)
    if not isinstance(model, GPT):  # (an imported model, the one kind that pads, is a GPT)
        return model, source
    n = getattr(source.tokenizer(), "vocab_size", None)
    if n is not None and n < model.config.vocab_size:
        model = with_vocabulary(model, n)
    return model, source
