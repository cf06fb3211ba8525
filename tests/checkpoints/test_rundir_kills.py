"""An ``--overwrite`` killed at *every* step of its file operations, in process.

The kill -9 tests (tests/reliability/test_kill9.py) kill real runs at random moments, which
finds a narrow window only now and then. Here every change a run directory makes on disk
(a create, rename, unlink, mkdir or rmdir) is counted, and the process "dies" before the
N-th, for every N: from then on nothing more reaches the disk, as after a kill. The next
start's recovery (itself killed at every step, then run again) must leave the old run or the
new one, never a mix of their files.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from scratchgpt.checkpoints import Checkpoint, load_checkpoint
from scratchgpt.checkpoints.rundir import RUN_FILES, RunDir, run_config
from scratchgpt.models import build_model, model_config

MUTATIONS = ("replace", "rename", "unlink", "remove", "rmdir", "mkdir")


class Killed(BaseException):
    """The process died here (a BaseException: no ``except OSError`` of the code catches it)."""


@contextlib.contextmanager
def dies_at(n: int) -> Iterator[list[int]]:
    """Count the disk changes made in the block; the ``n``-th and every later one raise
    :class:`Killed` without happening. Yields [changes made]."""
    made = [0]
    originals = {name: getattr(os, name) for name in MUTATIONS}
    original_open = os.open

    def counted(original: Callable) -> Callable:
        def change(*args, **kwargs):
            if made[0] >= n:
                raise Killed
            made[0] += 1
            return original(*args, **kwargs)
        return change

    def opened(path, flags, *args, **kwargs):
        if flags & os.O_CREAT:  # a file created: a change on disk
            return counted(original_open)(path, flags, *args, **kwargs)
        return original_open(path, flags, *args, **kwargs)

    try:
        for name, original in originals.items():
            setattr(os, name, counted(original))
        os.open = opened
        yield made
    finally:
        for name, original in originals.items():
            setattr(os, name, original)
        os.open = original_open


def checkpoint(run_id: str) -> Checkpoint:
    config = model_config("bigram", vocab_size=3)
    return Checkpoint("bigram", config, build_model(config).state_dict(), run_id=run_id)


def old_run(path: Path) -> None:
    """A finished run: checkpoints, config, metrics, a plot the new run will not draw."""
    run = RunDir(path)
    with run.lock():
        run.begin("new")
        run.write_config(run_config(checkpoint("old")))
        for name in ("metrics.csv", "loss.png"):
            run.file(name).write_text(f"old {name}")
        run.save(checkpoint("old"), best=True)


def overwrite(path: Path, fails: bool) -> None:
    """A new run's life up to its first checkpoint (or, when ``fails``, an error before it)."""
    run = RunDir(path)
    with run.lock():
        run.begin("overwrite")
        try:
            run.write_config(run_config(checkpoint("new")))
            for name in ("metrics.csv", "merges.txt"):
                run.file(name).write_text(f"new {name}")
            if fails:
                raise RuntimeError("the new run failed")
            run.save(checkpoint("new"), best=True)
        except RuntimeError:
            run.abort()


def recover(path: Path) -> None:
    """What the next start does first (a resume's begin)."""
    with RunDir(path).lock() as run:
        run.begin("resume")


def files(path: Path) -> dict[str, str]:
    """The run's files, a checkpoint by its run id; nothing else may be left (no .replaced)."""
    found = {}
    for p in sorted(path.iterdir()):
        if p.name == ".lock":
            continue
        assert p.name in RUN_FILES, f"{p.name} left in the run directory"
        if p.suffix == ".pt":
            found[p.name] = load_checkpoint(p).run_id
        else:
            found[p.name] = json.loads(p.read_text())["run_id"] if p.suffix == ".json" \
                else p.read_text()
    return found


def steps(action: Callable[[], None]) -> int:
    """How many disk changes ``action`` makes when nothing kills it."""
    with dies_at(10**9) as made:
        action()
    return made[0]


def killed(action: Callable[[], None], n: int) -> None:
    with contextlib.suppress(Killed), dies_at(n):
        action()


def killed_overwrite(path: Path, fails: bool, n: int) -> None:
    """The old run, then an overwrite of it killed before its ``n``-th disk change."""
    old_run(path)
    killed(lambda: overwrite(path, fails), n)


@pytest.mark.parametrize("fails", [False, True], ids=["new-run-checkpoints", "new-run-fails"])
def test_an_overwrite_killed_at_every_step_leaves_the_old_run_or_the_new_one(tmp_path, fails,
                                                                            monkeypatch):
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # (durability is not what is tested)
    reference = tmp_path / "reference"
    old_run(reference)
    old = files(reference)
    changes = steps(lambda: overwrite(reference, fails))
    new = files(reference)
    assert (new == old) is fails  # (a failed run puts the old one back; else the new stands)
    for n in range(changes + 1):
        probe = tmp_path / f"probe-{n}"
        killed_overwrite(probe, fails, n)
        recovery = steps(lambda r=probe: recover(r))
        assert files(probe) in (old, new), n
        for m in range(recovery):  # the recovery itself killed after m changes, then run
            run = tmp_path / f"run-{n}-{m}"
            killed_overwrite(run, fails, n)
            killed(lambda r=run: recover(r), m)
            recover(run)
            assert files(run) in (old, new), (n, m)
