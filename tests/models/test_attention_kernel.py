"""scratchgpt's C causal attention (models/causal_attention.c): forward and gradients equal to
PyTorch's ``scaled_dot_product_attention``, in fp32 and bf16, from the fused projection or from
separate q, k, v; and the GPT uses it exactly where it may."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from scratchgpt.models import attention_kernel, block_kernel
from scratchgpt.models.gpt import GPT, GPTConfig
from scratchgpt.models.layers import apply_rope, rope_tables
from tests.models.test_gpt import option_model

pytestmark = pytest.mark.skipif(attention_kernel.load() is None,
                                reason="the attention kernel needs AVX-512 and a C compiler")

# (B, T, H, D): the recipe's shape, odd lengths and widths (padding), one token, long context
SHAPES = [(3, 64, 4, 32), (2, 37, 3, 24), (2, 1, 2, 16), (1, 130, 2, 64), (2, 19, 1, 8)]


def reference(qkv: torch.Tensor, n_head: int) -> torch.Tensor:
    """PyTorch's attention of the projection's heads, in fp32: (B, T, 3C) -> (B, T, C)."""
    B, T, C3 = qkv.shape
    q, k, v = qkv.float().view(B, T, 3, n_head, -1).permute(2, 0, 3, 1, 4).unbind(0)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)


def both(qkv: torch.Tensor, n_head: int, dy: torch.Tensor):
    """(output, input gradient) of the kernel and of the fp32 reference, from the same input."""
    ours = qkv.detach().clone().requires_grad_()
    theirs = qkv.detach().float().requires_grad_()
    y, y_ref = attention_kernel.attention_qkv(ours, n_head), reference(theirs, n_head)
    y.backward(dy.to(qkv.dtype))
    y_ref.backward(dy.to(qkv.dtype).float())
    return (y, ours.grad), (y_ref, theirs.grad)


@pytest.mark.parametrize("shape", SHAPES)
def test_fp32_output_and_gradients_equal_torch(shape):
    B, T, H, D = shape
    torch.manual_seed(0)
    qkv, dy = torch.randn(B, T, 3 * H * D), torch.randn(B, T, H * D)
    (y, g), (y_ref, g_ref) = both(qkv, H, dy)
    assert y.dtype == torch.float32 and y.shape == (B, T, H * D)
    torch.testing.assert_close(y, y_ref, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(g, g_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", SHAPES)
def test_bf16_is_fp32_arithmetic_rounded_once(shape):
    """bf16 in, bf16 out, fp32 inside: the output is the fp32 result of the same bf16 inputs
    rounded to bf16 (within one rounding, 2^-8 relative); the gradients carry the output's and
    dy's rounding too, so a few roundings."""
    B, T, H, D = shape
    torch.manual_seed(1)
    qkv, dy = torch.randn(B, T, 3 * H * D).bfloat16(), torch.randn(B, T, H * D)
    (y, g), (y_ref, g_ref) = both(qkv, H, dy)
    assert y.dtype == g.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), y_ref, atol=1e-3, rtol=2**-8)
    scale = g_ref.abs().max()
    assert (g.float() - g_ref).abs().max() < 2**-6 * scale


ROPE_SHAPES = [(3, 64, 4, 32), (2, 37, 3, 24), (2, 1, 2, 16), (1, 130, 2, 64), (2, 19, 1, 40)]


@pytest.mark.parametrize("shape", ROPE_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_positions_from_the_projection_equal_torch(shape, dtype):
    """Queries and keys turned inside the kernel (half widths 16, 12, 8, 32 and 20: whole and
    partial 16-wide steps) equal layers.apply_rope then PyTorch's attention, in fp32; in bf16,
    the fp32 result of the same bf16 inputs to bf16's precision. Gradients reach the projection
    through the rotation."""
    B, T, H, D = shape
    torch.manual_seed(4)
    cos, sin = rope_tables(2 * T, D)
    cos, sin = cos[T:], sin[T:]  # positions T .. 2T - 1: angles other than the first rows'
    qkv, dy = torch.randn(B, T, 3 * H * D).to(dtype), torch.randn(B, T, H * D).to(dtype)
    ours = qkv.clone().requires_grad_()
    y = attention_kernel.attention_qkv(ours, H, (cos, sin))
    y.backward(dy)
    theirs = qkv.float().requires_grad_()
    q, k, v = theirs.view(B, T, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    y_ref = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)
    y_ref.backward(dy.float())
    assert y.dtype == ours.grad.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(y, y_ref, atol=2e-6, rtol=1e-5)
        torch.testing.assert_close(ours.grad, theirs.grad, atol=1e-5, rtol=1e-5)
    else:
        torch.testing.assert_close(y.float(), y_ref, atol=1e-3, rtol=2**-8)
        assert (ours.grad.float() - theirs.grad).abs().max() < 2**-6 * theirs.grad.abs().max()


def test_rotary_tables_of_another_shape_are_refused():
    qkv = torch.randn(2, 10, 3 * 2 * 16)
    cos, sin = rope_tables(12, 16)  # 12 positions for 10 tokens
    with pytest.raises(ValueError, match="rotary tables"):
        attention_kernel.attention_qkv(qkv, 2, (cos, sin))


def test_a_rotary_gpt_reads_its_heads_from_the_projection(monkeypatch):
    """With RoPE alone among the options, training runs the projection's kernel, which turns q
    and k itself, not the path for q, k, v changed beforehand."""
    def refuse(*a):
        raise AssertionError("the separate q, k, v path ran")

    monkeypatch.setattr(attention_kernel, "attention", refuse)
    called = _count_kernel_calls(monkeypatch)
    model = option_model("rope").train()
    model(torch.randint(0, model.config.vocab_size, (2, 12))).sum().backward()
    assert len(called) == model.config.n_layer


def test_separate_q_k_v_equal_torch_and_reach_their_own_inputs():
    """The entry for q, k, v an option has changed: any strides, each gradient to its input."""
    B, T, H, D = 2, 21, 3, 16
    torch.manual_seed(2)
    q, k = torch.randn(B, H, T, D, requires_grad=True), torch.randn(B, T, H, D, requires_grad=True)
    v = torch.randn(B, H, D, T, requires_grad=True)  # transposed below: features not contiguous
    args = (q * 2, k.transpose(1, 2), v.transpose(2, 3))
    y = attention_kernel.attention(*args)
    y_ref = F.scaled_dot_product_attention(*args, is_causal=True).transpose(1, 2).flatten(2)
    torch.testing.assert_close(y, y_ref, atol=2e-6, rtol=1e-5)
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, (q, k, v), dy, retain_graph=True)
    grads_ref = torch.autograd.grad(y_ref, (q, k, v), dy)
    for g, g_ref in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(g, g_ref, atol=1e-5, rtol=1e-5)


def test_rows_are_independent_of_the_batch_and_of_the_future():
    """Each (sequence, head) is computed alone: a sequence's output is the same batched or
    alone, bit for bit, and a token's output never depends on later tokens."""
    torch.manual_seed(3)
    qkv = torch.randn(5, 40, 3 * 4 * 16)
    together = attention_kernel.attention_qkv(qkv, 4)
    alone = torch.cat([attention_kernel.attention_qkv(qkv[i:i + 1], 4) for i in range(5)])
    assert torch.equal(together, alone)
    changed = qkv.clone()
    changed[:, 30:] = torch.randn(5, 10, 3 * 4 * 16)
    assert torch.equal(attention_kernel.attention_qkv(changed, 4)[:, :30], together[:, :30])


def _without_kernel(monkeypatch) -> None:
    monkeypatch.setattr(attention_kernel, "usable", lambda *a: False)


def _count_kernel_calls(monkeypatch) -> list[int]:
    """A list that gains an entry each time the kernel's forward runs (called from Python, or
    inside a block's one C call: models/block_kernel.c)."""
    called: list[int] = []
    for module, name in ((attention_kernel, "_run_forward"), (block_kernel, "forward")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, real=real: called.append(1) or real(*a))
    return called


@pytest.mark.parametrize("option", ["gpt2", "rope", "qk_norm", "value_embeds"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpt_trains_the_same_with_and_without_the_kernel(option, dtype, monkeypatch):
    """A GPT's training loss and gradients with the kernel equal those with PyTorch's attention:
    plain (q, k, v from the projection) and with options that change them first."""
    model = option_model(option).train()
    idx = torch.randint(0, model.config.vocab_size, (3, 24))

    def loss_and_grads():
        model.zero_grad()
        with torch.autocast("cpu", torch.bfloat16, enabled=dtype == torch.bfloat16):
            logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), idx[:, 1:].flatten())
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    called = _count_kernel_calls(monkeypatch)
    loss, grads = loss_and_grads()
    assert len(called) == model.config.n_layer  # every layer ran the kernel
    _without_kernel(monkeypatch)
    loss_ref, grads_ref = loss_and_grads()
    tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=5e-2)
    torch.testing.assert_close(loss, loss_ref, **tol)
    for g, g_ref in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(g, g_ref, **tol)


def test_gpt_leaves_the_kernel_where_it_does_not_apply(monkeypatch):
    """Attention dropout in training, a KV cache, explicit masks and attention weights asked for
    all run PyTorch's attention; the kernel would be wrong or has no such input."""
    def refuse(*a):
        raise AssertionError("the kernel ran")

    monkeypatch.setattr(attention_kernel, "_run_forward", refuse)
    idx = torch.randint(0, 37, (2, 10))
    dropped = GPT(GPTConfig(vocab_size=37, block_size=24, n_layer=1, n_head=2, n_embd=16,
                            dropout=0.1)).train()
    dropped(idx)
    model = option_model("gpt2")
    cache = model.new_cache(2)
    model(idx, cache=cache)
    model.forward_with_attention(idx)


def test_a_tiny_bf16_training_run_through_the_kernel_lowers_the_loss(monkeypatch):
    """Autocast bf16, AdamW: a GPT learns a repeating sequence through the kernel alone."""
    called = _count_kernel_calls(monkeypatch)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_embd=32)).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = torch.arange(200) * 7 % 11  # period 11: predictable from the previous token

    def step() -> float:
        starts = torch.randint(0, len(data) - 17, (8,))
        batch = torch.stack([data[s:s + 17] for s in starts])
        with torch.autocast("cpu", torch.bfloat16):
            logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    first = step()
    for _ in range(80):
        last = step()
    assert called and last < first / 4


def test_without_a_compiler_the_gpt_runs_on_torchs_attention(monkeypatch):
    """No C compiler (or one that fails): the GPT still trains, on PyTorch's attention, to the
    same numbers."""
    model = option_model("gpt2").train()
    idx = torch.randint(0, model.config.vocab_size, (2, 20))
    with_kernel = model(idx)
    monkeypatch.setenv("CC", "no-such-compiler")
    attention_kernel.load.cache_clear()
    try:
        assert attention_kernel.load() is None
        assert attention_kernel.describe().startswith("torch")
        torch.testing.assert_close(model(idx), with_kernel, atol=1e-5, rtol=1e-5)
    finally:
        attention_kernel.load.cache_clear()
