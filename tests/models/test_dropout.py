"""The CPU dropout of models/dropout.py: the right probability, an unbiased output, the gradient
through the same mask, masks that follow torch's generator, and the GPT's attention dropout."""

from __future__ import annotations

import doctest
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from scratchgpt.models import dropout as dropout_module
from scratchgpt.models.dropout import Dropout, drop_mask, dropout, quantized_p
from scratchgpt.models.gpt import GPT, CausalSelfAttention, GPTConfig


def test_docstring_examples():
    assert doctest.testmod(dropout_module, raise_on_error=True).attempted > 0


@pytest.mark.parametrize("p", [0.001, 0.1, 0.5, 0.9])
def test_each_element_is_dropped_with_probability_p(p):
    torch.manual_seed(0)
    n = 1_000_003  # not a multiple of 4: the last 64-bit draw is used in part
    frac = drop_mask((n,), p).double().mean().item()
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(frac - p) < 5 * sigma


def test_neighbours_are_independent():
    # four neighbours share one 64-bit draw: their drops must still be independent
    torch.manual_seed(0)
    p, n = 0.3, 400_000
    drop = drop_mask((n, 4), p).double()
    for a, b in [(0, 1), (1, 2), (2, 3), (0, 3)]:
        both = (drop[:, a] * drop[:, b]).mean().item()
        assert abs(both - p * p) < 5 * math.sqrt(p * p * (1 - p * p) / n)


def test_the_numbers_cover_all_sixteen_bits_evenly():
    # a mask at p = k / 16 for every k: the drop fraction climbs in even steps of 1/16
    for k in range(1, 16):
        torch.manual_seed(k)
        frac = drop_mask((200_000,), k / 16).double().mean().item()
        assert abs(frac - k / 16) < 5 * math.sqrt((k / 16) * (1 - k / 16) / 200_000)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kept_elements_are_scaled_so_the_mean_is_kept(dtype):
    torch.manual_seed(0)
    x = torch.rand(300, 1000, dtype=dtype) + 0.5
    y = dropout(x, 0.2)
    kept = y != 0
    q = quantized_p(0.2)
    torch.testing.assert_close(y[kept], (x[kept].float() / (1 - q)).to(dtype))
    assert abs(y.double().mean().item() / x.double().mean().item() - 1) < 0.01
    assert y.dtype == dtype


def test_gradient_goes_through_the_same_mask():
    torch.manual_seed(0)
    x = torch.randn(64, 50, requires_grad=True)
    g = torch.randn(64, 50)
    state = torch.get_rng_state()
    dropout(x, 0.4).backward(g)
    torch.set_rng_state(state)
    keep = ~drop_mask(x.shape, 0.4)
    torch.testing.assert_close(x.grad, g * keep * (1 / (1 - quantized_p(0.4))), rtol=0, atol=0)


def test_masks_follow_torchs_generator():
    torch.manual_seed(5)
    a = drop_mask((1000,), 0.5)
    b = drop_mask((1000,), 0.5)
    torch.manual_seed(5)
    assert torch.equal(drop_mask((1000,), 0.5), a)  # the same seed, the same masks
    assert not torch.equal(a, b)  # the next draw, another mask
    gen = torch.Generator().manual_seed(5)
    assert torch.equal(drop_mask((1000,), 0.5, generator=gen), a)


def test_identity_in_eval_and_at_zero_zeros_at_one():
    x = torch.randn(10, 10)
    assert dropout(x, 0.5, training=False) is x
    assert dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))


def test_module_is_a_drop_in_for_nn_dropout():
    layer = Dropout(0.25)
    assert layer.state_dict() == {} and repr(layer) == "Dropout(p=0.25)"
    x = torch.randn(8, 8)
    assert layer.eval()(x) is x
    with pytest.raises(ValueError, match="between 0 and 1"):
        Dropout(1.5)


def test_probability_is_taken_to_the_nearest_sixteen_bit_step():
    assert quantized_p(0.1) == round(0.1 * 65536) / 65536
    assert quantized_p(0.5) == 0.5
    assert abs(quantized_p(0.1) - 0.1) < 1 / 65536


def test_attention_dropout_is_unbiased():
    # E[dropout(weights)] = weights, so the mean of many training-mode outputs of an attention
    # layer with attention dropout alone is its eval-mode output
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=10, n_layer=1, n_head=2, n_embd=8, block_size=6, dropout=0.0,
                    attn_dropout=0.3)
    attn = CausalSelfAttention(cfg)
    x = torch.randn(1, 6, 8).expand(4000, 6, 8)
    with torch.no_grad():
        want, _ = attn.eval()(x[:1])
        runs, _ = attn.train()(x)
    assert not torch.allclose(runs[0], runs[1])  # each row its own mask
    torch.testing.assert_close(runs.mean(0, keepdim=True), want, atol=0.03, rtol=0)


def test_attention_dropout_in_training_matches_the_written_out_form():
    # the CPU training path is dropout(softmax(q k^T / sqrt(d) + causal mask)) v with this
    # module's mask: drawn again from the same RNG state, the same output
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=10, n_layer=1, n_head=2, n_embd=8, block_size=5, dropout=0.0,
                    attn_dropout=0.5)
    attn = CausalSelfAttention(cfg).train()
    x = torch.randn(3, 5, 8)
    state = torch.get_rng_state()
    y, _ = attn(x)
    torch.set_rng_state(state)
    q, k, v = attn._qkv(attn.c_attn(x), None, None)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(4)
    scores = scores.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
    w = dropout(torch.softmax(scores, -1), 0.5)
    want = attn.c_proj((w @ v).transpose(1, 2).reshape(3, 5, 8))
    torch.testing.assert_close(y, want)


def test_gpt_training_with_dropout_lowers_the_loss():
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=16, n_layer=2, n_head=2, n_embd=32, block_size=16, dropout=0.2)
    model = GPT(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = torch.arange(16).repeat(8, 2)[:, :17]  # a counting sequence: easy to learn

    def loss() -> torch.Tensor:
        logits = model(data[:, :-1])
        return F.cross_entropy(logits.reshape(-1, 16), data[:, 1:].reshape(-1))

    first = loss().item()
    for _ in range(60):
        opt.zero_grad()
        loss().backward()
        opt.step()
    assert loss().item() < first / 2
    assert isinstance(model.transformer.drop, Dropout)
    assert not any(isinstance(m, nn.Dropout) for m in model.modules())
