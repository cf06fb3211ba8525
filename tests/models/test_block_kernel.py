"""A training block's forward and backward as one C call each (models/block_kernel.py): the
same kernels in the same order as the fused block's calls one by one, so the loss, every
gradient and whole training runs are those of the composed path bit for bit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from scratchgpt.data.dataset import random_windows
from scratchgpt.models import block_kernel, block_ops, c_kernels, tile_matmul
from scratchgpt.models.gpt import GPT, GPTConfig
from scratchgpt.training.config import TrainConfig
from scratchgpt.training.optim import make_optimizer
from scratchgpt.training.task import LanguageModelTask
from scratchgpt.training.trainer import train_step

needs_products = pytest.mark.skipif(block_kernel._load() is None or block_ops._load() is None,
                                 reason="the one-call block needs AMX or AVX512-BF16, and cc")

# each kind of block: biases or none, each activation, rotary positions (64 features, 32
# rows: the tiles' sizes)
KINDS = [dict(), dict(bias=False), dict(activation="gelu", bias=False),
         dict(activation="gelu_tanh"), dict(activation="relu"),
         dict(activation="relu2", bias=False, pos_encoding="rope"), dict(pos_encoding="rope")]


def _model(**kw) -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=40, block_size=32, n_layer=2, n_head=2, n_embd=64,
                          dropout=0.0, **kw))
    with torch.no_grad():  # every parameter off its initial value (biases and gains matter)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.train()


def _loss_and_grads(model: GPT, idx: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    with torch.autocast("cpu", torch.bfloat16):
        logits = model(idx[:, :-1])
    loss = F.cross_entropy(logits.float().flatten(0, 1), idx[:, 1:].flatten())
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def _one_calls(monkeypatch) -> list[int]:
    """Appends to the returned list at each one-call forward and backward."""
    calls: list[int] = []
    for name in ("forward", "backward"):
        real = getattr(block_kernel, name)
        monkeypatch.setattr(block_kernel, name, lambda *a, real=real: calls.append(1) or real(*a))
    return calls


@needs_products
@pytest.mark.parametrize("kw", KINDS, ids=lambda kw: "-".join(map(str, kw.values())) or "gpt2")
def test_loss_and_gradients_equal_the_calls_one_by_one(kw, monkeypatch):
    model = _model(**kw)
    idx = torch.randint(0, 40, (2, 33))
    calls = _one_calls(monkeypatch)
    loss, grads = _loss_and_grads(model, idx)
    assert len(calls) == 2 * 2  # each block's forward and backward, in one call each
    monkeypatch.setenv(block_kernel.SWITCH, "python")
    loss_ref, grads_ref = _loss_and_grads(model, idx)
    assert len(calls) == 4  # and then the kernels one by one
    assert torch.equal(loss, loss_ref)
    for (name, _), g, g_ref in zip(model.named_parameters(), grads, grads_ref, strict=True):
        assert torch.equal(g, g_ref), name


@needs_products
def test_threads_taking_over_each_others_rows_change_no_bit(monkeypatch):
    """Each kernel's threads share its rows as runs, a thread done with its own taking the last
    rows of a slower one (models/shares.h): which thread computes a row changes none of it."""
    model = _model(activation="gelu", bias=False)
    idx = torch.randint(0, 40, (8, 33))
    loss, grads = _loss_and_grads(model, idx)
    monkeypatch.setenv(c_kernels.SHARES_SWITCH, "static")
    loss_ref, grads_ref = _loss_and_grads(model, idx)
    assert torch.equal(loss, loss_ref)
    for g, g_ref in zip(grads, grads_ref, strict=True):
        assert torch.equal(g, g_ref)


def _trained(steps: int = 5) -> list[torch.Tensor]:
    """The parameters after AdamW updates of the recipe's step (bf16, clipping) on the same
    batches from the same start; two threads, as the kernels split their work."""
    model = _model(activation="gelu", bias=False)
    cfg = TrainConfig(batch_size=4, grad_clip=1.0)
    opt = make_optimizer(model, 3e-3, 0.1, (0.9, 0.99), "adamw")
    tokens = np.random.default_rng(0).integers(0, 40, 4_000).astype(np.uint16)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        train_step(model, model, opt, LanguageModelTask.loss, cfg,
                   lambda: random_windows(tokens, 4, 32, gen), torch.device("cpu"), "bf16")
    return [p.detach().clone() for p in model.parameters()]


@needs_products
def test_training_steps_end_at_the_same_weights(monkeypatch):
    calls = _one_calls(monkeypatch)
    one_call = _trained()
    assert len(calls) == 2 * 2 * 5
    monkeypatch.setenv(block_kernel.SWITCH, "python")
    for p, p_ref in zip(one_call, _trained(), strict=True):
        assert torch.equal(p, p_ref)
    assert len(calls) == 20


@needs_products
def test_used_only_where_its_products_can_run(monkeypatch):
    """Rows or features off the tiles' multiples of 32, the products or the elementwise work
    switched to PyTorch's, or the switch itself: the block runs as before, without it."""
    calls = _one_calls(monkeypatch)
    idx = torch.randint(0, 40, (3, 12))  # 33 rows
    _loss_and_grads(_model(), idx)
    assert not calls
    for switch, value in ((block_kernel.SWITCH, "python"), (block_ops.SWITCH, "torch"),
                          ("SCRATCHGPT_TILE_MATMUL", "torch")):
        monkeypatch.setenv(switch, value)
        _loss_and_grads(_model(), torch.randint(0, 40, (2, 33)))
        monkeypatch.delenv(switch)
    assert not calls
    _loss_and_grads(_model(), torch.randint(0, 40, (2, 33)))
    assert calls


@needs_products
def test_a_bf16_evaluation_runs_its_forward_alone_with_the_same_logits(monkeypatch):
    """Without gradients, under bf16 autocast, the one-call forward runs alone (nothing kept
    for a backward): the logits of the kernels called one by one, bit for bit."""
    calls = _one_calls(monkeypatch)
    model = _model().eval()
    idx = torch.randint(0, 40, (2, 32))
    with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16):
        logits = model(idx)
        assert len(calls) == 2
        monkeypatch.setenv(block_kernel.SWITCH, "python")
        assert torch.equal(logits, model(idx)) and len(calls) == 2


def test_its_build_is_keyed_by_every_file_it_includes():
    """block_kernel.c includes three kernels' files, which include simd16.h: a change to any of
    them must build the library anew (the cache key covers them all)."""
    key_text = c_kernels._source_bytes(block_kernel.SOURCE)
    for name in ("block_ops.c", "tile_matmul.c", "causal_attention.c", "simd16.h"):
        assert (block_kernel.SOURCE.parent / name).read_bytes() in key_text, name


_DOT_SCRIPT = """
import torch
from scratchgpt.models import block_kernel, tile_matmul
from tests.models.test_block_kernel import _loss_and_grads, _model
import os
assert tile_matmul.kind() == "dot" and block_kernel._load() is not None
for kw in ({}, {"bias": False, "activation": "gelu"}):
    model = _model(**kw)
    idx = torch.randint(0, 40, (2, 33))
    runs = []
    for name, value in (("", ""), (block_kernel.SWITCH, "python"), (tile_matmul.SWITCH, "torch")):
        if name:
            os.environ[name] = value
        runs.append(_loss_and_grads(model, idx))
    (loss, grads), (loss_calls, grads_calls), (loss_torch, grads_torch) = runs
    assert torch.equal(loss, loss_calls)
    assert all(torch.equal(g, r) for g, r in zip(grads, grads_calls))
    assert abs(loss.item() - loss_torch.item()) <= 1e-3 * loss_torch.item()
    assert all((g - r).norm() <= 2e-2 * r.norm() for g, r in zip(grads, grads_torch))
    for name in (block_kernel.SWITCH, tile_matmul.SWITCH):
        del os.environ[name]
print("dot-product block checked")
"""


@pytest.mark.skipif(block_kernel._load() is None, reason="no AMX or AVX512-BF16 here")
def test_with_dot_products_the_one_call_block_is_its_calls_one_by_one():
    """On a CPU without tiles the block runs in one call on AVX512-BF16 dot products: in a
    process that has them run, the loss and gradients are those of the kernels called one by
    one bit for bit, and PyTorch's products' to float rounding (its weight gradients sum in
    their own order)."""
    env = {**os.environ, tile_matmul.SWITCH: "dot", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}
    done = subprocess.run([sys.executable, "-c", _DOT_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "dot-product block checked" in done.stdout


def test_a_kernel_that_could_not_allocate_its_work_space_raises_memory_error():
    c_kernels.check_allocated(0, "block kernel")  # it could: nothing to say
    with pytest.raises(MemoryError, match="^block kernel: no memory for its work space$"):
        c_kernels.check_allocated(1, "block kernel")
