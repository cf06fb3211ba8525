import csv
import math

import pytest
import torch

from scratchgpt.data.dataset import TokenDataset
from scratchgpt.errors import ScratchGPTError
from scratchgpt.training.config import TrainConfig, parse_duration
from scratchgpt.training.optim import lr_at
from scratchgpt.training.trainer import train

MODEL = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, dropout=0.1)


def cfg(**kw) -> TrainConfig:
    base = dict(batch_size=8, max_iters=40, eval_interval=20, eval_iters=4, log_interval=5,
                learning_rate=3e-3, warmup_iters=5, dtype="fp32")
    base.update(kw)
    return TrainConfig(**base)


def test_training_lowers_val_loss_and_writes_run_files(small_dataset, tmp_path):
    data = TokenDataset(small_dataset)
    res = train(cfg(max_iters=80), MODEL, data, tmp_path / "run", progress=False)
    uniform = math.log(data.meta["vocab_size"])  # the loss of a uniform guess
    assert res.val_loss < uniform - 0.75, (res.val_loss, uniform)
    for f in ("last.pt", "best.pt", "config.json", "metrics.csv", "loss.png", "tokenizer.json"):
        assert (tmp_path / "run" / f).is_file(), f
    rows = list(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))
    vals = [float(r["val_loss"]) for r in rows if r["val_loss"]]
    assert vals[-1] < vals[0]


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_resume_gives_the_same_result_as_an_uninterrupted_run(small_dataset, tmp_path, optimizer):
    data = TokenDataset(small_dataset)
    # The same schedule (decay over 40 updates) in both; the second run stops at 20 and resumes.
    # The resumed call does not repeat --optimizer: the run's own optimizer is kept.
    full = train(cfg(max_iters=40, lr_decay_iters=40, optimizer=optimizer), MODEL, data,
                 tmp_path / "a", progress=False)
    train(cfg(max_iters=20, lr_decay_iters=40, optimizer=optimizer), MODEL, data, tmp_path / "b",
          progress=False)
    resumed = train(cfg(max_iters=40, lr_decay_iters=40), MODEL, data, tmp_path / "b",
                    resume=True, progress=False)
    assert resumed.step == 40
    assert resumed.val_loss == pytest.approx(full.val_loss, abs=1e-6)
    a = torch.load(tmp_path / "a" / "last.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "b" / "last.pt", weights_only=True)["model"]
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_ctrl_c_saves_last_checkpoint_and_keeps_previous_good(small_dataset, tmp_path,
                                                              monkeypatch):
    data = TokenDataset(small_dataset)
    real = data.get_batch
    calls = {"n": 0, "gen": None}

    def interrupting(split, batch_size, block_size, generator, **kw):
        calls["gen"] = calls["gen"] or generator  # the first caller is the training loop
        calls["n"] += generator is calls["gen"]
        if calls["n"] == 30:
            raise KeyboardInterrupt
        return real(split, batch_size, block_size, generator, **kw)

    monkeypatch.setattr(data, "get_batch", interrupting)
    res = train(cfg(), MODEL, data, tmp_path / "run", progress=False)
    assert res.interrupted and res.step == 29
    state = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    assert state["step"] == 29
    assert torch.load(tmp_path / "run" / "best.pt", weights_only=True)["step"] == 20
    monkeypatch.setattr(data, "get_batch", real)
    done = train(cfg(), MODEL, data, tmp_path / "run", resume=True, progress=False)
    assert done.step == 40 and not done.interrupted


def test_time_budget_ends_cleanly(small_dataset, tmp_path):
    data = TokenDataset(small_dataset)
    res = train(cfg(max_iters=100_000, time_budget="2s"), MODEL, data, tmp_path / "r",
                progress=False)
    assert 2.0 <= res.elapsed_s < 10 and res.step < 100_000
    assert (tmp_path / "r" / "last.pt").is_file() and res.val_loss == res.val_loss  # not NaN


def test_refuses_to_overwrite_another_run(small_dataset, tmp_path):
    data = TokenDataset(small_dataset)
    train(cfg(max_iters=2, eval_interval=1), MODEL, data, tmp_path / "r", progress=False)
    with pytest.raises(ScratchGPTError, match="already holds a run"):
        train(cfg(max_iters=2), MODEL, data, tmp_path / "r", progress=False)
    res = train(cfg(max_iters=2), MODEL, data, tmp_path / "r", overwrite=True, progress=False)
    assert res.step == 2


def test_lr_schedule_warmup_then_cosine():
    lrs = [lr_at(s, 10, 1.0, 0.1, s / 100) for s in range(101)]
    assert lrs[0] < lrs[5] < lrs[9] <= 1.0
    assert lrs[10] == pytest.approx(1.0 - 0.9 * (1 - torch.cos(torch.tensor(0.1 * 3.14159265)))
                                    .item() / 2, rel=1e-3)
    assert lrs[100] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:], strict=False))


@pytest.mark.parametrize("text,seconds", [("90s", 90), ("10m", 600), ("1.5h", 5400), ("45", 45)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", [dict(batch_size=0), dict(learning_rate=-1),
                                 dict(min_lr=1.0, learning_rate=0.1), dict(dtype="fp8"),
                                 dict(time_budget="soon"), dict(optimizer="sgd"),
                                 dict(muon_lr_scale=0.0)])
def test_invalid_train_config(bad):
    with pytest.raises(ScratchGPTError):
        TrainConfig(**bad)
