"""The GPT decoder, readable top to bottom.

    idx (B, T) -> wte + wpe -> n_layer x Block -> ln_f -> lm_head -> logits (B, T, vocab)
    Block: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))          (pre-LayerNorm, residuals)

Parameter names follow GPT-2 (``wte``, ``wpe``, ``h.N.attn.c_attn``, ``c_proj``, ``ln_f``) so that
importing a GPT-2 checkpoint is a near-identity mapping. Generation uses an explicit preallocated
:class:`KVCache` indexed by position (prefill, then one-token decode steps): pass ``cache=`` to
``forward`` and the keys/values of the new positions are written at ``cache.pos`` onwards.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from scratchgpt.errors import ConfigError, GenerationError


@dataclass
class GPTConfig:
    """Hyperparameters of the GPT decoder."""

    vocab_size: int = 65
    block_size: int = 256  # longest context the model is trained on (learned positions need it)
    n_layer: int = 6
    n_head: int = 6
    n_embd: int = 384
    dropout: float = 0.0  # on embeddings, residual branches and (by default) attention weights
    # dropout on the attention weights alone (GPT-2's attn_pdrop); None = ``dropout``. On a CPU
    # it is the expensive kind (the fused attention kernel then takes a slower path), so
    # ``attn_dropout=0`` keeps most of dropout's regularisation at ~3% of a step.
    attn_dropout: float | None = None
    bias: bool = True  # biases in Linear and LayerNorm, as GPT-2
    pos_encoding: str = "learned"  # "learned" (GPT-2) or "sinusoidal" (Vaswani et al.)
    tie_weights: bool = True  # lm_head shares the token embedding matrix
    attn_impl: str = "sdpa"  # "sdpa" (fused F.scaled_dot_product_attention) or "math" (explicit)
    # "gelu_tanh" is GPT-2's tanh approximation; "gelu" (exact) is ~3.5x cheaper on CPUs
    activation: str = "gelu_tanh"
    layer_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.n_embd % self.n_head != 0:
            raise ConfigError(
                f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.attn_dropout is not None and not 0.0 <= self.attn_dropout < 1.0:
            raise ConfigError(f"attn_dropout must be in [0, 1), got {self.attn_dropout}")
        if self.pos_encoding not in ("learned", "sinusoidal"):
            raise ConfigError(
                f"pos_encoding must be 'learned' or 'sinusoidal', got {self.pos_encoding!r}")
        if self.activation not in ("gelu_tanh", "gelu"):
            raise ConfigError(f"activation must be 'gelu_tanh' or 'gelu', got {self.activation!r}")
        if self.attn_impl not in ("sdpa", "math"):
            raise ConfigError(f"attn_impl must be 'sdpa' or 'math', got {self.attn_impl!r}")

    def to_dict(self) -> dict:
        return asdict(self)


class KVCache:
    """Preallocated keys and values for every layer, indexed by absolute slot (a
    :class:`~scratchgpt.models.cache.DecodeCache`).

    ``k[l]``/``v[l]`` have shape (B, n_head, max_len, head_dim). Slots ``0 .. pos-1`` are filled.
    ``rollback(n)`` forgets everything from slot ``n`` on (used by speculative decoding).

    Prompts of different lengths share one cache by left padding (see :meth:`left_pad`): every
    row's newest token then sits in the same slot, so one decode step serves all rows.
    ``key_mask`` (B, max_len), if set, marks slots that hold real tokens (False = padding);
    ``pos_offset`` (B,) is subtracted from slot numbers to give each row's position ids, so a
    row's first real token has position 0 exactly as if it were alone.
    """

    rewinds = True  # any earlier length can be restored: slots past it are simply overwritten

    def __init__(self, n_layer: int, batch_size: int, n_head: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        shape = (n_layer, batch_size, n_head, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.pos = 0
        self.key_mask: Tensor | None = None
        self.pos_offset: Tensor | None = None
        self._causal: Tensor | None = None  # (max_len, max_len) bool, built on first need

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write a call's new keys/values (B, H, T, D) of ``layer`` at slots ``pos .. pos+T-1``;
        return the keys/values of slots ``0 .. pos+T-1`` (views, no copy)."""
        end = self.pos + k.size(2)
        self.k[layer, :, :, self.pos:end] = k
        self.v[layer, :, :, self.pos:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]  # (B, H, end, D)

    def attn_mask(self, T: int) -> Tensor | None:
        """Which slots the next ``T`` positions may attend to: bool (B or 1, 1, T, pos+T), True
        = may attend. None when no mask is needed: an empty cache without padding (plain
        causal attention) or one new token without padding (it sees every filled slot)."""
        if self.key_mask is None and (self.pos == 0 or T == 1):
            return None
        end = self.pos + T
        if self.key_mask is None:  # the common case of a scoring call: a view, no new tensor
            return self._causal_table()[None, None, self.pos:end, :end]  # (1, 1, T, end)
        if T == 1:  # one new token sees every filled slot except padding
            return self.key_mask[:, None, None, :end]  # (B, 1, 1, end)
        q_slot = torch.arange(self.pos, end, device=self.k.device)[:, None]  # (T, 1)
        k_slot = torch.arange(end, device=self.k.device)[None, :]  # (1, end)
        # Nobody attends to padding. A padding query attends to itself alone, so its softmax
        # row is not empty (an all-masked row gives NaN, which would leak into the cache).
        return (k_slot <= q_slot) & (self.key_mask[:, None, None, :end] | (k_slot == q_slot))

    def _causal_table(self) -> Tensor:
        if self._causal is None:
            ones = torch.ones(self.max_len, self.max_len, dtype=torch.bool, device=self.k.device)
            self._causal = ones.tril()  # [q, k]: slot q may see slot k <= q
        return self._causal

    def rollback(self, pos: int) -> None:
        """Discard cached positions ``pos`` and later; they will be overwritten."""
        if not 0 <= pos <= self.pos:
            raise ValueError(f"cannot roll back to {pos}: cache holds {self.pos} positions")
        self.pos = pos

    def left_pad(self, n_pad: Tensor | None) -> None:
        """Row ``b`` starts with ``n_pad[b]`` padding slots (n_pad: (B,) int, or None = none).

        Call it on an empty cache, before the prefill of the padded prompts."""
        if n_pad is None or not bool(n_pad.any()):
            self.key_mask = self.pos_offset = None
            return
        n_pad = n_pad.to(self.k.device)
        slots = torch.arange(self.max_len, device=self.k.device)  # (max_len,)
        self.key_mask = slots[None, :] >= n_pad[:, None]  # (B, max_len)
        self.pos_offset = n_pad

    def select_rows(self, rows: Tensor) -> None:
        """Row ``i`` becomes a copy of row ``rows[i]`` (1-D indices): drops finished sequences,
        or reorders beams."""
        self.k, self.v = self.k[:, rows], self.v[:, rows]
        if self.key_mask is not None:
            self.key_mask, self.pos_offset = self.key_mask[rows], self.pos_offset[rows]


def sinusoidal_positions(n_pos: int, dim: int) -> Tensor:
    """The fixed sin/cos position table of "Attention Is All You Need": (n_pos, dim)."""
    pos = torch.arange(n_pos, dtype=torch.float32)[:, None]  # (n_pos, 1)
    inv_freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(n_pos, dim)
    table[:, 0::2] = torch.sin(pos * inv_freq)
    table[:, 1::2] = torch.cos(pos * inv_freq[: dim // 2])
    return table


def attention_math(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
                   dropout_p: float = 0.0) -> tuple[Tensor, Tensor]:
    """Attention written out: dropout(softmax(q k^T / sqrt(d) + mask)) v.

    q: (B, H, Tq, D), k/v: (B, H, Tk, D), mask: bool (B or 1, 1, Tq, Tk), True = may attend.
    Returns the output (B, H, Tq, D) and the attention weights (B, H, Tq, Tk).
    """
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))  # (B, H, Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return F.dropout(weights, dropout_p) @ v, weights


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with one fused QKV projection."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.head_dim = cfg.n_embd // cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.attn_dropout = cfg.dropout if cfg.attn_dropout is None else cfg.attn_dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.impl = cfg.attn_impl

    def forward(self, x: Tensor, mask: Tensor | None = None, cache: KVCache | None = None,
                layer: int = 0, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """x: (B, T, C). ``mask`` (bool, broadcastable to (B, 1, T, Tk)) or None for plain causal.

        With ``cache``, this call's keys/values are written at slots ``cache.pos ..`` and the
        queries attend over slots ``0 .. cache.pos + T - 1``.
        """
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)  # 3 x (B, T, C)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        v = v.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        if cache is not None:
            k, v = cache.update(layer, k, v)  # (B, H, pos + T, D): the cached past and these
        # mask None: plain causal when queries and keys are the same positions; a single
        # decoded token (T == 1 < Tk) sees every cached key, so it needs no mask at all.
        causal = mask is None and T == k.size(2)
        weights = None
        if self.impl == "math" or need_weights:
            if causal:
                mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y, weights = attention_math(q, k, v, mask, self.attn_dropout if self.training else 0.0)
        else:
            dtype = q.dtype
            upcast = dtype == torch.bfloat16 and q.device.type == "cpu"
            if upcast:
                # PyTorch's CPU flash-attention kernel is ~2.5x slower in bf16 than in fp32
                # (measured, fwd + bwd): the projections stay bf16 and only this kernel runs in
                # fp32. Autocast must be off here, or it would cast the inputs back to bf16.
                q, k, v = q.float(), k.float(), v.float()
            with torch.autocast(q.device.type, enabled=not upcast and torch.is_autocast_enabled(
                    q.device.type)):
                y = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, is_causal=causal,
                    dropout_p=self.attn_dropout if self.training else 0.0,
                )
            y = y.to(dtype)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, H, T, D) -> (B, T, C)
        return self.resid_dropout(self.c_proj(y)), weights


class MLP(nn.Module):
    """Position-wise feed-forward: Linear(C, 4C) -> GELU -> Linear(4C, C)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.act = nn.GELU(approximate="tanh" if cfg.activation == "gelu_tanh" else "none")
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm transformer block with residual connections."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor, mask: Tensor | None = None, cache: KVCache | None = None,
                layer: int = 0, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        a, weights = self.attn(self.ln_1(x), mask, cache, layer, need_weights)
        x = x + a
        x = x + self.mlp(self.ln_2(x))
        return x, weights


class GPT(nn.Module):
    """GPT decoder language model: ``forward(idx) -> logits``."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.config = cfg
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
            drop=nn.Dropout(cfg.dropout),
            h=nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)]),
            ln_f=nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps, bias=cfg.bias),
        ))
        if cfg.pos_encoding == "learned":
            self.transformer["wpe"] = nn.Embedding(cfg.block_size, cfg.n_embd)
        else:  # fixed table, not a parameter; not saved (it is recomputed from the config)
            self.register_buffer("sinusoid", sinusoidal_positions(cfg.block_size, cfg.n_embd),
                                 persistent=False)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.lm_head.weight = self.transformer.wte.weight
        self.apply(self._init_weights)
        # GPT-2: scale the init of residual projections by 1/sqrt(2 * n_layer), so the residual
        # stream's variance does not grow with depth.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; by default without position embeddings (as GPT-2 papers count)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and "wpe" in self.transformer:
            n -= self.transformer.wpe.weight.numel()
        return n

    def decode_layout_(self) -> GPT:
        """Lay out each Linear weight as one-token steps read it fastest; returns self.

        A decode step multiplies one row vector by every weight matrix, so its speed is how
        fast the weights stream from memory. ``F.linear`` computes ``x @ W.T``; CPU BLAS streams
        a wide matrix (more outputs than inputs: c_attn, c_fc, lm_head) about 1.3-1.6x faster
        when ``W.T`` is contiguous, i.e. ``W`` column-major, and a tall one (mlp.c_proj) faster
        row-major (measured in docs/bench_generate.md). Only memory order changes: same values,
        same shapes, the model still trains and saves."""
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear) and module.out_features > module.in_features:
                    # a tied lm_head is the Parameter of wte too, so both see the new layout
                    module.weight.data = module.weight.data.t().contiguous().t()
        return self

    def new_cache(self, batch_size: int, max_len: int | None = None,
                  dtype: torch.dtype | None = None) -> KVCache:
        """A KV cache for ``batch_size`` sequences of up to ``max_len`` (default block_size)."""
        cfg = self.config
        max_len = max_len or cfg.block_size
        if max_len > cfg.block_size:
            raise GenerationError(
                f"cache length {max_len} exceeds the model's block_size {cfg.block_size}")
        p = self.transformer.wte.weight  # dtype and device of the model
        return KVCache(cfg.n_layer, batch_size, cfg.n_head, max_len, cfg.n_embd // cfg.n_head,
                       dtype=dtype or p.dtype, device=p.device)

    def _positions(self, T: int, cache: KVCache | None, device: torch.device) -> Tensor:
        """Position ids: (T,) shared by all rows, or (B, T) when rows have left padding."""
        start = cache.pos if cache is not None else 0
        pos = torch.arange(start, start + T, device=device)  # (T,)
        if cache is not None and cache.pos_offset is not None:
            pos = (pos[None, :] - cache.pos_offset[:, None]).clamp_min(0)  # (B, T)
        return pos

    def _mask(self, T: int, cache: KVCache | None) -> Tensor | None:
        """Attention mask (B or 1, 1, T, Tk), True = may attend; None: causal, or none needed."""
        return None if cache is None else cache.attn_mask(T)

    def forward(self, idx: Tensor, cache: KVCache | None = None) -> Tensor:
        """idx: (B, T) token ids -> logits (B, T, vocab_size).

        With ``cache``, ``idx`` continues the cached sequence and ``cache.pos`` advances by T.
        """
        return self._forward(idx, cache)[0]

    def forward_with_attention(self, idx: Tensor) -> tuple[Tensor, list[Tensor]]:
        """Like ``forward`` but via the plain-math path, also returning each layer's attention
        weights, a list of n_layer tensors (B, n_head, T, T)."""
        logits, weights = self._forward(idx, None, need_weights=True)
        return logits, weights

    def _forward(self, idx: Tensor, cache: KVCache | None,
                 need_weights: bool = False) -> tuple[Tensor, list[Tensor]]:
        B, T = idx.shape
        start = cache.pos if cache is not None else 0
        limit = cache.max_len if cache is not None else self.config.block_size
        if start + T > limit:
            raise GenerationError(
                f"sequence of {start + T} tokens exceeds the context of {limit} positions"
            )
        pos = self._positions(T, cache, idx.device)
        tok_emb = self.transformer.wte(idx)  # (B, T, C)
        if self.config.pos_encoding == "learned":
            pos_emb = self.transformer.wpe(pos)  # (T, C) or (B, T, C)
        else:
            pos_emb = self.sinusoid[pos]
        x = self.transformer.drop(tok_emb + pos_emb)
        mask = self._mask(T, cache)
        all_weights = []
        for i, block in enumerate(self.transformer.h):
            x, w = block(x, mask, cache, i, need_weights)
            if w is not None:
                all_weights.append(w)
        if cache is not None:
            cache.pos += T
        x = self.transformer.ln_f(x)
        return self.lm_head(x), all_weights  # (B, T, vocab_size)
