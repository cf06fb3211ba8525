"""``kill -9`` at random moments: of training (every step writes a checkpoint), of a bare
checkpoint writer (the rename window), of ``prepare`` and of an ``--overwrite``. After every
kill the files load, belong together and resume; nothing the user had is lost.

The moments are drawn from a seeded generator, so a failure can be replayed.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
import torch

from scratchgpt.checkpoints import Checkpoint, load_checkpoint, save_checkpoint
from scratchgpt.checkpoints.rundir import RunDir
from scratchgpt.cli import main
from scratchgpt.models import model_config
from tests.corpus import play_text
from tests.reliability.conftest import TINY, snapshot
from tests.reliability.procs import file_version, start_call, start_cli, wait_for

SEED = 1234
TRAIN_KILLS = 20
WRITE_KILLS = 20
PREPARE_KILLS = 6
OVERWRITE_KILLS = 6


def check_run(run: Path) -> tuple[Checkpoint, bool]:
    """A run as a kill may leave it: last.pt and best.pt load and belong to one run, and
    best.pt is at least as good as last.pt says. Returns (last.pt reconciled, whether the
    kill fell between writing best.pt and last.pt)."""
    raw_last = load_checkpoint(run / "last.pt")
    best = load_checkpoint(run / "best.pt")
    last = RunDir(run).load_last()
    assert best.run_id == last.run_id == raw_last.run_id
    assert best.state.val_loss == last.state.best_val_loss <= raw_last.state.best_val_loss
    assert best.state.step <= last.state.step + 1
    assert json.loads((run / "config.json").read_text())["run_id"] == last.run_id
    return last, raw_last.state.best_val_loss > best.state.val_loss


def test_training_survives_kill_9_at_random_moments(tiny_data, tmp_path, figures):
    rng = random.Random(SEED)
    run = tmp_path / "run"
    start = ["train", "--dataset", tiny_data, "--out", run, "--max-iters", "1000000",
             "--eval-interval", "1", "--log-interval", "1", *TINY]
    steps, between, temporaries = [], 0, 0
    for i in range(TRAIN_KILLS):
        before = file_version(run / "last.pt")
        proc = start_cli(start if i == 0 else ["train", "--out", run, "--resume"],
                         tmp_path / f"train-{i}.log")
        wait_for(lambda b=before: file_version(run / "last.pt") not in (None, b), proc=proc,
                 what="a new checkpoint")
        time.sleep(rng.uniform(0.0, 0.3))
        proc.kill()
        assert proc.wait() == -9
        temporaries += len(list(run.glob(".*.tmp")))
        last, fell_between = check_run(run)
        between += fell_between
        steps.append(last.state.step)
    assert steps == sorted(steps) and steps[-1] > steps[0]  # every resume went on
    final = steps[-1] + 3
    assert main(["train", "--out", str(run), "--resume", "--max-iters", str(final),
                 "--no-progress"]) == 0
    last, _ = check_run(run)
    assert last.state.step == final and not list(run.glob(".*.tmp"))
    figures.count("kill9_training", TRAIN_KILLS)
    figures.count("kill9_training_between_best_and_last", between)
    figures.count("kill9_training_temporaries_left_then_removed", temporaries)
    figures.count("kill9_resumes_completed", TRAIN_KILLS)


def write_forever(path: str) -> None:
    """Save checkpoints of ~2 MB to ``path`` (and first ``path``.best) until killed; the
    weights of save ``i`` are all ``i``."""
    config = model_config("bigram", vocab_size=3)
    i = 0
    while True:
        i += 1
        ckpt = Checkpoint("bigram", config, {"w": torch.full((500_000,), float(i))},
                          data={"i": i}, run_id="w")
        save_checkpoint(path, ckpt, copies=[path + ".best"])


def test_checkpoint_writes_survive_kill_9_in_the_rename_window(tmp_path, figures):
    rng = random.Random(SEED + 1)
    path = tmp_path / "last.pt"
    for k in range(WRITE_KILLS):
        before = file_version(path)
        proc = start_call(write_forever, (str(path),), tmp_path / f"write-{k}.log")
        wait_for(lambda b=before: file_version(path) not in (None, b), proc=proc,
                 what="a write")
        time.sleep(rng.uniform(0.0, 0.05))
        proc.kill()
        proc.wait()
        last = load_checkpoint(path)
        best = load_checkpoint(tmp_path / "last.pt.best")
        i = last.data["i"]
        assert torch.equal(last.model["w"], torch.full((500_000,), float(i)))  # whole
        assert best.data["i"] in (i, i + 1)  # best first: never behind last
    figures.count("kill9_checkpoint_writes", WRITE_KILLS)
    figures.count("kill9_checkpoint_temporaries_left", len(list(tmp_path.glob(".*.tmp"))))


def prepare_forever(text_a: str, text_b: str, out: str) -> None:
    from scratchgpt.data.prepare import prepare_text

    while True:
        for text in (text_a, text_b):
            prepare_text(text, out, "char", source="kill", overwrite=True)


def test_prepare_survives_kill_9(tmp_path, figures):
    """Each dataset on disk is wholly one text's or the other's, never a mix."""
    from scratchgpt.data.dataset import TokenDataset

    rng = random.Random(SEED + 2)
    texts = {play_text(400_000, seed=s) for s in (1, 2)}
    a, b = sorted(texts)
    out = tmp_path / "data"
    for k in range(PREPARE_KILLS):
        proc = start_call(prepare_forever, (a, b, str(out)), tmp_path / f"prep-{k}.log")
        wait_for((out / "meta.json").exists, proc=proc, what="a dataset")
        time.sleep(rng.uniform(0.0, 0.6))
        proc.kill()
        proc.wait()
        data = TokenDataset(out)
        text = a if data.tokenizer().decode(data.splits["train"][:2000].tolist()) == \
            a[:2000] else b
        assert data.tokenizer().decode(data.splits["val"].tolist()) == text[-len(
            data.splits["val"]):]
    from scratchgpt.data.prepare import prepare_text

    prepare_text(a, out, "char", overwrite=True)  # and the next prepare cleans up
    assert not list(tmp_path.glob(".data.*"))
    figures.count("kill9_prepare", PREPARE_KILLS)


def test_an_overwrite_killed_at_any_moment_keeps_the_old_run_or_the_new_one(
        tiny_data, tmp_path, figures):
    rng = random.Random(SEED + 3)
    run = tmp_path / "run"
    assert main(["train", "--dataset", str(tiny_data), "--out", str(run), "--max-iters", "4",
                 "--eval-interval", "2", *TINY]) == 0
    old = snapshot(run)
    old_id = load_checkpoint(run / "last.pt").run_id
    kept = replaced = 0
    for k in range(OVERWRITE_KILLS):
        before = file_version(run / "last.pt")
        proc = start_cli(["train", "--dataset", tiny_data, "--out", run, "--overwrite",
                          "--max-iters", "1000000", "--eval-interval", "1", *TINY[:-2],
                          "--n-embd", "32"], tmp_path / f"over-{k}.log")
        if k % 2:  # half the kills after the new run's first checkpoint, half before
            wait_for(lambda b=before: file_version(run / "last.pt") not in (None, b),
                     proc=proc, what="the new run's checkpoint")
            time.sleep(rng.uniform(0.0, 0.2))
        else:
            time.sleep(rng.uniform(0.05, 1.0))
        proc.kill()
        proc.wait()
        with RunDir(run).lock() as rd:
            rd.begin("resume")  # what the next start does first: recover the overwrite
        if load_checkpoint(run / "last.pt").run_id == old_id:
            assert snapshot(run) == old
            kept += 1
        else:
            check_run(run)
            replaced += 1
            assert main(["train", "--dataset", str(tiny_data), "--out", str(run),
                         "--overwrite", "--max-iters", "4", "--eval-interval", "2",
                         *TINY]) == 0  # (the old run again, for the next kill)
            old, old_id = snapshot(run), load_checkpoint(run / "last.pt").run_id
    figures.count("kill9_overwrite", OVERWRITE_KILLS)
    figures.notes["kill9_overwrite_outcomes"] = {"old_run_kept": kept,
                                                 "new_run_stood": replaced}
    assert kept + replaced == OVERWRITE_KILLS and replaced >= OVERWRITE_KILLS // 2


@pytest.fixture(autouse=True)
def _sanity(tmp_path):
    yield
    assert not list(tmp_path.glob("**/.replaced"))  # no overwrite left half done
