"""The loss at each position of the window: the exact val loss taken apart by context length."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from scratchgpt.data.dataset import TokenDataset
from scratchgpt.errors import ConfigError
from scratchgpt.models.gpt import GPT, GPTConfig
from scratchgpt.training.task import eval_batch_size, full_split_loss, loss_by_position


def _model(vocab: int, block: int) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=vocab, block_size=block, n_layer=1, n_head=2, n_embd=16))


def test_each_position_is_the_loss_of_a_model_that_saw_only_that_much(small_dataset):
    data = TokenDataset(small_dataset)
    block = 12
    model = _model(data.vocab_size, block).eval()
    _, curve = loss_by_position(model, data, "val", block, torch.device("cpu"), batch_size=7)
    batches = list(data.sequential_batches("val", 7, block))
    x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])  # (N, T)
    assert curve.shape == (block,) and curve.dtype == torch.float64
    with torch.no_grad():
        for t in (0, 1, 5, block - 1):  # only the first t + 1 tokens as input
            logits = model(x[:, :t + 1])[:, -1].float()
            want = F.cross_entropy(logits, y[:, t]).item()
            assert abs(curve[t].item() - want) < 1e-5, t


def test_its_mean_is_the_full_split_loss(small_dataset):
    data = TokenDataset(small_dataset)
    model = _model(data.vocab_size, 16)
    loss, curve = loss_by_position(model, data, "val", 16, torch.device("cpu"))
    total, count = 0.0, 0  # the whole split the plain way: one mean per batch, weighted
    batch = eval_batch_size(16, torch.device("cpu"))  # the batches it makes by default
    with torch.no_grad():
        for x, y in data.sequential_batches("val", batch, 16):
            logits = model(x)
            total += F.cross_entropy(logits.flatten(0, 1), y.flatten()).item() * y.numel()
            count += y.numel()
    assert abs(curve.mean().item() - total / count) < 1e-6
    assert full_split_loss(model, data, "val", 16, torch.device("cpu")) == total / count == loss
    assert model.training  # the mode it was in is restored


def test_the_loss_does_not_depend_on_how_the_windows_are_batched(small_dataset):
    data = TokenDataset(small_dataset)
    model = _model(data.vocab_size, 8)
    cpu = torch.device("cpu")
    n = (len(data.splits["val"]) - 1) // 8
    assert n > eval_batch_size(8, cpu)  # so that the default batch is not the whole split
    losses = [full_split_loss(model, data, "val", 8, cpu, batch_size=b)
              for b in (1, 3, 64, n, None)]
    assert max(losses) - min(losses) < 1e-6, losses


def test_a_cpu_batch_is_a_few_thousand_tokens_an_accelerator_batch_64_windows():
    cpu = torch.device("cpu")
    assert [eval_batch_size(b, cpu) for b in (64, 256, 1024, 4096)] == [32, 8, 2, 1]
    assert eval_batch_size(64, torch.device("meta")) == 64


def test_the_window_and_device_default_to_the_models_own(small_dataset):
    """A caller from Python had to repeat the model's block size and device, which the model
    already knows; a shorter window is still a choice (and gives another loss)."""
    data = TokenDataset(small_dataset)
    model = _model(data.vocab_size, 16)
    cpu = torch.device("cpu")
    assert full_split_loss(model, data, "val") == full_split_loss(model, data, "val", 16, cpu)
    assert full_split_loss(model, data, "val", 4) != full_split_loss(model, data, "val")
    loss, curve = loss_by_position(model, data, "val")
    assert loss == full_split_loss(model, data, "val") and curve.shape == (16,)


def test_a_model_without_a_block_size_is_asked_for_one(small_dataset):
    data = TokenDataset(small_dataset)
    model = torch.nn.Sequential(torch.nn.Embedding(data.vocab_size, data.vocab_size))
    with pytest.raises(ConfigError, match="Sequential has no config.block_size: pass block_size"):
        full_split_loss(model, data, "val")
    assert full_split_loss(model, data, "val", 8) > 0  # given one, it evaluates
