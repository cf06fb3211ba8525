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


class MultiHeadAttention(nn.Module):
    """``forward(query [B, Tq, E], key [B, Tk, E], value [B, Tk, E]) -> (out [B, Tq, E], weights)``.

    Masks use PyTorch's convention, True = masked out:
    ``key_padding_mask`` ``[B, Tk]`` (True at padding keys), ``causal=True`` hides future keys,
    ``attn_mask`` ``[Tq, Tk]`` is any extra bool mask. ``need_weights`` returns the attention
    probabilities averaged over heads ``[B, Tq, Tk]``, or per head ``[B, heads, Tq, Tk]`` with
    ``average_weights=False``; otherwise ``None``.
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

    def _split_heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        # [B, T, E] -> [B, T, heads, head_dim] -> [B, heads, T, head_dim]
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

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
        b, t_q, _ = query.shape
        t_k = key.size(1)
        q = self._split_heads(self.q_proj(query))  # [B, H, Tq, d]
        k = self._split_heads(self.k_proj(key))  # [B, H, Tk, d]
        v = self._split_heads(self.v_proj(value))  # [B, H, Tk, d]

        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # [B, H, Tq, Tk]
        masked = torch.zeros(t_q, t_k, dtype=torch.bool, device=query.device)
        if causal:
            masked = masked | causal_mask(t_q, t_k, query.device)
        if attn_mask is not None:
            masked = masked | attn_mask
        masked = masked.view(1, 1, t_q, t_k)
        if key_padding_mask is not None:
            masked = masked | key_padding_mask.view(b, 1, 1, t_k)
        scores = scores.masked_fill(masked, float("-inf"))
        probs = scores.softmax(dim=-1)  # [B, H, Tq, Tk]; each row sums to 1 over visible keys
        dropped = dropout(probs, self.dropout, self.training)

        out = dropped @ v  # [B, H, Tq, d]
        # [B, H, Tq, d] -> [B, Tq, H, d] -> [B, Tq, E]: concatenate the heads
        out = out.transpose(1, 2).reshape(b, t_q, self.embed_dim)
        out = self.out_proj(out)

        if not need_weights:
            return out, None
        return out, probs.mean(dim=1) if average_weights else probs

    @classmethod
    def from_torch(cls, mha: nn.MultiheadAttention) -> MultiHeadAttention:
        """A copy of ``mha``'s weights, recovered from its packed ``in_proj_weight``/``_bias``.

        PyTorch stacks the three projections as rows ``[W_q; W_k; W_v]`` of one ``[3E, E]`` matrix;
        within each, the rows of head ``h`` are ``h*head_dim .. (h+1)*head_dim``, which is exactly
        how :meth:`_split_heads` cuts our projections.
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
