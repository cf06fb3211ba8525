"""A resumed run's learning-rate schedule keeps the length it had: a run given more updates
than its schedule runs over trains on at its final rate, rather than climbing back up a
schedule stretched to the new --max-iters."""

from __future__ import annotations

import csv

import pytest

from scratchgpt.checkpoints import load_checkpoint
from scratchgpt.cli import main
from scratchgpt.training.optim import lr_at

LR, MIN_LR = 1e-3, 1e-4
TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
        "--batch-size", "4", "--eval-iters", "1", "--eval-interval", "100", "--log-interval",
        "1", "--warmup-iters", "2", "--lr", str(LR), "--min-lr", str(MIN_LR), "--no-progress",
        "--dtype", "fp32", "--threads", "1"]


def _rates(run) -> dict[int, float]:
    """The learning rate metrics.csv logged at each update."""
    with (run / "metrics.csv").open() as f:
        return {int(r["step"]): float(r["lr"]) for r in csv.DictReader(f) if r["lr"]}


def _assert_on_schedule(rates: dict[int, float], steps: range, length: int) -> None:
    """Each of ``steps`` ran at the rate of a schedule ``length`` updates long (update
    ``step`` runs at the rate of the step count before it)."""
    for step in steps:
        assert rates[step] == pytest.approx(lr_at(step - 1, 2, LR, MIN_LR, (step - 1) / length),
                                            rel=1e-3)


def _train(*args: str) -> None:
    assert main(["train", *args, *TINY]) == 0


def test_a_finished_run_given_more_updates_trains_on_at_its_final_rate(small_dataset,
                                                                       tmp_path, capsys):
    run = tmp_path / "run"
    _train("--dataset", str(small_dataset), "--out", str(run), "--max-iters", "10")
    before = _rates(run)
    capsys.readouterr()
    _train("--out", str(run), "--resume", "--max-iters", "16")
    out = capsys.readouterr().out
    assert "schedule ends at update 10: its updates after that to --max-iters 16 train at " \
           f"--min-lr {MIN_LR}" in out, out
    rates = _rates(run)
    assert {s: rates[s] for s in before} == before
    assert [rates[s] for s in range(11, 17)] == [MIN_LR] * 6
    assert load_checkpoint(run / "last.pt").train_config.lr_decay_iters == 10
    _train("--out", str(run), "--resume", "--max-iters", "18")  # the length stays recorded
    assert [_rates(run)[s] for s in (17, 18)] == [MIN_LR] * 2


def test_a_decay_length_given_on_resume_is_the_schedules(small_dataset, tmp_path, capsys):
    """--lr-decay-iters on resume sets the length, the rate at each update then the one a
    run started with it has."""
    run = tmp_path / "run"
    _train("--dataset", str(small_dataset), "--out", str(run), "--max-iters", "10")
    capsys.readouterr()
    _train("--out", str(run), "--resume", "--max-iters", "16", "--lr-decay-iters", "16")
    assert "schedule ends" not in capsys.readouterr().out
    rates = _rates(run)
    _assert_on_schedule(rates, range(11, 17), 16)
    assert rates[11] > 2 * MIN_LR  # back up the longer schedule, as asked


def test_a_run_its_budget_ended_trains_on_at_its_final_rate(small_dataset, tmp_path,
                                                            capsys):
    """A run its spent --time-budget ended (the budget brought the rate down to --min-lr by
    then), resumed with a larger --max-iters, goes on at --min-lr."""
    run = tmp_path / "run"
    _train("--dataset", str(small_dataset), "--out", str(run), "--max-iters", "1000000",
           "--time-budget", "0.5s")
    step = load_checkpoint(run / "last.pt").state.step
    assert step > 2  # (past its warmup)
    _train("--out", str(run), "--resume", "--max-iters", str(step + 3))
    rates = _rates(run)
    assert [rates[s] for s in range(step + 1, step + 4)] == [MIN_LR] * 3


def test_a_run_resumed_to_end_before_its_schedule_does_says_so(small_dataset, tmp_path,
                                                                capsys):
    """A resumed run whose --max-iters comes before its schedule's end keeps the schedule
    (its rate is not squeezed down to --min-lr) and is told it stops short of it."""
    run = tmp_path / "run"
    _train("--dataset", str(small_dataset), "--out", str(run), "--max-iters", "4",
           "--lr-decay-iters", "12")
    capsys.readouterr()
    _train("--out", str(run), "--resume", "--max-iters", "8")
    out = capsys.readouterr().out
    assert "schedule ends at update 12, after --max-iters 8: the run ends before its rate " \
           f"reaches --min-lr {MIN_LR}" in out, out
    rates = _rates(run)
    _assert_on_schedule(rates, range(5, 9), 12)
    assert rates[8] > 2 * MIN_LR
