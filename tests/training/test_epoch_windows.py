"""Training windows epoch by epoch (``--windows epoch``): every window of a random phase once
per epoch, shards that split one global batch, and a stream that resumes exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from scratchgpt.checkpoints import load_checkpoint
from scratchgpt.data.dataset import TokenDataset
from scratchgpt.data.prepare import prepare_text
from scratchgpt.errors import ConfigError
from scratchgpt.models import model_config
from scratchgpt.training.config import TrainConfig
from scratchgpt.training.epochs import EpochWindows
from scratchgpt.training.job import train
from tests.corpus import play_text


def draw(windows: EpochWindows, batches: int, batch_size: int, generator: torch.Generator,
         shard: tuple[int, int] = (0, 1)) -> list[int]:
    return [int(s) for _ in range(batches) for s in windows.next(batch_size, generator, shard)]


@pytest.mark.parametrize("n_tokens, block", [(1000, 16), (1007, 16), (40, 16), (17, 16)])
def test_each_epoch_takes_every_window_of_its_phase_once(n_tokens, block):
    w = EpochWindows(n_tokens, block)
    gen = torch.Generator().manual_seed(3)
    n = w.per_epoch
    starts = draw(w, 3 * n, 1, gen)  # batches of one: epochs end exactly between batches
    assert n >= 1 and all(0 <= s and s + block + 1 <= n_tokens for s in starts)
    epochs = [starts[i:i + n] for i in range(0, 3 * n, n)]
    for epoch in epochs:
        phases = {s % block for s in epoch}
        assert len(phases) == 1  # one phase an epoch ...
        assert sorted(s // block for s in epoch) == list(range(n))  # ... every window once
    if n > 2:  # a new order each epoch
        assert len({tuple(e) for e in epochs}) == 3


def test_a_batch_runs_on_into_the_next_epoch():
    w = EpochWindows(1000, 16)  # 61 windows an epoch
    gen = torch.Generator().manual_seed(0)
    starts = draw(w, 9, 7, gen)  # 63 windows: the ninth batch straddles two epochs
    first, second = starts[:61], starts[61:]
    assert sorted(s // 16 for s in first) == list(range(61))
    assert len(second) == 2 and len(set(starts)) >= 62


def test_shards_split_one_global_batch():
    whole = draw(EpochWindows(1000, 16), 20, 6, torch.Generator().manual_seed(1))
    ranks = []
    for rank in range(2):  # each process: its own sampler and the same seeded generator
        ranks.append(draw(EpochWindows(1000, 16), 20, 3, torch.Generator().manual_seed(1),
                          (rank, 2)))
    merged = [s for step in range(20) for r in ranks for s in r[3 * step:3 * step + 3]]
    assert merged == whole


@pytest.mark.parametrize("batches", [5, 12, 17])  # in the first epoch, at its end, in the next
def test_the_stream_resumes_exactly_from_its_state(batches):
    w, gen = EpochWindows(488, 8), torch.Generator().manual_seed(7)  # 60 windows an epoch
    draw(w, batches, 5, gen)
    state, gen_state = w.state_dict(), gen.get_state()
    expected = draw(w, 30, 5, gen)
    resumed, gen2 = EpochWindows(488, 8), torch.Generator()
    resumed.load_state_dict(state)
    gen2.set_state(gen_state)
    assert draw(resumed, 30, 5, gen2) == expected


def test_a_stream_shorter_than_a_window_is_refused():
    with pytest.raises(ValueError):
        EpochWindows(16, 16)


MODEL = dict(n_layer=1, n_head=2, n_embd=32, block_size=32, dropout=0.0)


def cfg(**kw) -> TrainConfig:
    base = dict(batch_size=8, max_iters=40, eval_interval=20, eval_iters=2, log_interval=5,
                learning_rate=3e-3, warmup_iters=5, dtype="fp32", windows="epoch")
    return TrainConfig(**{**base, **kw})


def test_epoch_windows_train_and_resume_exactly_across_epochs(tmp_path):
    prepare_text(play_text(3_000), tmp_path / "d", "char", source="test")
    data = TokenDataset(tmp_path / "d")  # 2,700 training tokens: 83 windows an epoch
    gpt = model_config("gpt", vocab_size=data.vocab_size, **MODEL)
    full = train(cfg(), gpt, data, tmp_path / "a", progress=False)  # 320 windows, ~4 epochs
    train(cfg(max_iters=13, lr_decay_iters=40), gpt, data, tmp_path / "b", progress=False)
    resumed = train(cfg(lr_decay_iters=40), None, data, tmp_path / "b", resume=True,
                    progress=False)
    a = load_checkpoint(tmp_path / "a" / "last.pt")
    b = load_checkpoint(tmp_path / "b" / "last.pt")
    assert resumed.step == 40 and resumed.val_loss == full.val_loss
    assert all(torch.equal(a.model[k], b.model[k]) for k in a.model)
    assert a.state.task["epoch_windows"]["pos"] == (40 * 8) % 83  # the fourth epoch, 320 in
    assert full.val_loss < math.log(data.vocab_size) - 0.5  # and it learns


def test_random_windows_stay_the_default_and_the_mode_is_checked():
    assert TrainConfig().windows == "random"
    with pytest.raises(ConfigError, match="windows"):
        TrainConfig(windows="sequential")


def test_an_epoch_covers_the_stream_random_windows_do_not():
    """What the mode is for: after one stream's worth of windows, independent random starts
    have left part of the text unseen; an epoch has seen all of it."""
    n_tokens, block = 10_000, 50
    w, gen = EpochWindows(n_tokens, block), torch.Generator().manual_seed(0)
    seen_epoch, seen_random = np.zeros(n_tokens, bool), np.zeros(n_tokens, bool)
    for s in w.next(w.per_epoch, gen):
        seen_epoch[s:s + block + 1] = True
    for s in torch.randint(n_tokens - block, (w.per_epoch,), generator=gen).tolist():
        seen_random[s:s + block + 1] = True
    assert seen_epoch[block:-block].all()
    assert seen_random.mean() < 0.75  # about 1 - 1/e of it
