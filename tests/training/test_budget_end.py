"""What a run does once its time budget is spent: it says so, and what its final evaluation
goes through, before that evaluation (which reads the whole split, minutes on a large one)."""

import json
import re

import pytest
import torch

from scratchgpt.checkpoints import load_checkpoint
from scratchgpt.training.task import LanguageModelTask

BLOCK = 16
TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", str(BLOCK),
        "--batch-size", "4", "--eval-iters", "1"]
SAID = re.compile(r"^--time-budget 0\.3s spent at step (\d+); evaluating the full validation "
                  r"split \(([\d,]+) windows, ([\d,]+) tokens\)\.\.\.$", re.M)


def _output_at_final_evaluation(monkeypatch, capsys) -> list:
    """The output (out, err) printed by the time each final evaluation begins."""
    seen = []
    real = LanguageModelTask.final_metrics

    def final_metrics(self, *args, **kwargs):
        seen.append(capsys.readouterr())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(LanguageModelTask, "final_metrics", final_metrics)
    return seen


@pytest.mark.parametrize("progress", [["--no-progress"], []])
def test_a_run_its_budget_ended_says_what_it_evaluates_before_evaluating(
        small_dataset, tmp_path, cli_main, capsys, monkeypatch, progress):
    """Under --no-progress a budgeted run printed nothing from its budget's end to the end of
    its final evaluation over the whole validation split, as if it hung. It says, in either
    progress mode, at which step the budget ran out and how many windows and tokens it
    evaluates: as many as 'scratchgpt eval' reports for the split."""
    seen = _output_at_final_evaluation(monkeypatch, capsys)
    run = tmp_path / "r"
    assert cli_main(["train", "--dataset", str(small_dataset), *TINY, "--max-iters", "1000000",
                     "--time-budget", "0.3s", "--out", str(run), *progress]) == 0
    after = capsys.readouterr()
    assert len(seen) == 1
    said = SAID.findall(seen[0].err)
    assert len(said) == 1, seen[0].err  # before the evaluation began
    assert "done:" not in seen[0].out and "done:" in after.out
    assert not SAID.search(after.err)  # said once
    step, windows, tokens = (int(n.replace(",", "")) for n in said[0])
    assert step == load_checkpoint(run / "last.pt").state.step
    assert cli_main(["eval", "--checkpoint", str(run), "--which", "last", "--split", "val",
                     "--json"]) == 0
    evaluated = json.loads(capsys.readouterr().out)["val_tokens"]
    assert tokens == evaluated == windows * BLOCK and windows > 1


def test_a_run_its_iterations_ended_says_nothing_more(small_dataset, tmp_path, cli_main,
                                                      capsys, monkeypatch):
    """The line is a budget's: a run that reached its --max-iters (a budget not spent
    beside it) ends as it did."""
    seen = _output_at_final_evaluation(monkeypatch, capsys)
    assert cli_main(["train", "--dataset", str(small_dataset), *TINY, "--max-iters", "3",
                     "--time-budget", "1h", "--out", str(tmp_path / "r"),
                     "--no-progress"]) == 0
    assert len(seen) == 1 and "spent at step" not in seen[0].err + capsys.readouterr().err


def test_the_python_api_names_its_keyword(small_dataset, tmp_path, capsys):
    """train() from Python says it too, naming the keyword it was given."""
    from scratchgpt.data.dataset import TokenDataset
    from scratchgpt.models import model_config
    from scratchgpt.training.config import TrainConfig
    from scratchgpt.training.job import train

    data = TokenDataset(small_dataset)
    config = model_config("gpt", vocab_size=data.vocab_size, n_layer=1, n_head=2, n_embd=16,
                          block_size=BLOCK)
    res = train(TrainConfig(batch_size=4, eval_iters=1, max_iters=1_000_000, time_budget="0.3s",
                            dtype="fp32"), config, data, tmp_path / "r", progress=False)
    windows = data.window_count("val", BLOCK)
    assert (f"time_budget='0.3s' spent at step {res.step}; evaluating the full validation split "
            f"({windows:,} windows, {windows * BLOCK:,} tokens)...") in (
        capsys.readouterr().err.splitlines())


def _tiny_train(data, out, **kw):
    from scratchgpt.models import model_config
    from scratchgpt.training.config import TrainConfig
    from scratchgpt.training.job import train

    config = model_config("gpt", vocab_size=data.vocab_size, n_layer=1, n_head=2, n_embd=16,
                          block_size=BLOCK, dropout=0.1)
    return train(TrainConfig(**{**dict(batch_size=4, eval_iters=1, dtype="fp32"), **kw}),
                 config, data, out, progress=False)


def test_a_first_forward_set_up_is_not_counted_against_the_budget(small_dataset, tmp_path,
                                                                   monkeypatch):
    """What a process's first step does once (on a new machine, building the C kernels:
    seconds) is done before the budget's clock starts: a 3 s budget was spent on step 1
    alone. Here the model's first forward takes 2 s, the budget is 0.3 s."""
    import time

    from scratchgpt.data.dataset import TokenDataset
    from scratchgpt.models.gpt import GPT

    slow, real = [2.0], GPT.forward

    def forward(self, *args, **kwargs):
        while slow:
            time.sleep(slow.pop())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(GPT, "forward", forward)
    res = _tiny_train(TokenDataset(small_dataset), tmp_path / "r", max_iters=1_000_000,
                      time_budget="0.3s")
    assert not slow  # the slow forward ran
    assert 0.3 <= res.elapsed_s < 2.0 and res.step > 1


@pytest.mark.parametrize("windows", ["random", "epoch"])
def test_the_untimed_first_step_changes_nothing_a_run_computes(small_dataset, tmp_path,
                                                               monkeypatch, windows):
    """The warm-up's forward and backward leave the weights, the random state (dropout),
    the batch stream and the epoch's order as they were: the run is bit for bit the run
    without it."""
    from scratchgpt.checkpoints import load_checkpoint
    from scratchgpt.data.dataset import TokenDataset
    from scratchgpt.training.trainer import Trainer

    data = TokenDataset(small_dataset)
    _tiny_train(data, tmp_path / "warm", max_iters=6, windows=windows)
    monkeypatch.setattr(Trainer, "_warm_up", lambda self: None)
    _tiny_train(data, tmp_path / "cold", max_iters=6, windows=windows)
    warm, cold = (load_checkpoint(tmp_path / name / "last.pt").model for name in ("warm", "cold"))
    assert all(torch.equal(warm[k], cold[k]) for k in warm)


def test_a_run_well_past_its_budget_says_by_how_much_and_why(small_dataset, tmp_path,
                                                             monkeypatch, capsys):
    """The budget is checked between steps: a step of seconds (a busy machine's) ends a run
    well past it, which the run said nothing of but "done: 1 step in 2.1s". It says how far
    past, and how long the step took."""
    import time

    from scratchgpt.data.dataset import TokenDataset
    from scratchgpt.models.gpt import GPT

    calls, real = [], GPT.forward

    def forward(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # step 1's (the first is the untimed warm-up's)
            time.sleep(1.6)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(GPT, "forward", forward)
    res = _tiny_train(TokenDataset(small_dataset), tmp_path / "r", max_iters=1_000_000,
                      time_budget="0.5s")
    said = re.search(r"^time_budget='0\.5s' spent at step 1, (\d+\.\d) s past it \(it is "
                     r"checked between steps, and step 1 took (\d+\.\d) s\); evaluating ",
                     capsys.readouterr().err, re.M)
    assert res.step == 1 and said, res.step
    past, took = float(said[1]), float(said[2])
    assert past == pytest.approx(res.elapsed_s - 0.5, abs=0.06)
    assert 1.6 <= took <= res.elapsed_s + 0.05


def test_a_run_its_budget_ended_inside_its_warmup_says_so(small_dataset, tmp_path, capsys):
    """As a run whose --max-iters is not above its --warmup-iters says before it starts, one
    its budget ended inside the warmup says so: its rate only rose, and never decayed (a 3 s
    run of cpu-small, warming up over 100 updates, ended at step 26 with nothing said). One
    past its warmup says nothing of it."""
    from scratchgpt.data.dataset import TokenDataset

    data = TokenDataset(small_dataset)
    res = _tiny_train(data, tmp_path / "r", max_iters=1_000_000, warmup_iters=100_000,
                      time_budget="0.3s")
    assert (f"note: the run ended inside its warmup, at step {res.step} of "
            f"warmup_iters=100000: the learning rate rose to {res.step / 100_001:.0%} of "
            "learning_rate=0.001 and the cosine schedule never started; give a longer "
            "time_budget or a smaller warmup_iters") in capsys.readouterr().err.splitlines()
    _tiny_train(data, tmp_path / "past", max_iters=1_000_000, warmup_iters=0,
                time_budget="0.3s")
    err = capsys.readouterr().err
    assert "spent at step" in err and "warmup" not in err


def assert_warm_up_is_exact(train, task_class, tmp_path, monkeypatch) -> None:
    """``train(out)``, a run of a task of ``task_class``, does the trainer's untimed warm-up
    on the task's ``warm_up_batch`` (asked once) and ends at the weights bit for bit of the
    same run without it (for the tasks that do not train through ``_tiny_train``)."""
    from scratchgpt.checkpoints import load_checkpoint
    from scratchgpt.training.trainer import Trainer

    asked, real = [], task_class.warm_up_batch

    def warm_up_batch(self, *args):
        asked.append(args)
        return real(self, *args)

    monkeypatch.setattr(task_class, "warm_up_batch", warm_up_batch)
    train(tmp_path / "warm")
    assert len(asked) == 1
    with monkeypatch.context() as cold:
        cold.setattr(Trainer, "_warm_up", lambda self: None)
        train(tmp_path / "cold")
    assert len(asked) == 1
    warm, cold_ = (load_checkpoint(tmp_path / name / "last.pt").model for name in ("warm", "cold"))
    assert warm.keys() == cold_.keys() and all(torch.equal(warm[k], cold_[k]) for k in warm)


def assert_warm_up_batch_draws_nothing(make_task, rows: int) -> None:
    """A task from ``make_task()`` gives a warm-up batch of the training batches' rows that
    draws no random number and moves no epoch: the batches drawn after it are those a twin
    task that made none draws, and the global random state is as it was."""
    warm, cold = make_task(), make_task()
    gens = [torch.Generator().manual_seed(3) for _ in range(2)]
    first = warm.train_batch(rows, gens[0])
    assert all(torch.equal(a, b) for a, b in zip(first, cold.train_batch(rows, gens[1]),
                                                 strict=True))
    rng = torch.get_rng_state()
    batch = warm.warm_up_batch(rows)
    assert torch.equal(torch.get_rng_state(), rng)
    assert [t.size(0) for t in batch] == [t.size(0) for t in first]
    for _ in range(5):  # into the next epoch
        assert all(torch.equal(a, b) for a, b in zip(warm.train_batch(rows, gens[0]),
                                                     cold.train_batch(rows, gens[1]),
                                                     strict=True))
