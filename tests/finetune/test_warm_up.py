"""The untimed warm-up step a budgeted fine-tuning run takes before its clock starts (one
forward and backward on the task's ``warm_up_batch``): exact, so the run is bit for bit the
run without it."""

from __future__ import annotations

import random

import pytest

from scratchgpt.finetune.classify import ClassifyData, ClassifyTask
from scratchgpt.finetune.instruct import InstructData, InstructTask
from tests.finetune.conftest import classify_run, run_cli
from tests.training.test_budget_end import (
    assert_warm_up_batch_draws_nothing,
    assert_warm_up_is_exact,
)


def _texts(n: int) -> list[tuple[list[int], int]]:
    rng = random.Random(1)
    return [([rng.randrange(1, 40) for _ in range(rng.randint(2, 9))], i % 2) for i in range(n)]


def _conversations(n: int) -> list[tuple[list[int], list[bool]]]:
    rng = random.Random(2)
    out = []
    for _ in range(n):
        prompt, answer = rng.randint(2, 8), rng.randint(1, 5)
        out.append(([rng.randrange(1, 40) for _ in range(prompt + answer)],
                    [False] * prompt + [True] * answer))
    return out


@pytest.mark.parametrize("task", ["classify", "instruct"])
def test_the_warm_up_batch_draws_nothing(task):
    def make():
        if task == "classify":
            return ClassifyTask(ClassifyData(["a", "b"], {"train": _texts(30), "val": [],
                                                          "test": []}, {}), tokenizer=None)
        return InstructTask(InstructData(_conversations(30), [], [], {}), tokenizer=None)

    assert_warm_up_batch_draws_nothing(make, rows=8)


@pytest.mark.parametrize("task", ["classify", "instruct"])
def test_a_finetune_runs_warm_up_changes_nothing_it_computes(ft_dir, tmp_path, capsys,
                                                             monkeypatch, task):
    """finetune --time-budget paid its first step's one-off set-up inside the budget: its
    tasks had no warm-up batch, so the trainer skipped them. Their warm-up (dropout on, so
    the random state counts) leaves the run bit for bit as it was."""
    def train(out):
        if task == "classify":
            args = classify_run(ft_dir, out, "--max-iters", "4", "--dropout", "0.1")
        else:
            args = ["finetune", "--task", "instruct", "--init-from", ft_dir / "base", "--data",
                    ft_dir / "inst.json", "--out", out, "--max-iters", "4", "--batch-size",
                    "4", "--eval-iters", "1", "--dropout", "0.1", "--no-progress"]
        code, _, err = run_cli(args, capsys)
        assert code == 0, err

    assert_warm_up_is_exact(train, ClassifyTask if task == "classify" else InstructTask,
                            tmp_path, monkeypatch)
