"""A run directory, and the one writer of its files.

    runs/x/
      last.pt  best.pt     checkpoints (scratchgpt.checkpoints.io.Checkpoint)
      config.json          the run's settings, for people to read (written from the same objects)
      tokenizer.json ...   the tokenizer, so the directory is self-contained
      metrics.csv loss.png written by the trainer through :meth:`RunDir.file`
      adapter.pt ...       what a fine-tuning run adds when it ends (LoRA adapter, test report)
      .lock                held by the process that writes the run

Rules that keep a run safe:

* **One writer.** :meth:`RunDir.lock` takes an OS lock (``flock``) on ``.lock`` for as long as
  the run is written; a second process gets "run X is in use by process N".
* **Nothing destroyed before its replacement is good.** ``--overwrite`` moves the old run's
  files into ``.replaced/``; they are deleted only once the new run has written its first
  checkpoint, and moved back if it fails before that (or at the next start, if it was killed).
* **Checkpoints in a safe order.** ``best.pt`` is written before ``last.pt``, so ``last.pt``
  never claims a best model that ``best.pt`` does not hold.
* Temporary files left by a killed write are removed when a run starts.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from scratchgpt.checkpoints.io import (
    TEMP_SUFFIX,
    Checkpoint,
    atomic_write_text,
    fsync_dir,
    load_checkpoint,
    lock_holder,
    remove_stale_temporaries,
    save_checkpoint,
    take_lock,
    temporary_name,
)
from scratchgpt.errors import CheckpointError, RunInUseError, StorageError
from scratchgpt.validation import FLAGS, file_above, json_loads, named

CONFIG_FILE = "config.json"
RUN_FILES = ("last.pt", "best.pt", CONFIG_FILE, "metrics.csv", "loss.png", "tokenizer.json",
             "merges.txt",
             # written by fine-tuning runs at their end (scratchgpt.finetune)
             "adapter.pt", "confusion.png", "test_metrics.json")
LOCK_FILE = ".lock"
REPLACED_DIR = ".replaced"
MOVED_MARK = ".complete"  # in REPLACED_DIR once every old file is in it


class RunDir:
    """The directory of one training run. Create it, then :meth:`lock` and :meth:`begin`."""

    def __init__(self, path: str | Path, options: Mapping[str, str] = FLAGS):
        self.path = Path(path)
        # validation.FLAGS or KEYWORDS: how its refusals name resume, overwrite and out
        self.options = options
        self._lock_fd: int | None = None
        self._uncommitted = False  # begun, with no checkpoint yet (see abort)
        self._created: list[Path] = []  # the folders acquire made, innermost first

    def file(self, name: str) -> Path:
        return self.path / name

    def holds_run(self) -> bool:
        """True if the directory holds (part of) a run's files."""
        return self.path.is_dir() and any((self.path / f).exists() for f in RUN_FILES)

    def is_scratchgpt_run(self) -> bool:
        """True if the directory holds a scratchgpt checkpoint or run configuration (a run
        writes its config.json before anything else), there or moved aside by an overwrite
        (a kill while they were moved leaves the rest of the run's files without them)."""
        return _holds_our_run(self.path) or _holds_our_run(self.file(REPLACED_DIR))

    # ---- the lock

    @contextlib.contextmanager
    def lock(self) -> Iterator[RunDir]:
        """Hold the run's lock for the duration of the block (see the module docstring)."""
        self.acquire()
        try:
            yield self
        finally:
            self.release()

    def acquire(self) -> None:
        self._refuse_what_is_not_a_run()  # before the lock file is the first thing written
        self._created = [d for d in (self.path, *self.path.parents) if not d.exists()]
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise CheckpointError(f"cannot write the run directory {self.path}: "
                                  f"{e.strerror}") from None
        try:
            holder = take_lock(fd)
        except OSError as e:  # (a file system without locks: NFS without lockd)
            os.close(fd)
            raise CheckpointError(f"cannot lock the run directory {self.path}: "
                                  f"{e.strerror}") from None
        if holder is not None:
            os.close(fd)
            raise RunInUseError(self._in_use(holder))
        self._lock_fd = fd

    def release(self) -> None:
        if self._lock_fd is not None:
            self._remove_if_unused()
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def _remove_if_unused(self) -> None:
        """A command refused after taking the lock of a directory it made leaves nothing: the
        lock file and the folders go (while the lock is held, and only when nothing else is
        in them), so a failed start does not litter the disk with empty runs."""
        if not self._created or os.listdir(self.path) != [LOCK_FILE]:
            return
        self.file(LOCK_FILE).unlink()
        with contextlib.suppress(OSError):  # (a folder someone has since written to stays)
            for folder in self._created:
                folder.rmdir()

    # ---- starting a run

    def begin(self, mode: str, can_resume: bool = True) -> None:
        """Check and prepare the directory for a run; call it holding the lock.

        ``mode``: ``"new"`` (refuse a directory that holds a run), ``"resume"`` (``last.pt``
        must exist), ``"overwrite"`` (move an existing run aside, see :meth:`commit`). Until
        its first checkpoint a new run can be undone: :meth:`abort` removes what it wrote
        and brings back a run it replaced. ``can_resume``: whether the command has a
        ``--resume`` for the refusal of a new run to suggest (it always has ``--overwrite``)."""
        self._recover_interrupted_overwrite()
        if self.path.is_dir():
            remove_stale_temporaries(self.path)
        if mode == "resume":
            self._check_resumable()
            return
        if self.holds_run():
            if mode != "overwrite":
                raise CheckpointError(self._occupied(can_resume))
            self._move_aside()
        self._uncommitted = True

    def check_can_begin(self, mode: str, can_resume: bool = True) -> None:
        """:meth:`begin`'s refusals of a new run (``mode`` "new" or "overwrite"), checked
        without the lock before a command's long preparations; :meth:`begin` checks again,
        holding it."""
        self._refuse_what_is_not_a_run()
        if mode == "new" and self.holds_run():
            holder = self._writer()  # (a run being written is said to be: --resume waits too)
            if holder is not None:
                raise RunInUseError(self._in_use(holder))
            raise CheckpointError(self._occupied(can_resume))

    def _writer(self) -> str | None:
        """The process writing the run (its id as the lock file records it), or None when no
        process holds the lock; found with a shared lock taken and dropped at once, so that
        nothing is created or left held."""
        try:
            fd = os.open(self.file(LOCK_FILE), os.O_RDONLY)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return lock_holder(fd)
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    def _in_use(self, holder: str) -> str:
        return (f"run {self.path} is in use by process {holder}; wait for it to finish (or "
                "stop it) before writing this run")

    def _refuse_what_is_not_a_run(self) -> None:
        """A file is no run directory (nor is a path below one), and neither a prepared
        dataset's directory nor a Hugging Face model's ever takes a run, --overwrite or not:
        the run's tokenizer.json or config.json would replace theirs, leaving the dataset or
        the model unreadable."""
        from scratchgpt.checkpoints.hf import is_hf_dir
        from scratchgpt.data.prepare import is_dataset

        out = named(self.options, "out")
        if self.path.exists() and not self.path.is_dir():
            raise CheckpointError(f"{self.path} is {_kind_of(self.path)}, not a run directory; "
                                  f"give the run its own {out}")
        above = file_above(self.path)
        if above is not None:  # (found by the mkdir only once the data was read)
            raise CheckpointError(f"{self.path} is below {above}, {_kind_of(above)}, not a "
                                  f"folder; give the run its own {out}")
        if is_dataset(self.path):
            raise CheckpointError(f"{self.path} holds a prepared dataset (train.bin, val.bin, "
                                  f"meta.json), not a run; give the run its own {out}")
        if is_hf_dir(self.path) and not self.has_checkpoint():
            raise CheckpointError(f"{self.path} holds a Hugging Face model (config.json and "
                                  f"its weights), not a run; give the run its own {out}")
        if self.holds_run() and not self.is_scratchgpt_run():
            # (--overwrite would move them aside and delete them once the run checkpoints)
            found = ", ".join(f for f in RUN_FILES if self.file(f).exists())
            raise CheckpointError(f"{self.path} holds files no scratchgpt run wrote ({found}); "
                                  f"give the run its own {out}")

    def _occupied(self, can_resume: bool) -> str:
        """Why a new run may not start here, and what to do instead (the flags the command
        has: ``--resume`` only where ``can_resume``)."""
        resume, overwrite = named(self.options, "resume"), named(self.options, "overwrite")
        if not can_resume:
            what = "a run" if self.has_checkpoint() else "the files of a run"
            return f"{self.path} already holds {what}; pass {overwrite} to replace it"
        if self.has_checkpoint():
            return (f"{self.path} already holds a run; pass {resume} to continue it or "
                    f"{overwrite} to replace it")
        return (f"{self.path} holds the files of a run that never wrote a checkpoint (nothing "
                f"to resume); pass {overwrite} to start it again")

    def _check_resumable(self) -> None:
        self._refuse_what_is_not_a_run()  # (a resume is planned before the lock is taken)
        if self.file(REPLACED_DIR).is_dir() and self._lock_fd is None:
            # an --overwrite killed before its first checkpoint left the old run aside: it
            # comes back (under the lock: an overwrite still running is refused) and resumes
            with self.lock():
                self._recover_interrupted_overwrite()
        if self.file("last.pt").is_file():
            return
        if self.file("best.pt").is_file():
            why = "it holds best.pt alone (a model, not a run's training state)"
        elif self.holds_run():
            why = ("the run never wrote a checkpoint; start it again with "
                   f"{named(self.options, 'overwrite')}")
        else:
            why = f"start the run without {named(self.options, 'resume')}"
        raise CheckpointError(f"cannot resume: {self.file('last.pt')} does not exist ({why})")

    def has_checkpoint(self) -> bool:
        return self.file("last.pt").is_file() or self.file("best.pt").is_file()

    def _move_aside(self) -> None:
        aside = self.file(REPLACED_DIR)
        aside.mkdir()
        for name in RUN_FILES:
            if self.file(name).exists():
                os.replace(self.file(name), aside / name)
        (aside / MOVED_MARK).touch()  # every old file is aside: what appears now is new
        fsync_dir(aside)
        fsync_dir(self.path)

    def commit(self) -> None:
        """The new run has written a checkpoint: the replaced run (if any) can go. Decided by
        what is on disk, not by this object: the process that saves (a trainer, rank 0 of a
        process group) is not always the one that called :meth:`begin`."""
        self._uncommitted = False
        if self.file(REPLACED_DIR).exists():
            self._discard_aside()

    def _discard_aside(self) -> None:
        """Delete the replaced run, in one step as far as a later start can see: renamed to a
        temporary name first (which the next start clears if a kill cuts the deletion short).
        Deleted in place, a cut-short deletion would leave some old files aside without
        their mark, and the next start would put them back beside the new run's."""
        trash = self.file(temporary_name(REPLACED_DIR))
        os.replace(self.file(REPLACED_DIR), trash)
        fsync_dir(self.path)
        shutil.rmtree(trash, ignore_errors=True)

    def abort(self) -> None:
        """The new run failed. Before its first checkpoint: remove what it wrote and put a
        replaced run back, leaving the directory as the run found it. After it (``last.pt``
        is the new run's: the old one was moved aside): the new run stands."""
        if not self._uncommitted:
            return
        if self.file("last.pt").is_file():
            self.commit()
        else:
            self._restore()
            self._uncommitted = False

    def _restore(self) -> None:
        """Put the files aside back, deleting the new run's; every step can be cut short by a
        kill and done again by the next start. While the mark is aside (or nothing is: a new
        run in a directory of its own), the files beside it are the new run's: those with no
        old file to take their place are deleted, then the mark. Without the mark (a move
        aside itself cut short, or a restore past that point), whatever is aside goes back
        over what is there, and nothing else is touched."""
        aside = self.file(REPLACED_DIR)
        if not aside.is_dir() or (aside / MOVED_MARK).exists():
            for name in RUN_FILES:
                if not (aside / name).exists():
                    self.file(name).unlink(missing_ok=True)
            fsync_dir(self.path)
            if not aside.is_dir():
                return
            (aside / MOVED_MARK).unlink()
            fsync_dir(aside)
        for name in RUN_FILES:
            if (aside / name).exists():
                os.replace(aside / name, self.file(name))
        fsync_dir(self.path)
        self._discard_aside()

    def _recover_interrupted_overwrite(self) -> None:
        """A process killed while replacing a run left ``.replaced/``: if the new run never
        wrote a checkpoint, the old run comes back; otherwise the new run stands."""
        aside = self.file(REPLACED_DIR)
        if not aside.is_dir():
            return
        if (aside / MOVED_MARK).exists() and self.file("last.pt").is_file():
            self._discard_aside()
        else:
            self._restore()

    # ---- writing

    def write_config(self, config: dict[str, Any], resumed: bool = False) -> None:
        """``config.json``: the run's settings as plain data (see :func:`run_config`). A
        resumed run keeps what the file recorded of how the run began that this process was
        not told again (a preset, a config file, the fine-tuning task and base): the sections
        ``config`` lacks or leaves None."""
        if resumed:
            config = {**self.recorded_config(),
                      **{k: v for k, v in config.items() if v is not None}}
        atomic_write_text(self.file(CONFIG_FILE), json.dumps(config, indent=1) + "\n")

    def recorded_config(self) -> dict[str, Any]:
        """The run's config.json as it is, or {} where it is missing or unreadable (it is
        for people to read; the checkpoints are the run's truth)."""
        return _read_json_object(self.file(CONFIG_FILE))

    def save_tokenizer(self, tokenizer: Any) -> None:
        """The tokenizer's files (``tokenizer.json``, ``merges.txt``), each replaced atomically:
        written into a temporary directory, then renamed into place."""
        tmp = Path(tempfile.mkdtemp(dir=self.path, prefix=".tokenizer.", suffix=TEMP_SUFFIX))
        try:
            tokenizer.save(tmp)
            for f in tmp.iterdir():
                os.replace(f, self.file(f.name))
            fsync_dir(self.path)
        except OSError as e:
            raise StorageError(f"cannot write the tokenizer into {self.path}: "
                               f"{e.strerror or e}") from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def save(self, checkpoint: Checkpoint, best: bool) -> None:
        """``last.pt``, and ``best.pt`` first when ``best`` (one serialization)."""
        save_checkpoint(self.file("last.pt"), checkpoint,
                        copies=[self.file("best.pt")] if best else [])
        self.commit()

    def last_version(self) -> tuple[int, int, int] | None:
        """(inode, mtime, size) of ``last.pt``: every save replaces the file, so another
        version means another process wrote the run."""
        try:
            st = self.file("last.pt").stat()
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def load_last(self) -> Checkpoint:
        """``last.pt``, with its record of the best loss reconciled with ``best.pt``.

        A process killed after writing ``best.pt`` but before ``last.pt`` leaves ``best.pt`` one
        evaluation ahead: the best loss recorded in ``last.pt`` is then too high, and resuming
        with it would overwrite the better ``best.pt`` with a worse model."""
        self._check_resumable()
        version = self.last_version()
        last = load_checkpoint(self.file("last.pt"))
        last.file_version = version
        last.check_weights()
        best_path = self.file("best.pt")
        if last.state is not None and best_path.is_file():
            best = load_checkpoint(best_path)
            if best.run_id != last.run_id:
                raise CheckpointError(f"{best_path} and {self.file('last.pt')} belong to "
                                      "different runs; move one of them away")
            if best.state is not None and best.state.val_loss is not None:
                last.state.best_val_loss = min(last.state.best_val_loss, best.state.val_loss)
        return last


def _read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``, or {} where it is missing, unreadable or no object."""
    try:
        found = json_loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _holds_our_run(folder: Path) -> bool:
    """True if ``folder`` holds a checkpoint or a config.json that :func:`run_config` wrote."""
    return RunDir(folder).has_checkpoint() or _is_run_config(folder / CONFIG_FILE)


def _is_run_config(path: Path) -> bool:
    """True if ``path`` is a config.json that :func:`run_config` wrote."""
    config = _read_json_object(path)
    return {"run_id", "model", "train"} <= config.keys() \
        and isinstance(config["model"], dict) and "type" in config["model"]


def run_config(checkpoint: Checkpoint, **extra: Any) -> dict[str, Any]:
    """The ``config.json`` of a run: one schema for every kind of run."""
    from scratchgpt.models import config_dict

    train = None if checkpoint.train_config is None else checkpoint.train_config.to_dict()
    return {"run_id": checkpoint.run_id,
            "model": {"type": checkpoint.model_type, **config_dict(checkpoint.model_config)},
            "train": train, "data": checkpoint.data, **extra}


def write_model_run(out: str | Path, checkpoint: Checkpoint, tokenizer: Any = None,
                    overwrite: bool = False) -> Path:
    """A run directory that holds ``checkpoint`` as its ``best.pt``, with ``config.json`` and
    the tokenizer's files: what ``convert --from hf`` and ``finetune --merge`` write. Locked and
    begun like a training run, so ``overwrite`` replaces an old run only once the new one is
    whole (a failure puts the old run back). Neither command resumes a run, so a refusal
    suggests --overwrite alone."""
    run = RunDir(out)
    with run.lock():
        run.begin("overwrite" if overwrite else "new", can_resume=False)
        try:
            run.write_config(run_config(checkpoint))
            if tokenizer is not None:
                run.save_tokenizer(tokenizer)
            save_checkpoint(run.file("best.pt"), checkpoint)
        except BaseException:
            run.abort()
            raise
        run.commit()
    return run.path


def _kind_of(path: Path) -> str:
    """What ``path``, which is there and no directory, is: "a file", "a device" (/dev/null),
    "a pipe" or "a socket" (each was called a file).

    >>> _kind_of(Path("/dev/null"))
    'a device'
    """
    mode = path.stat().st_mode
    if stat.S_ISREG(mode):
        return "a file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a pipe" if stat.S_ISFIFO(mode) else "a socket"
