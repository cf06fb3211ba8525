"""Self-attention built up in small steps, from a bare weighted average to the fused multi-head
module inside the GPT. Read it top to bottom; every step is a few lines more than the one
before, and ``tests/models/test_attention_steps.py`` proves each step equals the next one when
the weights are copied across.

Step 0, :func:`plain_attention` -- no parameters at all. Each token's output is an average of
all tokens, weighted by how similar they are (dot products, turned into weights by softmax)::

    weights = softmax(x @ x^T)            # (T, T), each row sums to 1
    out     = weights @ x                 # (T, d)

Step 1, :class:`RawSelfAttention` -- learn *what* to compare. Three matrices project every token
into a query ("what am I looking for"), a key ("what do I offer") and a value ("what I pass on"),
held as bare ``nn.Parameter`` tensors so that the algebra is visible: ``q = x @ W_q``. Scores are
divided by ``sqrt(d_out)``, which keeps their spread (and so the softmax's sharpness)
independent of the width.

Step 2, :class:`LinearSelfAttention` -- the same computation with ``nn.Linear`` layers, which
store the transposed matrix (``Linear(x) = x @ W.T``) and initialise it better.
:meth:`LinearSelfAttention.from_raw` copies step 1's weights in.

Step 3, :class:`CausalAttentionHead` -- a language model must not peek at the tokens it is about
to predict. Scores of future keys are set to ``-inf`` before the softmax, so their weights are
exactly 0 and each row still sums to 1 (:func:`causal_weights`; :func:`causal_weights_renormalized`
shows the equivalent "softmax, zero the future, renormalise" route). Dropout on the attention
weights regularises training. Inputs gain a batch dimension here: ``(B, T, d_in)``.

Step 4, :class:`MultiHeadWrapper` -- several heads side by side, each free to attend to
something different (one to the previous token, one to the start of the line ...). Their
outputs are concatenated: ``n_head`` heads of width ``head_dim`` give ``n_head * head_dim``
features. Simple, but the heads run one after another.

Step 5, :class:`FusedMultiHeadAttention` -- the same heads in one set of matrix products. The
per-head query matrices are stacked into one ``(n_head * head_dim, d_in)`` projection; the result
is reshaped to ``(B, n_head, T, head_dim)`` so a single batched matmul scores all heads at once.
An output projection then mixes the heads. :meth:`FusedMultiHeadAttention.from_wrapper` stacks
step 4's heads into it (with an identity output projection, it returns step 4's output exactly).

Step 6 is the GPT's :class:`~scratchgpt.models.gpt.CausalSelfAttention`: the three projections
fused into one ``c_attn`` layer (``3 * n_embd`` outputs, split into q, k, v) and the softmax
done by ``F.scaled_dot_product_attention``, a fused kernel that never stores the ``(T, T)``
weights. :meth:`FusedMultiHeadAttention.to_gpt` builds one with the same weights.
:class:`~scratchgpt.models.attention.MultiHeadAttention` is the general version for
encoder-decoders (cross-attention, padding masks), checked against ``torch.nn.MultiheadAttention``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

# ---------------------------------------------------------------------------------------------
# Step 0: attention without parameters
# ---------------------------------------------------------------------------------------------


def plain_attention(x: Tensor) -> Tensor:
    """Every token becomes the softmax(similarity)-weighted average of all tokens.

    >>> x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    >>> plain_attention(x).shape
    torch.Size([3, 2])
    """
    scores = x @ x.transpose(-2, -1)  # (T, T): token i's dot product with token j
    weights = torch.softmax(scores, dim=-1)  # (T, T), rows sum to 1
    return weights @ x  # (T, d): weighted averages of the tokens


# ---------------------------------------------------------------------------------------------
# Steps 1-2: one self-attention head, raw matrices then nn.Linear
# ---------------------------------------------------------------------------------------------


def attention_weights(q: Tensor, k: Tensor) -> Tensor:
    """softmax(q k^T / sqrt(d)): (..., Tq, d), (..., Tk, d) -> (..., Tq, Tk)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(k.size(-1))  # (..., Tq, Tk)
    return torch.softmax(scores, dim=-1)


class RawSelfAttention(nn.Module):
    """One head with bare projection matrices: ``forward(x (..., T, d_in)) -> (..., T, d_out)``."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        # Small random values; (d_in, d_out) so that a row vector times W is a projection.
        self.W_q = nn.Parameter(torch.randn(d_in, d_out) / math.sqrt(d_in))
        self.W_k = nn.Parameter(torch.randn(d_in, d_out) / math.sqrt(d_in))
        self.W_v = nn.Parameter(torch.randn(d_in, d_out) / math.sqrt(d_in))

    def forward(self, x: Tensor) -> Tensor:
        q = x @ self.W_q  # (..., T, d_out): what each token is looking for
        k = x @ self.W_k  # (..., T, d_out): what each token offers to be found by
        v = x @ self.W_v  # (..., T, d_out): what each token hands over when chosen
        return attention_weights(q, k) @ v  # (..., T, T) @ (..., T, d_out)


class LinearSelfAttention(nn.Module):
    """Step 1 with ``nn.Linear`` projections (optionally with biases)."""

    def __init__(self, d_in: int, d_out: int, bias: bool = False):
        super().__init__()
        self.q = nn.Linear(d_in, d_out, bias=bias)
        self.k = nn.Linear(d_in, d_out, bias=bias)
        self.v = nn.Linear(d_in, d_out, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)  # 3 x (..., T, d_out)
        return attention_weights(q, k) @ v  # (..., T, d_out)

    @classmethod
    def from_raw(cls, raw: RawSelfAttention) -> LinearSelfAttention:
        """The same head: ``nn.Linear`` keeps ``W.T`` (out, in), so each matrix is transposed."""
        d_in, d_out = raw.W_q.shape
        head = cls(d_in, d_out)
        with torch.no_grad():
            for linear, w in ((head.q, raw.W_q), (head.k, raw.W_k), (head.v, raw.W_v)):
                linear.weight.copy_(w.T)
        return head


# ---------------------------------------------------------------------------------------------
# Step 3: causal masking and dropout
# ---------------------------------------------------------------------------------------------


def causal_weights(scores: Tensor) -> Tensor:
    """Softmax over the keys a query may see: keys after the query get ``-inf``, hence weight 0.

    scores: (..., T, T) -> weights (..., T, T), lower triangular, rows summing to 1."""
    t = scores.size(-1)
    future = torch.ones(t, t, dtype=torch.bool, device=scores.device).triu(1)  # True above diag
    return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)


def causal_weights_renormalized(scores: Tensor) -> Tensor:
    """The same weights another way: softmax over all keys, zero the future, rescale each row
    to sum to 1 again (the softmax's normaliser cancels, so the result is identical)."""
    t = scores.size(-1)
    past = torch.ones(t, t, dtype=torch.bool, device=scores.device).tril()  # True on/below diag
    weights = torch.softmax(scores, dim=-1) * past  # (..., T, T) future weights now 0
    return weights / weights.sum(dim=-1, keepdim=True)


class CausalAttentionHead(LinearSelfAttention):
    """One causal head over a batch: ``forward(x (B, T, d_in)) -> (B, T, d_out)``, T <= context.

    ``return_weights=True`` also returns the attention weights (B, T, T), before dropout."""

    def __init__(self, d_in: int, d_out: int, context: int, dropout: float = 0.0,
                 bias: bool = False):
        super().__init__(d_in, d_out, bias)
        self.dropout = nn.Dropout(dropout)
        self.context = context

    def forward(self, x: Tensor, return_weights: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        if x.size(-2) > self.context:
            raise ValueError(f"{x.size(-2)} tokens exceed the context of {self.context}")
        q, k, v = self.q(x), self.k(x), self.v(x)  # 3 x (B, T, d_out)
        scores = q @ k.transpose(-2, -1) / math.sqrt(k.size(-1))  # (B, T, T)
        weights = causal_weights(scores)  # (B, T, T), zero above the diagonal
        out = self.dropout(weights) @ v  # (B, T, d_out); dropout only in training mode
        return (out, weights) if return_weights else out


# ---------------------------------------------------------------------------------------------
# Steps 4-5: many heads, one after another, then all at once
# ---------------------------------------------------------------------------------------------


class MultiHeadWrapper(nn.Module):
    """``n_head`` independent causal heads, outputs concatenated: (B, T, n_head * head_dim)."""

    def __init__(self, d_in: int, head_dim: int, n_head: int, context: int,
                 dropout: float = 0.0, bias: bool = False):
        super().__init__()
        self.heads = nn.ModuleList(CausalAttentionHead(d_in, head_dim, context, dropout, bias)
                                   for _ in range(n_head))

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([head(x) for head in self.heads], dim=-1)  # (B, T, n_head * head_dim)


class FusedMultiHeadAttention(nn.Module):
    """All heads in one projection per q/k/v and one batched matmul, then an output projection.

    ``forward(x (B, T, d_in)) -> (B, T, d_out)`` with ``d_out = n_head * head_dim``;
    ``return_weights=True`` also returns the weights of every head (B, n_head, T, T)."""

    def __init__(self, d_in: int, d_out: int, n_head: int, context: int, dropout: float = 0.0,
                 bias: bool = False):
        super().__init__()
        if d_out % n_head:
            raise ValueError(f"d_out {d_out} is not divisible by n_head {n_head}")
        self.n_head, self.head_dim, self.context = n_head, d_out // n_head, context
        self.q = nn.Linear(d_in, d_out, bias=bias)
        self.k = nn.Linear(d_in, d_out, bias=bias)
        self.v = nn.Linear(d_in, d_out, bias=bias)
        self.out = nn.Linear(d_out, d_out)  # mixes what the heads found
        self.dropout = nn.Dropout(dropout)

    def _heads(self, x: Tensor) -> Tensor:
        """(B, T, n_head * head_dim) -> (B, n_head, T, head_dim): feature block h is head h."""
        b, t, _ = x.shape
        return x.view(b, t, self.n_head, self.head_dim).transpose(1, 2)

    def forward(self, x: Tensor, return_weights: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        b, t, _ = x.shape
        if t > self.context:
            raise ValueError(f"{t} tokens exceed the context of {self.context}")
        q, k, v = self._heads(self.q(x)), self._heads(self.k(x)), self._heads(self.v(x))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, n_head, T, T)
        weights = causal_weights(scores)  # (B, n_head, T, T)
        y = self.dropout(weights) @ v  # (B, n_head, T, head_dim)
        y = y.transpose(1, 2).reshape(b, t, self.n_head * self.head_dim)  # heads side by side
        out = self.out(y)  # (B, T, d_out)
        return (out, weights) if return_weights else out

    @classmethod
    def from_wrapper(cls, wrapper: MultiHeadWrapper) -> FusedMultiHeadAttention:
        """Stack the heads of ``wrapper``: head h's (head_dim, d_in) matrix becomes rows
        ``h*head_dim .. (h+1)*head_dim`` of the fused projection. The output projection is the
        identity, so the result equals the wrapper's concatenation exactly."""
        first = wrapper.heads[0]
        head_dim, d_in = first.q.weight.shape
        n_head = len(wrapper.heads)
        bias = first.q.bias is not None
        fused = cls(d_in, n_head * head_dim, n_head, first.context, first.dropout.p, bias)
        with torch.no_grad():
            for name in ("q", "k", "v"):
                layers = [getattr(head, name) for head in wrapper.heads]
                getattr(fused, name).weight.copy_(torch.cat([m.weight for m in layers]))
                if bias:
                    getattr(fused, name).bias.copy_(torch.cat([m.bias for m in layers]))
            fused.out.weight.copy_(torch.eye(n_head * head_dim))
            fused.out.bias.zero_()
        return fused

    def to_gpt(self) -> nn.Module:
        """The GPT's attention layer (step 6) with these weights: ``c_attn`` is the q, k and v
        projections stacked as one (3 * d_out, d_in) matrix, ``c_proj`` the output projection.
        Needs ``d_in == d_out`` (the GPT's residual stream has one width) and biases."""
        from scratchgpt.models.gpt import CausalSelfAttention, GPTConfig

        d_out, d_in = self.q.weight.shape
        if d_in != d_out or self.q.bias is None:
            raise ValueError("the GPT's attention needs d_in == d_out and bias=True")
        cfg = GPTConfig(n_embd=d_out, n_head=self.n_head, block_size=self.context,
                        dropout=self.dropout.p)
        gpt = CausalSelfAttention(cfg)
        with torch.no_grad():
            gpt.c_attn.weight.copy_(torch.cat([self.q.weight, self.k.weight, self.v.weight]))
            gpt.c_attn.bias.copy_(torch.cat([self.q.bias, self.k.bias, self.v.bias]))
            gpt.c_proj.weight.copy_(self.out.weight)
            gpt.c_proj.bias.copy_(self.out.bias)
        return gpt
