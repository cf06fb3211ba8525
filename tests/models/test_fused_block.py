"""A block's training forward and backward as one function (models/fused_block.py): on
PyTorch's operators the loss, every gradient and whole optimizer updates equal the modules'
path under bf16 autocast bit for bit; on the C kernels (models/block_ops.py) they agree to
float rounding; and the GPT uses it exactly where it may."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from scratchgpt.data.dataset import random_windows
from scratchgpt.models import attention_kernel, block_kernel, block_ops, fused_block
from scratchgpt.models.gpt import GPT, GPTConfig
from scratchgpt.models.lora import LoRAConfig, add_lora
from scratchgpt.training.config import TrainConfig
from scratchgpt.training.optim import make_optimizer
from scratchgpt.training.task import LanguageModelTask
from scratchgpt.training.trainer import train_step
from tests.models.test_gpt import option_model

pytestmark = pytest.mark.skipif(attention_kernel.load() is None,
                                reason="the fused block runs the attention kernel: AVX-512, cc")

# every kind of block the function computes: with and without biases, both GELUs, ReLU and
# ReLU², rotary positions
FUSABLE = [dict(), dict(bias=False), dict(activation="gelu"),
           dict(activation="gelu", bias=False, tie_weights=False), dict(pos_encoding="rope"),
           dict(pos_encoding="rope", activation="gelu", bias=False), dict(activation="relu"),
           dict(activation="relu2"), dict(activation="relu2", bias=False, pos_encoding="rope")]


def _switch(monkeypatch, on: bool) -> None:
    monkeypatch.setenv(fused_block.SWITCH, "" if on else "torch")


def _ops(monkeypatch, c: bool) -> None:
    """The fused block's elementwise work on the C kernels, or on PyTorch's operators."""
    monkeypatch.setenv(block_ops.SWITCH, "" if c else "torch")


def _count(monkeypatch) -> list[int]:
    """Appends to the returned list at each fused block's forward (in training or not, its
    kernels called one by one or in one call)."""
    calls: list[int] = []
    for module, name in ((fused_block, "_forward"), (block_kernel, "forward")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, real=real: calls.append(1) or real(*a))
    return calls


def _loss_and_grads(model: GPT, idx: torch.Tensor) -> tuple[torch.Tensor, list]:
    model.zero_grad()
    with torch.autocast("cpu", torch.bfloat16):
        logits = model(idx[:, :-1])
    loss = F.cross_entropy(logits.float().flatten(0, 1), idx[:, 1:].flatten())
    loss.backward()
    return loss.detach(), [None if p.grad is None else p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("kw", FUSABLE, ids=lambda kw: "-".join(map(str, kw.values())) or "gpt2")
def test_loss_and_gradients_equal_the_modules_bit_for_bit(kw, monkeypatch):
    _ops(monkeypatch, c=False)
    model = option_model("gpt2", **kw).train()
    idx = torch.randint(0, model.config.vocab_size, (3, 25))
    calls = _count(monkeypatch)
    loss, grads = _loss_and_grads(model, idx)
    assert len(calls) == model.config.n_layer  # every block ran as one function
    _switch(monkeypatch, False)
    loss_ref, grads_ref = _loss_and_grads(model, idx)
    assert len(calls) == model.config.n_layer  # and then none did
    assert torch.equal(loss, loss_ref)
    for (name, _), g, g_ref in zip(model.named_parameters(), grads, grads_ref, strict=True):
        assert g is not None and torch.equal(g, g_ref), name


def _fp32_grads(model: GPT, idx: torch.Tensor) -> list:
    """The gradients without autocast: what both bf16 paths approximate."""
    model.zero_grad()
    F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten()).backward()
    return [p.grad.clone() for p in model.parameters()]


def _distance(grads: list, ref: list) -> float:
    squares = [(g - r).square().sum() for g, r in zip(grads, ref, strict=True)]
    return torch.stack(squares).sum().sqrt().item()


@pytest.mark.skipif(block_ops._load() is None, reason="the C kernels need AVX-512 and cc")
@pytest.mark.parametrize("kw", FUSABLE, ids=lambda kw: "-".join(map(str, kw.values())) or "gpt2")
def test_on_the_c_kernels_gradients_are_as_close_to_fp32_as_the_modules(kw, monkeypatch):
    """The C kernels' LayerNorm sums in another order, so a bf16 value now and then rounds the
    other way (each a 4e-3 change of one element, which the backward carries on): every
    gradient stays within 2e-2 of the modules' (as a share of its norm; 6e-3 at most over 25
    batches of each model here), and all of them together are as far from the fp32 gradients
    as the modules' are, to 10% (3% at most over those batches)."""
    _ops(monkeypatch, c=True)
    model = option_model("gpt2", **kw).train()
    idx = torch.randint(0, model.config.vocab_size, (3, 25))
    calls = _count(monkeypatch)
    loss, grads = _loss_and_grads(model, idx)
    assert len(calls) == model.config.n_layer and block_ops.ops() is block_ops.C_OPS
    _switch(monkeypatch, False)
    loss_ref, grads_ref = _loss_and_grads(model, idx)
    assert loss.item() == pytest.approx(loss_ref.item(), rel=1e-5)
    for (name, _), g, g_ref in zip(model.named_parameters(), grads, grads_ref, strict=True):
        assert (g - g_ref).norm() <= 2e-2 * g_ref.norm(), name
    fp32 = _fp32_grads(model, idx)
    assert _distance(grads, fp32) <= 1.1 * _distance(grads_ref, fp32)


def _trained(bias: bool) -> list[torch.Tensor]:
    """The parameters after five AdamW updates of the recipe's step (bf16, clipping), on the
    same batches from the same start."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=29, block_size=16, n_layer=2, n_head=2, n_embd=32,
                          activation="gelu", bias=bias))
    cfg = TrainConfig(batch_size=4, grad_clip=1.0)
    opt = make_optimizer(model, 3e-3, 0.1, (0.9, 0.99), "adamw")
    tokens = np.random.default_rng(0).integers(0, 29, 2_000).astype(np.uint16)
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        train_step(model, model, opt, LanguageModelTask.loss, cfg,
                   lambda: random_windows(tokens, 4, 16, gen), torch.device("cpu"), "bf16")
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("bias", [True, False])
def test_training_steps_end_at_the_same_weights(bias, monkeypatch):
    _ops(monkeypatch, c=False)
    calls = _count(monkeypatch)
    fused = _trained(bias)
    assert len(calls) == 2 * 5
    _switch(monkeypatch, False)
    for p, p_ref in zip(fused, _trained(bias), strict=True):
        assert torch.equal(p, p_ref)


def test_a_tiny_training_run_through_it_lowers_the_loss(monkeypatch):
    calls = _count(monkeypatch)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_embd=32))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = torch.arange(200) * 7 % 11  # period 11: predictable from the previous token
    losses = []
    for _ in range(60):
        starts = torch.randint(0, len(data) - 17, (8,))
        loss, _ = _loss_and_grads(model, torch.stack([data[s:s + 17] for s in starts]))
        opt.step()
        losses.append(loss.item())
    assert calls and losses[-1] < losses[0] / 4


@pytest.mark.parametrize("option", ["qk_norm", "value_embeds", "no_layernorm", "no_residual",
                                    "no_mlp"])
def test_other_blocks_run_their_modules(option, monkeypatch):
    """Options the function does not compute leave those blocks to their modules (the model's
    own tests cover that path): with value embeddings, only the blocks that read none fuse."""
    calls = _count(monkeypatch)
    model = option_model(option).train()
    _loss_and_grads(model, torch.randint(0, model.config.vocab_size, (2, 12)))
    assert len(calls) == (model.ve_table.count(None) if option == "value_embeds" else 0)


def test_dropout_fp32_training_and_lora_run_the_modules(monkeypatch):
    calls = _count(monkeypatch)
    idx = torch.randint(0, 37, (2, 12))
    _loss_and_grads(option_model("gpt2", dropout=0.1).train(), idx)  # dropout in training
    model = option_model("gpt2").train()
    model(idx).sum().backward()  # fp32 training: no autocast
    with torch.autocast("cpu", torch.float16):
        model(idx)  # another autocast dtype
    add_lora(model, LoRAConfig(rank=2))
    _loss_and_grads(model.train(), idx)  # LoRA's projections are not nn.Linear
    assert not calls
    _loss_and_grads(option_model("gpt2").train(), idx)  # and the plain model does use it
    assert calls


@pytest.mark.parametrize("c", [False, True], ids=["torch-ops", "c-ops"])
@pytest.mark.parametrize("bf16", [True, False], ids=["bf16", "fp32"])
def test_evaluation_runs_fused_as_the_modules_do(c, bf16, monkeypatch):
    """Without gradients the forward runs alone, nothing kept for a backward, under bf16
    autocast or in fp32 (products in fp32 then); in evaluation a model trained with dropout
    fuses too (dropout is the identity there). On PyTorch's operators the logits are the
    modules' bit for bit; on the C kernels to a bf16 rounding under autocast, to float
    rounding in fp32."""
    if c and block_ops._load() is None:
        pytest.skip("the C kernels need AVX-512 and cc")
    _ops(monkeypatch, c=c)
    model = option_model("gpt2", dropout=0.1).eval()
    idx = torch.randint(0, model.config.vocab_size, (3, 20))
    calls = _count(monkeypatch)
    with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
        logits = model(idx)
        assert len(calls) == model.config.n_layer
        _switch(monkeypatch, False)
        logits_ref = model(idx)
    assert len(calls) == model.config.n_layer
    assert logits.dtype == logits_ref.dtype == (torch.bfloat16 if bf16 else torch.float32)
    if not c:
        assert torch.equal(logits, logits_ref)
    elif bf16:
        torch.testing.assert_close(logits.float(), logits_ref.float(), rtol=0, atol=2e-2)
    else:
        torch.testing.assert_close(logits, logits_ref, rtol=1e-5, atol=1e-5)
