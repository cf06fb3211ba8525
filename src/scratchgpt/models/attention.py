"""Multi-head scaled dot-product attention, from scratch.

For queries ``Q``, keys ``K`` and values ``V`` of one head (width ``d``)::

    attention(Q, K, V) = softmax(Q K^T / sqrt(d) + mask) V

Multi-head attention projects the inputs with separate ``q_proj``, ``k_proj``, ``v_proj``, splits
the ``embed_dim`` features into ``num_heads`` heads of ``head_dim`` features, attends in each head
independently, concatenates the heads back and mixes them with ``out_proj``.
:meth:`MultiHeadAttention.from_torch` loads the weights of a ``torch.nn.MultiheadAttention``, so
the tests can check the two agree.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from scratchgpt.models.dropout import dropout


def causal_mask(t_q: int, t_k: int, device: torch.device | None = None) -> Tensor:
    """``[t_q, t_k]`` bool mask, True where query ``i`` must NOT see key ``j`` (``j > i``)."""
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).triu(1)


def attention_mask(t_q: int, t_k: int, key_padding_mask: Tensor | None = None,
                   causal: bool = False, attn_mask: Tensor | None = None,
                   device: torch.device | None = None) -> Tensor | None:
    """The keys each query must not see, as :meth:`MultiHeadAttention.attend` takes them: bool
    ``[1, 1, Tq, Tk]`` (``causal``, ``attn_mask [Tq, Tk]``) or ``[B, 1, Tq, Tk]`` (with
    ``key_padding_mask [B, Tk]``), True = hidden; None when nothing is."""
    masked = causal_mask(t_q, t_k, device) if causal else None
    if attn_mask is not None:
        masked = attn_mask if masked is None else masked | attn_mask
    masked = None if masked is None else masked.view(1, 1, t_q, t_k)
    if key_padding_mask is not None:
        pad = key_padding_mask.view(-1, 1, 1, t_k)  # [B, 1, 1, Tk]
        masked = pad if masked is None else masked | pad
    return masked


class MultiHeadAttention(nn.Module):
    """``forward(query [B, Tq, E], key [B, Tk, E], value [B, Tk, E]) -> (out [B, Tq, E], weights)``.

    Masks use PyTorch's convention, True = masked out:
    ``key_padding_mask`` ``[B, Tk]`` (True at padding keys), ``causal=True`` hides future keys,
    ``attn_mask`` ``[Tq, Tk]`` is any extra bool mask. ``need_weights`` returns the attention
    probabilities averaged over heads ``[B, Tq, Tk]``, or per head ``[B, heads, Tq, Tk]`` with
    ``average_weights=False``; otherwise ``None``.

    ``forward`` is four public steps, which a decoder with a KV cache calls on their own (so
    its cached decode runs the same arithmetic): :meth:`project_q` and :meth:`project_kv` (the
    projections, cut into heads), :func:`attention_mask`, and :meth:`attend` (scores, mask,
    softmax, dropout, heads concatenated, ``out_proj``).
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    def heads(self, x: Tensor) -> Tensor:
        """``x [B, T, E]`` -> ``[B, H, T, d]``: the ``E`` features cut into ``H`` heads of ``d``."""
        b, t, _ = x.shape
        # [B, T, E] -> [B, T, H, d] -> [B, H, T, d]
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

    def project_q(self, query: Tensor) -> Tensor:
        """``query [B, Tq, E]`` -> queries ``[B, H, Tq, d]``."""
        return self.heads(self.q_proj(query))

    def project_kv(self, key: Tensor, value: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``key [B, Tk, E]``, ``value [B, Tk, E]`` (default: ``key``) -> keys and values
        ``[B, H, Tk, d]``; a decoder projects an encoder output's once and reuses them."""
        value = key if value is None else value
        return self.heads(self.k_proj(key)), self.heads(self.v_proj(value))

    def attend(self, q: Tensor, k: Tensor, v: Tensor,
               masked: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Queries ``q [B, H, Tq, d]`` attend keys ``k`` and values ``v [B, H, Tk, d]`` ->
        (``out [B, Tq, E]``: the heads concatenated and mixed by ``out_proj``, ``probs
        [B, H, Tq, Tk]``). ``masked``: bool, broadcastable to ``[B, H, Tq, Tk]``, True where a
        query must not see a key (see :func:`attention_mask`); None: every key is seen."""
        b, _, t_q, _ = q.shape
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # [B, H, Tq, Tk]
        if masked is not None:
            scores = scores.masked_fill(masked, float("-inf"))
        probs = scores.softmax(dim=-1)  # [B, H, Tq, Tk]; each row sums to 1 over visible keys
        out = dropout(probs, self.dropout, self.training) @ v  # [B, H, Tq, d]
        # [B, H, Tq, d] -> [B, Tq, H, d] -> [B, Tq, E]: concatenate the heads
        out = out.transpose(1, 2).reshape(b, t_q, self.embed_dim)
        return self.out_proj(out), probs

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        attn_mask: Tensor | None = None,
        need_weights: bool = False,
        average_weights: bool = True,
    ) -> tuple[Tensor, Tensor | None]:
        q = self.project_q(query)  # [B, H, Tq, d]
        k, v = self.project_kv(key, value)  # [B, H, Tk, d]
        masked = attention_mask(q.size(2), k.size(2), key_padding_mask, causal, attn_mask,
                                query.device)
        out, probs = self.attend(q, k, v, masked)  # [B, Tq, E], [B, H, Tq, Tk]
        if not need_weights:
            return out, None
        return out, probs.mean(dim=1) if average_weights else probs

    @classmethod
    def from_torch(cls, mha: nn.MultiheadAttention) -> MultiHeadAttention:
        """A copy of ``mha``'s weights, recovered from its packed ``in_proj_weight``/``_bias``.

        PyTorch stacks the three projections as rows ``[W_q; W_k; W_v]`` of one ``[3E, E]`` matrix;
        within each, the rows of head ``h`` are ``h*head_dim .. (h+1)*head_dim``, which is exactly
        how :meth:`heads` cuts our projections.
        """
        if not mha._qkv_same_embed_dim:
            raise ValueError("only MultiheadAttention with kdim == vdim == embed_dim is supported")
        if mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError("add_bias_kv / add_zero_attn are not supported")
        bias = mha.in_proj_bias is not None
        ours = cls(mha.embed_dim, mha.num_heads, mha.dropout, bias=bias)
        w_q, w_k, w_v = mha.in_proj_weight.detach().chunk(3, dim=0)  # 3 x [E, E]
        with torch.no_grad():
            ours.q_proj.weight.copy_(w_q)
            ours.k_proj.weight.copy_(w_k)
            ours.v_proj.weight.copy_(w_v)
            ours.out_proj.weight.copy_(mha.out_proj.weight)
            if bias:
                b_q, b_k, b_v = mha.in_proj_bias.detach().chunk(3)
                ours.q_proj.bias.copy_(b_q)
                ours.k_proj.bias.copy_(b_k)
                ours.v_proj.bias.copy_(b_v)
                ours.out_proj.bias.copy_(mha.out_proj.bias)
        return ours
