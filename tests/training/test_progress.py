"""The training progress bar: what it writes where stderr is a log file, not a terminal."""

import io
import sys

import pytest

from scratchgpt.training.progress import Progress


@pytest.mark.parametrize("budget", [None, 90.0])
def test_a_log_file_gets_a_few_redraws_not_one_per_step(capsys, budget):
    bar = Progress(True, total_steps=1000, step=0, budget_s=budget, elapsed_s=0.0)
    for step in range(1, 1001):  # a thousand steps within the first redraw interval
        bar.update(step, loss=2.0, tokens_per_s=1e4, elapsed_s=step * 0.005)
    bar.close()
    err = capsys.readouterr().err
    assert 1 <= err.count("\r") <= 5, err[-300:]
    # the last drawing shows where training ended: step 1000, 5 s into a budget
    assert "step=1000" in err.split("\r")[-1]
    if budget:
        assert " 5/90s" in err.split("\r")[-1]


@pytest.mark.parametrize("step, elapsed", [(1000, 1.0), (10, 90.0)])
def test_a_run_with_nothing_left_to_train_draws_no_bar(capsys, step, elapsed):
    """A finished run resumed (at its last step, or past its budget) trains nothing: its
    bar would be a full one drawn twice under the note that says so."""
    bar = Progress(True, total_steps=1000, step=step, budget_s=90.0 if elapsed >= 90 else None,
                   elapsed_s=elapsed)
    bar.close()
    assert capsys.readouterr().err == ""
    Progress(True, total_steps=1000, step=999, budget_s=None, elapsed_s=1.0).close()
    assert "999/1000" in capsys.readouterr().err  # one step left: drawn



def _tiny_run(dataset, out, progress: bool, **train: object):
    """A one-layer GPT trained from Python on ``dataset`` into ``out`` (fp32, no warmup, no
    periodic evaluation) with the TrainConfig fields ``train``."""
    from scratchgpt.data.dataset import TokenDataset
    from scratchgpt.models import model_config
    from scratchgpt.training.config import TrainConfig
    from scratchgpt.training.job import train as train_run

    data = TokenDataset(dataset)
    config = model_config("gpt", vocab_size=data.vocab_size, n_layer=1, n_head=2, n_embd=16,
                          block_size=32)
    cfg = TrainConfig(batch_size=4, eval_interval=100, warmup_iters=0, dtype="fp32", **train)
    return train_run(cfg, config, data, out, progress=progress)


class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("terminal, progress", [(True, True), (False, True), (True, False)])
def test_the_final_evaluation_shows_a_bar_on_a_terminal_only(small_dataset, tmp_path,
                                                             monkeypatch, terminal, progress):
    """The exact pass over the whole validation split after the last step shows a bar where
    the run's progress is drawn on a terminal (it sat silent for minutes on a larger model);
    a log file or --no-progress gets none; the loss is the one the split gives either way."""
    from scratchgpt import bars
    from scratchgpt.checkpoints import load_model
    from scratchgpt.data.dataset import TokenDataset
    from scratchgpt.training.task import full_split_loss

    monkeypatch.setattr(bars, "PROGRESS_DELAY_S", 0.0)  # drawn however short the pass
    err = _Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    res = _tiny_run(small_dataset, tmp_path / "run", progress, max_iters=3, eval_iters=2,
                    learning_rate=1e-3)
    data = TokenDataset(small_dataset)
    bar = [line for line in err.getvalue().split("\r") if line.startswith("val split")]
    assert bool(bar) == (terminal and progress), err.getvalue()[-500:]
    if bar:
        assert "100%" in bar[-1]  # drawn to the end of the split
    model, _ = load_model(tmp_path / "run" / "last.pt")
    assert res.val_loss == full_split_loss(model, data, "val")


@pytest.mark.parametrize("load, terminal, threads, said", [
    (9.0, True, 0, True),     # busy, at a terminal, threads left to torch: said
    (0.5, True, 0, False),    # a calm machine: nothing to say
    (9.0, False, 0, False),   # a log: no one to act on it
    (9.0, True, 1, False),    # threads chosen: the user has decided
])
def test_a_busy_machine_is_named_before_a_run_on_several_threads(small_dataset, tmp_path,
                                                                 monkeypatch, load, terminal,
                                                                 threads, said):
    """Two threads that wait on each other on a machine other work keeps busy can make each
    step several times slower than one thread: a run about to train so says it, once."""
    import os

    import torch

    from scratchgpt import cpu

    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(cpu, "cores", lambda: 2)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    err = _Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    _tiny_run(small_dataset, tmp_path / "run", True, max_iters=2, eval_iters=1, threads=threads)
    notes = [line for line in err.getvalue().splitlines() if "machine is busy" in line]
    assert len(notes) == int(said), err.getvalue()[-500:]
    if said:
        assert notes[0].startswith(f"note: this machine is busy (load average {load:.1f} on "
                                   "2 cores): the run's 2 threads wait on each other")
        assert notes[0].endswith("threads=1 may train faster here")  # (the API's keyword)
