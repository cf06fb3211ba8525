"""MultiHeadAttention equals torch.nn.MultiheadAttention on the same weights."""

import pytest
import torch
from torch import nn

from scratchgpt.models.attention import MultiHeadAttention, causal_mask


def _pair(e=16, h=4, bias=True):
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(e, h, batch_first=True, bias=bias).eval()
    return ref, MultiHeadAttention.from_torch(ref).eval()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_self_attention_matches_torch(causal, padding, bias):
    ref, ours = _pair(bias=bias)
    x = torch.randn(3, 6, 16)
    kpm = None
    if padding:
        kpm = torch.zeros(3, 6, dtype=torch.bool)
        kpm[1, 4:] = True
        kpm[2, 5:] = True
    mask = causal_mask(6, 6) if causal else None
    out_ref, w_ref = ref(x, x, x, key_padding_mask=kpm, attn_mask=mask, need_weights=True)
    out, w = ours(x, x, x, key_padding_mask=kpm, causal=causal, need_weights=True)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w, w_ref, atol=1e-5, rtol=1e-5)


def test_cross_attention_and_per_head_weights_match_torch():
    ref, ours = _pair()
    q, kv = torch.randn(2, 3, 16), torch.randn(2, 7, 16)
    kpm = torch.tensor([[False] * 7, [False] * 4 + [True] * 3])
    out_ref, w_ref = ref(q, kv, kv, key_padding_mask=kpm, average_attn_weights=False)
    out, w = ours(q, kv, kv, key_padding_mask=kpm, need_weights=True, average_weights=False)
    assert w.shape == (2, 4, 3, 7)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w, w_ref, atol=1e-5, rtol=1e-5)
    assert torch.all(w[1, :, :, 4:] == 0)  # padding keys get no weight


def test_causal_mask_blocks_the_future():
    _, ours = _pair()
    x = torch.randn(1, 5, 16)
    out, w = ours(x, x, x, causal=True, need_weights=True)
    assert torch.all(w[0].triu(1) == 0)
    y = x.clone()
    y[0, 3:] = torch.randn(2, 16)  # change the future: earlier outputs must not move
    out2, _ = ours(y, y, y, causal=True)
    torch.testing.assert_close(out2[0, :3], out[0, :3])
    assert not torch.allclose(out2[0, 3:], out[0, 3:])


def test_a_query_row_attends_alone_through_the_steps_forward_is_made_of():
    """project_q, project_kv and attend, called for query ``i`` alone over keys ``0 .. i`` (as a
    KV-cached decoder calls them), give row ``i`` of the causal forward: output and per-head
    probabilities."""
    _, ours = _pair()
    x = torch.randn(2, 5, 16)
    out, w = ours(x, x, x, causal=True, need_weights=True, average_weights=False)
    q = ours.project_q(x)  # [2, 4, 5, 4]
    k, v = ours.project_kv(x)
    assert q.shape == k.shape == v.shape == (2, 4, 5, 4)
    for i in range(5):
        out_i, p_i = ours.attend(q[:, :, i:i + 1], k[:, :, :i + 1], v[:, :, :i + 1])
        assert out_i.shape == (2, 1, 16) and p_i.shape == (2, 4, 1, i + 1)
        torch.testing.assert_close(out_i[:, 0], out[:, i], atol=1e-6, rtol=0.0)
        torch.testing.assert_close(p_i[:, :, 0], w[:, :, i, :i + 1], atol=1e-6, rtol=0.0)


def test_head_split_must_divide():
    with pytest.raises(ValueError):
        MultiHeadAttention(10, 3)
