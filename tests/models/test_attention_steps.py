"""Each step of models/attention_steps.py equals the next one with the weights copied across,
down to the GPT's fused attention layer and torch.nn.MultiheadAttention's equal."""

from __future__ import annotations

import doctest

import pytest
import torch

from scratchgpt.models import attention_steps
from scratchgpt.models.attention import MultiHeadAttention
from scratchgpt.models.attention_steps import (
    CausalAttentionHead,
    FusedMultiHeadAttention,
    LinearSelfAttention,
    MultiHeadWrapper,
    RawSelfAttention,
    causal_weights,
    causal_weights_renormalized,
    plain_attention,
)


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_docstring_examples_run():
    assert doctest.testmod(attention_steps, raise_on_error=True).attempted > 0


def test_plain_attention_is_a_raw_head_with_identity_weights():
    """Step 0 is step 1 with W_v = I and W_q = W_k = d^(1/4) I (which cancels the 1/sqrt(d))."""
    torch.manual_seed(0)
    d = 4
    x = torch.randn(6, d)
    raw = RawSelfAttention(d, d)
    with torch.no_grad():
        raw.W_q.copy_(torch.eye(d) * d ** 0.25)
        raw.W_k.copy_(torch.eye(d) * d ** 0.25)
        raw.W_v.copy_(torch.eye(d))
    close(raw(x), plain_attention(x))
    # and each output is a weighted average: inside the range of the inputs, feature by feature
    out = plain_attention(x)
    assert torch.all(out <= x.max(0).values + 1e-6) and torch.all(out >= x.min(0).values - 1e-6)


def test_linear_head_equals_raw_head():
    torch.manual_seed(1)
    raw = RawSelfAttention(5, 3)
    x = torch.randn(2, 7, 5)
    close(LinearSelfAttention.from_raw(raw)(x), raw(x))


def test_both_causal_softmaxes_agree_and_hide_the_future():
    torch.manual_seed(2)
    scores = torch.randn(3, 6, 6) * 3
    w = causal_weights(scores)
    close(causal_weights_renormalized(scores), w)
    assert torch.all(w.triu(1) == 0)
    close(w.sum(-1), torch.ones(3, 6))


def test_causal_head_sees_only_the_past():
    torch.manual_seed(3)
    head = CausalAttentionHead(5, 4, context=8).eval()
    x = torch.randn(2, 6, 5)
    out, w = head(x, return_weights=True)
    assert torch.all(w.triu(1) == 0)
    close(out[:, 0], head.v(x)[:, 0])  # the first token can only attend to itself
    # the last token sees every token: exactly the unmasked head's answer there
    unmasked = LinearSelfAttention(5, 4)
    unmasked.load_state_dict(head.state_dict())
    close(out[:, -1], unmasked(x)[:, -1])
    changed = x.clone()
    changed[:, 4:] = torch.randn(2, 2, 5)  # new future tokens: earlier outputs must not move
    again = head(changed)
    close(again[:, :4], out[:, :4])
    assert not torch.allclose(again[:, 4:], out[:, 4:])


def test_dropout_acts_on_the_weights_in_training_only():
    torch.manual_seed(4)
    head = CausalAttentionHead(5, 4, context=8, dropout=0.5)
    x = torch.randn(2, 6, 5)
    head.train()
    assert not torch.allclose(head(x), head(x))
    head.eval()
    assert torch.equal(head(x), head(x))


def test_context_is_enforced():
    with pytest.raises(ValueError, match="context"):
        CausalAttentionHead(3, 2, context=4)(torch.randn(1, 5, 3))
    with pytest.raises(ValueError, match="context"):
        FusedMultiHeadAttention(4, 4, 2, context=4)(torch.randn(1, 5, 4))


@pytest.mark.parametrize("bias", [False, True])
def test_fused_heads_equal_the_wrapper(bias):
    torch.manual_seed(5)
    wrapper = MultiHeadWrapper(d_in=6, head_dim=3, n_head=4, context=10, bias=bias).eval()
    x = torch.randn(2, 9, 6)
    fused = FusedMultiHeadAttention.from_wrapper(wrapper).eval()
    close(fused(x), wrapper(x))
    _, w = fused(x, return_weights=True)  # head h of the fused module is head h of the wrapper
    for h, head in enumerate(wrapper.heads):
        close(w[:, h], head(x, return_weights=True)[1])


def test_a_wrapper_of_one_head_is_that_head():
    torch.manual_seed(6)
    wrapper = MultiHeadWrapper(d_in=4, head_dim=4, n_head=1, context=6).eval()
    x = torch.randn(3, 5, 4)
    close(wrapper(x), wrapper.heads[0](x))


def test_fused_equals_the_general_module_and_torch():
    """Step 5 = models.attention.MultiHeadAttention(causal=True) = torch.nn.MultiheadAttention."""
    torch.manual_seed(7)
    fused = FusedMultiHeadAttention(8, 8, 2, context=12, bias=True).eval()
    general = MultiHeadAttention(8, 2, bias=True).eval()
    with torch.no_grad():
        for ours, theirs in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"),
                             ("out", "out_proj")):
            getattr(general, theirs).weight.copy_(getattr(fused, ours).weight)
            getattr(general, theirs).bias.copy_(getattr(fused, ours).bias)
    ref = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([fused.q.weight, fused.k.weight, fused.v.weight]))
        ref.in_proj_bias.copy_(torch.cat([fused.q.bias, fused.k.bias, fused.v.bias]))
        ref.out_proj.weight.copy_(fused.out.weight)
        ref.out_proj.bias.copy_(fused.out.bias)
    x = torch.randn(2, 10, 8)
    future = torch.ones(10, 10, dtype=torch.bool).triu(1)
    out = fused(x)
    close(general(x, x, x, causal=True)[0], out)
    close(ref(x, x, x, attn_mask=future, need_weights=False)[0], out)


@pytest.mark.parametrize("impl", ["sdpa", "math"])
def test_fused_equals_the_gpt_attention_layer(impl):
    torch.manual_seed(8)
    fused = FusedMultiHeadAttention(8, 8, 4, context=16, bias=True).eval()
    gpt = fused.to_gpt().eval()
    gpt.impl = impl
    x = torch.randn(3, 11, 8)
    y, _ = gpt(x)
    close(y, fused(x))
    _, w = gpt(x, need_weights=True)
    close(w, fused(x, return_weights=True)[1])
    with pytest.raises(ValueError):
        FusedMultiHeadAttention(8, 4, 2, context=4, bias=True).to_gpt()

