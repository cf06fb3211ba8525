"""The GPT decoder, readable top to bottom.

    idx (B, T) -> wte + wpe -> n_layer x Block -> ln_f -> lm_head -> logits (B, T, vocab)
    Block: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))          (pre-LayerNorm, residuals)

That is GPT-2, every default of :class:`GPTConfig`. Its options: fixed sinusoidal positions, or
rotary ones (RoPE: queries and keys turned by position inside attention, nothing added to the
input); QK-norm; ReLU and ReLU^2 MLPs; zero-initialized output projections; value embeddings;
U-net skips; logit soft-capping; and, to build the model up part by part, blocks without
residuals, without LayerNorms or without an MLP, and PyTorch's default initialisation in place
of GPT-2's. models/gpt_numpy.py is the same forward pass in NumPy, option by option.

Parameter names follow GPT-2 (``wte``, ``wpe``, ``h.N.attn.c_attn``, ``c_proj``, ``ln_f``) so that
importing a GPT-2 checkpoint is a near-identity mapping. Generation uses an explicit preallocated
:class:`KVCache` indexed by position (prefill, then one-token decode steps): pass ``cache=`` to
``forward`` and the keys/values of the new positions are written at ``cache.pos`` onwards.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from scratchgpt.errors import GenerationError
from scratchgpt.models import attention_kernel, fused_block
from scratchgpt.models.cache import moved_rows
from scratchgpt.models.configs.gpt import GPTConfig
from scratchgpt.models.dropout import Dropout, dropout
from scratchgpt.models.layers import apply_rope, make_activation, rope_tables, value_embed_table
from scratchgpt.models.positions import sinusoidal_positions


def gpt2_incompatibility(cfg: GPTConfig | Mapping[str, Any]) -> str | None:
    """Why a GPT of this config cannot be written as a GPT-2 model (Hugging Face, GGUF), or None
    when it can. The reason is one line that names the flag:

    >>> gpt2_incompatibility(GPTConfig(qk_norm=True))
    '--qk-norm: GPT-2 does not normalize queries and keys'
    >>> gpt2_incompatibility(GPTConfig(zero_init_proj=True)) is None  # only an initialization
    True
    """
    if not isinstance(cfg, GPTConfig):
        cfg = GPTConfig(**cfg)
    reasons = (
        (not cfg.bias, "--no-bias: GPT-2 always has biases"),
        (cfg.pos_encoding != "learned", f"--pos-encoding {cfg.pos_encoding}: GPT-2 learns a "
                                        "table of position embeddings"),
        (cfg.activation not in ("gelu_tanh", "gelu"), f"--activation {cfg.activation}: GPT-2's "
                                                      "MLP uses GELU"),
        (cfg.qk_norm, "--qk-norm: GPT-2 does not normalize queries and keys"),
        (cfg.value_embeds > 0, "--value-embeds: GPT-2 has no value embeddings"),
        (cfg.unet_skips, "--unet-skips: GPT-2 has no skip connections between layers"),
        (cfg.logit_softcap > 0, "--logit-softcap: GPT-2 does not cap its logits"),
        (not cfg.residual, "--no-residual: GPT-2's blocks have residual connections"),
        (not cfg.layernorm, "--no-layernorm: GPT-2 has LayerNorms"),
        (not cfg.mlp, "--no-mlp: GPT-2's blocks have an MLP"),
    )
    return next((why for bad, why in reasons if bad), None)


def sliding_batch_slots(context: int) -> int:
    """Slots a batch's cache holds when it generates past ``context``: a quarter of a context
    more, so that the padding its rows' windows leave as they slide, each at its own length,
    is dropped once every many steps, not at each (:meth:`KVCache.reserve`, ``trim``).

    >>> sliding_batch_slots(256)
    320
    """
    return context + context // 4


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
        self._layers()
        self.max_len = max_len
        self.pos = 0
        self.key_mask: Tensor | None = None
        self.pos_offset: Tensor | None = None
        self._causal: Tensor | None = None  # (max_len, max_len) bool, built on first need

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    def _layers(self) -> None:
        # each layer's (B, H, max_len, D) view, made once: a decode step then indexes no
        # more than one dimension per read or write (each indexing op costs dispatch time)
        # (one select per layer rather than unbind: unbind's views may not be written under
        # grad mode when they were made without it, and a cache outlives such switches)
        self.k_layers = [self.k[i] for i in range(self.k.shape[0])]
        self.v_layers = [self.v[i] for i in range(self.v.shape[0])]

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write a call's new keys/values (B, H, T, D) of ``layer`` at slots ``pos .. pos+T-1``;
        return the keys/values of slots ``0 .. pos+T-1`` (views, no copy)."""
        T, end = k.size(2), self.pos + k.size(2)
        k_all, v_all = self.k_layers[layer], self.v_layers[layer]  # (B, H, max_len, D)
        k_all.narrow(2, self.pos, T).copy_(k)
        v_all.narrow(2, self.pos, T).copy_(v)
        return k_all.narrow(2, 0, end), v_all.narrow(2, 0, end)  # (B, H, end, D)

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
        q_slot = torch.arange(self.pos, end, device=self.k.device)  # (T,)
        return slot_mask(q_slot, end, self.key_mask[:, :end])  # (B, 1, T, end)

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
        or reorders beams. Copies the filled slots only."""
        pads = None if self.pos_offset is None else self.pos_offset[rows]
        old_k, old_v = self._filled()
        self.k, self.v = self._empty(len(rows)), self._empty(len(rows))
        self.k[:, :, :, : self.pos], self.v[:, :, :, : self.pos] = old_k[:, rows], old_v[:, rows]
        self._layers()
        self.left_pad(pads)

    def reorder_beams(self, rows: Tensor) -> None:
        """:meth:`select_rows` for beam search, where the batch keeps its size (row ``i``
        continues beam ``rows[i]``), in place: only the rows that take another row's place are
        copied, and only their filled slots (a row that keeps its beam is not touched, where a
        new cache with every row copied cost a share of each step). Any other ``rows`` go
        through :meth:`select_rows`."""
        if len(rows) != self.batch_size:
            self.select_rows(rows)
            return
        rows = rows.to(self.k.device)
        found = moved_rows(rows)
        if found is None:
            return
        moved, taken = found
        for held in self._filled():  # (L, B, H, pos, D) views of the buffers
            held[:, moved] = held[:, taken]
        if self.pos_offset is not None:
            self.left_pad(self.pos_offset[rows])

    def reserve(self, max_len: int) -> None:
        """Hold up to ``max_len`` slots (more than now; the filled ones are kept). Slots are not
        positions: rows padded in front may take more slots than the model's context, and a
        batch past the context reserves a quarter of one more, so that the padding the rows'
        windows leave is dropped (:meth:`trim`) once every many steps, not at each."""
        if max_len <= self.max_len:
            return
        k, v = self._empty(self.batch_size, max_len), self._empty(self.batch_size, max_len)
        k[:, :, :, : self.pos], v[:, :, :, : self.pos] = self._filled()
        pads = None if self.pos_offset is None else self.pos_offset
        self.k, self.v, self.max_len, self._causal = k, v, max_len, None
        self._layers()
        self.left_pad(pads)

    # ---- continuous batching (the JoinableCache interface of models/cache.py)

    def pad_counts(self) -> Tensor:
        """Padding slots at the front of each row, (B,) int64."""
        if self.pos_offset is None:
            return torch.zeros(self.batch_size, dtype=torch.long, device=self.k.device)
        return self.pos_offset

    def append_rows(self, other: KVCache) -> None:
        """Add ``other``'s rows after these, aligned at their ends: both continue at slot
        ``max(self.pos, other.pos)``, the shorter side's rows padded by the difference (zeros
        in the padding slots, masked by ``key_mask``). The capacity becomes the larger
        ``max_len``. One copy of each side's filled slots."""
        pos, max_len = max(self.pos, other.pos), max(self.max_len, other.max_len)
        b = self.batch_size
        k, v = self._empty(b + other.batch_size, max_len), self._empty(b + other.batch_size,
                                                                       max_len)
        pads = []
        for rows, cache in ((slice(0, b), self), (slice(b, None), other)):
            shift = pos - cache.pos  # extra padding slots in front of these rows
            old_k, old_v = cache._filled()
            k[:, rows, :, :shift], v[:, rows, :, :shift] = 0, 0
            k[:, rows, :, shift:pos], v[:, rows, :, shift:pos] = old_k, old_v
            pads.append(cache.pad_counts().to(self.k.device) + shift)
        self.k, self.v, self.max_len, self.pos, self._causal = k, v, max_len, pos, None
        self._layers()
        self.left_pad(torch.cat(pads))

    def trim(self, n: int) -> None:
        """Drop the first ``n`` slots, padding in every row; ``pos`` goes down by ``n``. In
        place: the filled slots move to the front of the same buffers (the slots after them
        keep finite old values, masked)."""
        if n == 0:
            return
        pads = self.pad_counts() - n
        if not 0 < n <= self.pos or bool((pads < 0).any()):
            raise ValueError(f"cannot trim {n} slots: every row must have that much padding")
        end = self.pos - n
        for buf in (self.k, self.v):  # (a copy first: the two ranges overlap)
            buf[:, :, :, :end] = buf[:, :, :, n:self.pos].clone()
        self.pos = end
        self.left_pad(pads)

    def replace_rows(self, rows: Tensor, other: KVCache) -> None:
        """Row ``rows[i]`` becomes ``other``'s row ``i``, aligned at their ends: ``other``'s
        filled slots land in the last ``other.pos`` filled slots here (``other.pos <=
        self.pos``), and the slots before them become padding of those rows. The other rows
        are left as they are; one copy of ``other``'s filled slots, none of the rest."""
        shift = self.pos - other.pos
        if shift < 0 or other.batch_size != len(rows):
            raise ValueError(f"cannot put {other.batch_size} rows of {other.pos} slots in "
                             f"place of rows {rows.tolist()} of a cache of {self.pos}")
        rows = rows.to(self.k.device)
        old_k, old_v = other._filled()
        self.k[:, rows, :, shift:self.pos], self.v[:, rows, :, shift:self.pos] = old_k, old_v
        pads = self.pad_counts().clone()
        pads[rows] = other.pad_counts().to(self.k.device) + shift
        self.left_pad(pads)

    def _empty(self, batch_size: int, max_len: int | None = None) -> Tensor:
        """Zeroed storage like ``k`` for ``batch_size`` rows. Zeros, not uninitialized memory:
        a compiled step (:meth:`GPT.decode_static`) reads every slot, masked, and a NaN left
        in an unfilled slot would survive the mask (0 x NaN is NaN)."""
        L, _, H, _, D = self.k.shape
        return self.k.new_zeros((L, batch_size, H, max_len or self.max_len, D))

    def _filled(self) -> tuple[Tensor, Tensor]:
        """Views of the filled slots of ``k`` and ``v``, (L, B, H, pos, D)."""
        return self.k[:, :, :, : self.pos], self.v[:, :, :, : self.pos]


def slot_mask(q_slot: Tensor, n_slots: int, key_mask: Tensor) -> Tensor:
    """Which of the first ``n_slots`` cache slots each query may attend to: q_slot (T,) the
    queries' slots, key_mask (B, n_slots) bool the slots holding real tokens -> bool
    (B, 1, T, n_slots), True = may attend.

    Causal, and nobody attends to padding. A padding query attends to itself alone, so its
    softmax row is not empty (an all-masked row gives NaN, which would leak into the cache)."""
    q = q_slot[:, None]  # (T, 1)
    k = torch.arange(n_slots, device=q_slot.device)[None, :]  # (1, n_slots)
    return (k <= q) & (key_mask[:, None, None, :] | (k == q))


class _SlotWriter:
    """The cache interface a Block uses, over whole cache buffers: writes a call's keys and
    values at ``slot`` (a tensor, not a Python int, so a compiled graph does not depend on its
    value) and returns all ``max_len`` slots; the call's mask hides those not filled."""

    def __init__(self, k: Tensor, v: Tensor, slot: Tensor):
        self.k, self.v, self.slot = k, v, slot  # (L, B, H, max_len, D), (L, ...), (T,)

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """k, v: (B, H, T, D) -> this layer's whole buffers (B, H, max_len, D)."""
        k_all, v_all = self.k[layer], self.v[layer]
        k_all.index_copy_(2, self.slot, k)
        v_all.index_copy_(2, self.slot, v)
        return k_all, v_all


def attention_math(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
                   dropout_p: float = 0.0) -> tuple[Tensor, Tensor]:
    """Attention written out: dropout(softmax(q k^T / sqrt(d) + mask)) v.

    q: (B, H, Tq, D), k/v: (B, H, Tk, D), mask: bool (B or 1, 1, Tq, Tk), True = may attend.
    Returns the output (B, H, Tq, D) and the attention weights (B, H, Tq, Tk).
    """
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))  # (B, H, Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    # softmax in at least fp32 (bf16 would lose the small weights)
    weights = torch.softmax(scores, dim=-1,
                            dtype=torch.promote_types(scores.dtype, torch.float32)).to(q.dtype)
    return dropout(weights, dropout_p) @ v, weights


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with one fused QKV projection.

    Options: ``qk_norm`` RMS-normalizes each head's queries and keys; RoPE (``rope=(cos, sin)``
    in ``forward``) rotates them by position; a value embedding (``ve``) is mixed into the
    values of the layers that have one (``uses_ve``)."""

    def __init__(self, cfg: GPTConfig, uses_ve: bool = False):
        super().__init__()
        self.n_head = cfg.n_head
        self.head_dim = cfg.n_embd // cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.attn_dropout = cfg.dropout if cfg.attn_dropout is None else cfg.attn_dropout
        self.resid_dropout = Dropout(cfg.dropout)
        self.impl = cfg.attn_impl
        self.q_norm = self.k_norm = None
        if cfg.qk_norm:  # over each head's features, with a learned gain (init 1)
            self.q_norm = nn.RMSNorm(self.head_dim, eps=cfg.layer_norm_eps)
            self.k_norm = nn.RMSNorm(self.head_dim, eps=cfg.layer_norm_eps)
        # weight of the value embedding in the values: v = (1 - a) v + a ve
        self.ve_lambda = nn.Parameter(torch.tensor(0.5)) if uses_ve else None

    def _qkv(self, qkv: Tensor, rope: tuple[Tensor, Tensor] | None,
             ve: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """qkv: the projection (B, T, 3C) -> q, k, v: 3 x (B, H, T, D), with this layer's
        options applied."""
        B, T, _ = qkv.shape
        # one view and one permute give all three (B, H, T, D) views: fewer ops than splitting
        # first, the same strides (a decode step is short enough that op count matters)
        qkv = qkv.view(B, T, 3, self.n_head, self.head_dim)  # (B, T, 3, H, D)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, H, T, D)
        if ve is not None:
            ve = ve.to(v.dtype).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
            v = (1 - self.ve_lambda) * v + self.ve_lambda * ve  # (B, H, T, D)
        # (the .to()s matter only under autocast: norms and rotation run in fp32 there, and
        # attention needs q, k, v in one dtype)
        if self.q_norm is not None:
            w = self.q_norm.weight.dtype
            q, k = self.q_norm(q.to(w)).to(v.dtype), self.k_norm(k.to(w)).to(v.dtype)
        if rope is not None:
            # queries and keys rotated together: one op per step of the rotation, not two
            q, k = apply_rope(torch.stack((q, k)), *rope).to(v.dtype).unbind(0)  # 2 x (B, H, T, D)
        return q, k, v

    def forward(self, x: Tensor, mask: Tensor | None = None, cache: KVCache | None = None,
                layer: int = 0, need_weights: bool = False,
                rope: tuple[Tensor, Tensor] | None = None,
                ve: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """x: (B, T, C). ``mask`` (bool, broadcastable to (B, 1, T, Tk)) or None for plain causal.

        With ``cache``, this call's keys/values are written at slots ``cache.pos ..`` and the
        queries attend over slots ``0 .. cache.pos + T - 1``. ``rope``: cos and sin of this
        call's positions, (T, D/2) or (B, 1, T, D/2). ``ve``: this layer's value embedding of
        the tokens (B, T, C).
        """
        B, T, C = x.shape
        qkv = self.c_attn(x)  # (B, T, 3C)
        # scratchgpt's own CPU kernel (models/attention_kernel.py) for plain causal attention
        kernel = (cache is None and mask is None and not need_weights and self._kernel_fits()
                  and attention_kernel.usable(qkv, self.head_dim))
        if kernel and ve is None and self.q_norm is None and (rope is None or rope[0].dim() == 2):
            # the kernel reads q, k and v from the projection itself (and turns q and k by
            # rotary positions: one table for every row, (T, D/2))
            return self._project(attention_kernel.attention_qkv(qkv, self.n_head, rope)), None
        q, k, v = self._qkv(qkv, rope, ve)  # 3 x (B, H, T, D)
        if kernel:
            return self._project(attention_kernel.attention(q, k, v)), None  # (B, T, C)
        if cache is not None:
            k, v = cache.update(layer, k, v)  # (B, H, pos + T, D): the cached past and these
        # mask None: plain causal when queries and keys are the same positions; a single
        # decoded token (T == 1 < Tk) sees every cached key, so it needs no mask at all.
        causal = mask is None and T == k.size(2)
        weights = None
        # With dropout on its weights, PyTorch's CPU attention kernel runs the written-out form
        # with a mask drawn element by element: the same form here, with the cheaper mask of
        # models/dropout.py, takes ~20% less time (docs/BENCHMARKS.md, "Dropout made cheap")
        drops_weights = self.training and self.attn_dropout > 0 and x.device.type == "cpu"
        if self.impl == "math" or need_weights or drops_weights:
            if causal:
                mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y, weights = attention_math(q, k, v, mask, self.attn_dropout if self.training else 0.0)
        else:
            y = self._sdpa(q, k, v, mask, causal)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, H, T, D) -> (B, T, C)
        return self._project(y), weights

    def _kernel_fits(self) -> bool:
        """The fused kernel is asked for and no dropout hides attention weights (the CPU
        kernel has none)."""
        return self.impl == "sdpa" and not (self.training and self.attn_dropout > 0)

    def _project(self, y: Tensor) -> Tensor:
        """The heads side by side (B, T, C) -> the output projection (B, T, C)."""
        y = self.c_proj(y)
        return self.resid_dropout(y) if self.training else y

    def _sdpa(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
              causal: bool) -> Tensor:
        """The fused attention kernel: q (B, H, Tq, D), k/v (B, H, Tk, D) -> (B, H, Tq, D)."""
        dtype, device = q.dtype, q.device.type
        dropout_p = self.attn_dropout if self.training else 0.0
        if dtype == torch.bfloat16 and device == "cpu":
            # PyTorch's CPU flash-attention kernel is ~2.5x slower in bf16 than in fp32
            # (measured, fwd + bwd): the projections stay bf16 and only this kernel runs in
            # fp32. Autocast must be off here, or it would cast the inputs back to bf16.
            with torch.autocast(device, enabled=False):
                return F.scaled_dot_product_attention(
                    q.float(), k.float(), v.float(), attn_mask=mask, is_causal=causal,
                    dropout_p=dropout_p).to(dtype)
        # (no autocast context unless one is on: entering one costs as much as a small kernel)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                              dropout_p=dropout_p)


class MLP(nn.Module):
    """Position-wise feed-forward: Linear(C, 4C) -> activation -> Linear(4C, C)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.act = make_activation(cfg.activation)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        y = self.c_proj(self.act(self.c_fc(x)))
        return self.dropout(y) if self.training else y  # (eval: dropout is the identity)


def layer_norm(cfg: GPTConfig) -> nn.Module:
    """A LayerNorm over the embedding, or the identity when the model has none."""
    if not cfg.layernorm:
        return nn.Identity()
    return nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps, bias=cfg.bias)


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)).

    Without residuals each sublayer's output replaces x; without an MLP the block is attention
    alone (``mlp`` and ``ln_2`` are None)."""

    def __init__(self, cfg: GPTConfig, uses_ve: bool = False):
        super().__init__()
        self.ln_1 = layer_norm(cfg)
        self.attn = CausalSelfAttention(cfg, uses_ve)
        self.ln_2 = layer_norm(cfg) if cfg.mlp else None
        self.mlp = MLP(cfg) if cfg.mlp else None
        self.residual = cfg.residual

    def forward(self, x: Tensor, mask: Tensor | None = None, cache: KVCache | None = None,
                layer: int = 0, need_weights: bool = False,
                rope: tuple[Tensor, Tensor] | None = None,
                ve: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        if mask is None and cache is None and ve is None and not need_weights:
            # training under CPU bf16 autocast: the same numbers, with less bookkeeping
            out = fused_block.block_forward(self, x, rope)
            if out is not None:
                return out, None
        a, weights = self.attn(self.ln_1(x), mask, cache, layer, need_weights, rope, ve)
        x = x + a if self.residual else a
        if self.mlp is not None:
            m = self.mlp(self.ln_2(x))
            x = x + m if self.residual else m
        return x, weights


class GPT(nn.Module):
    """GPT decoder language model: ``forward(idx) -> logits``."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.config = cfg
        # per layer, the value-embedding table it reads (None: none)
        self.ve_table = [value_embed_table(i, cfg.n_layer, cfg.value_embeds)
                         for i in range(cfg.n_layer)]
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
            drop=Dropout(cfg.dropout if cfg.embd_dropout is None else cfg.embd_dropout),
            h=nn.ModuleList([Block(cfg, t is not None) for t in self.ve_table]),
            ln_f=layer_norm(cfg),
        ))
        if cfg.pos_encoding == "learned":
            self.transformer["wpe"] = nn.Embedding(cfg.block_size, cfg.n_embd)
        # fixed tables are buffers, not parameters; not saved (recomputed from the config)
        elif cfg.pos_encoding == "sinusoidal":
            self.register_buffer("sinusoid", sinusoidal_positions(cfg.block_size, cfg.n_embd),
                                 persistent=False)
        else:  # rope: cos and sin of every position's angles, (block_size, head_dim / 2)
            cos, sin = rope_tables(cfg.block_size, cfg.n_embd // cfg.n_head)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        if cfg.value_embeds:
            self.transformer["ve"] = nn.ModuleList(
                [nn.Embedding(cfg.vocab_size, cfg.n_embd) for _ in range(cfg.value_embeds)])
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.lm_head.weight = self.transformer.wte.weight
        # U-net: weight of each skip connection, one per second-half block that receives one
        self.skip_weights = nn.Parameter(torch.ones(cfg.n_layer // 2)) if cfg.unet_skips else None
        gpt2_init = cfg.weight_init == "gpt2"  # else keep what each torch module drew itself
        if gpt2_init:
            self.apply(self._init_weights)
        # GPT-2: scale the init of residual projections by 1/sqrt(2 * n_layer), so the residual
        # stream's variance does not grow with depth. zero_init_proj: start them at zero.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                if cfg.zero_init_proj:
                    nn.init.zeros_(p)
                elif gpt2_init:
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
        """Parameter count; by default without the lookup tables that are not also the output
        head: position embeddings (as GPT-2 papers count) and value embeddings."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            tables = [m for name, m in self.transformer.named_modules()
                      if isinstance(m, nn.Embedding) and name != "wte"]
            n -= sum(m.weight.numel() for m in tables)
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

    def forward(self, idx: Tensor, cache: KVCache | None = None,
                last_only: bool = False) -> Tensor:
        """idx: (B, T) token ids -> logits (B, T, vocab_size), or (B, 1, vocab_size) of the
        last position with ``last_only`` (the head runs on that position alone).

        With ``cache``, ``idx`` continues the cached sequence and ``cache.pos`` advances by T.
        """
        x, _ = self._hidden(idx, cache)  # (B, T, C)
        return self._head(x[:, -1:] if last_only else x)

    def forward_with_attention(self, idx: Tensor) -> tuple[Tensor, list[Tensor]]:
        """Like ``forward`` but via the plain-math path, also returning each layer's attention
        weights, a list of n_layer tensors (B, n_head, T, T)."""
        x, weights = self._hidden(idx, None, need_weights=True)  # (B, T, C)
        return self._head(x), weights

    def features(self, idx: Tensor) -> Tensor:
        """idx: (B, T) -> the final hidden states (B, T, C): after ``ln_f``, before ``lm_head``
        (what a classification head reads)."""
        return self._hidden(idx, None)[0]

    def _head(self, x: Tensor) -> Tensor:
        """Final hidden states (B, T, C) -> logits (B, T, vocab_size)."""
        logits = self.lm_head(x)  # (B, T, vocab_size)
        if self.config.logit_softcap:  # smoothly into (-cap, cap)
            cap = self.config.logit_softcap
            logits = cap * torch.tanh(logits / cap)
        return logits

    def decode_static(self, idx: Tensor, slot: Tensor, pos_offset: Tensor, key_mask: Tensor,
                      k: Tensor, v: Tensor) -> Tensor:
        """``forward`` on a :class:`KVCache` with every shape fixed by the cache, so that one
        ``torch.compile``'d graph serves every position (:mod:`.compiled`): the queries attend
        over the whole cache buffer, masked, and the slots are a tensor, not a Python int.

        idx (B, T) the new tokens; slot (T,) the cache slots they go into (consecutive);
        pos_offset (B,) each row's padding slots; key_mask (B, max_len) bool, the slots that
        hold real tokens; k, v (n_layer, B, H, max_len, D) the cache, written at ``slot``.
        Returns logits (B, T, vocab_size), what ``forward`` returns for the same call (the
        caller advances the cache's ``pos``)."""
        pos = (slot[None, :] - pos_offset[:, None]).clamp_min(0)  # (B, T) position ids
        mask = slot_mask(slot, k.size(3), key_mask)  # (B, 1, T, max_len): KVCache's rule
        x = self._embed(idx, pos)  # (B, T, C)
        # need_weights=True takes the written-out attention, which the compiler fuses into
        # its own loops (the weights are dropped): faster here than the fused SDPA kernel
        x, _ = self._blocks(x, idx, mask, _SlotWriter(k, v, slot), self._rope(pos), True)
        return self._head(self.transformer.ln_f(x))  # (B, T, vocab_size)

    def _hidden(self, idx: Tensor, cache: KVCache | None,
                need_weights: bool = False) -> tuple[Tensor, list[Tensor]]:
        """The blocks and the final LayerNorm: idx (B, T) -> (B, T, C), attention weights."""
        B, T = idx.shape
        start = cache.pos if cache is not None else 0
        limit = cache.max_len if cache is not None else self.config.block_size
        if start + T > limit:
            raise GenerationError(
                f"sequence of {start + T} tokens exceeds the context of {limit} positions"
            )
        pos = self._positions(T, cache, idx.device)
        x = self._embed(idx, pos)  # (B, T, C)
        if self.training:  # (eval: dropout is the identity)
            x = self.transformer.drop(x)
        mask = self._mask(T, cache)
        x, all_weights = self._blocks(x, idx, mask, cache, self._rope(pos), need_weights)
        if cache is not None:
            cache.pos += T
        return self.transformer.ln_f(x), all_weights

    def _embed(self, idx: Tensor, pos: Tensor) -> Tensor:
        """Token embeddings plus, unless positions enter by rotation (RoPE), position
        embeddings. idx: (B, T), pos: (T,) or (B, T) -> (B, T, C)."""
        tok_emb = self.transformer.wte(idx)  # (B, T, C)
        if self.config.pos_encoding == "learned":
            return tok_emb + self.transformer.wpe(pos)  # + (T, C) or (B, T, C)
        if self.config.pos_encoding == "sinusoidal":
            return tok_emb + self.sinusoid[pos]
        return tok_emb

    def _rope(self, pos: Tensor) -> tuple[Tensor, Tensor] | None:
        """cos and sin of the positions' rotations: (T, D/2) or, for per-row positions (B, T),
        (B, 1, T, D/2) so they broadcast over heads; None without RoPE."""
        if self.config.pos_encoding != "rope":
            return None
        cos, sin = self.rope_cos[pos], self.rope_sin[pos]  # (T, D/2) or (B, T, D/2)
        if pos.dim() == 2:
            cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, D/2)
        return cos, sin

    def _blocks(self, x: Tensor, idx: Tensor, mask: Tensor | None, cache: KVCache | None,
                rope: tuple[Tensor, Tensor] | None,
                need_weights: bool) -> tuple[Tensor, list[Tensor]]:
        """Run the blocks over x (B, T, C); returns the output and, with ``need_weights``,
        each layer's attention weights."""
        ve = [table(idx) for table in self.transformer.ve] if "ve" in self.transformer else []
        n_layer = self.config.n_layer
        n_skip = 0 if self.skip_weights is None else len(self.skip_weights)
        saved, all_weights = [], []  # saved: outputs of the first n_skip blocks (U-net)
        for i, block in enumerate(self.transformer.h):
            if i >= n_layer - n_skip:  # add the output of the mirror block: last saved first
                x = x + self.skip_weights[i - (n_layer - n_skip)] * saved.pop()
            table = self.ve_table[i]
            x, w = block(x, mask, cache, i, need_weights, rope,
                         None if table is None else ve[table])
            if i < n_skip:
                saved.append(x)
            if w is not None:
                all_weights.append(w)
        return x, all_weights


def with_vocabulary(model: GPT, n: int) -> GPT:
    """``model`` with its vocabulary cut to ids ``0 .. n - 1``, in place (the rows beyond them
    dropped from ``wte``, the value-embedding tables and an untied ``lm_head``; no weight is
    made anew): its next-token distribution is the original's with those ids masked out and
    the rest renormalised. For a model whose vocabulary was padded past its tokenizer's
    (nanoGPT's 50,304 for GPT-2's 50,257), so it can never emit an id the tokenizer cannot
    decode.

    >>> m = GPT(GPTConfig(vocab_size=8, block_size=4, n_layer=1, n_head=1, n_embd=4)).eval()
    >>> x = torch.tensor([[1, 2]])
    >>> before = m(x)[..., :6].softmax(-1)
    >>> torch.allclose(with_vocabulary(m, 6)(x).softmax(-1), before)
    True
    """
    tied = model.lm_head.weight is model.transformer.wte.weight
    tables = [model.transformer.wte, *model.transformer["ve"]] if "ve" in model.transformer \
        else [model.transformer.wte]
    for table in tables:  # (B, T) ids index their rows: ids below n never read the rest
        table.weight = nn.Parameter(table.weight.detach()[:n].clone())
        table.num_embeddings = n
    head = model.lm_head  # (..., C) -> (..., n)
    head.weight = model.transformer.wte.weight if tied else \
        nn.Parameter(head.weight.detach()[:n].clone())
    head.out_features = n
    model.config = replace(model.config, vocab_size=n)
    return model
