"""scratchgpt's own causal attention for training on AVX-512 CPUs, compiled on first use.

Why: at the small shapes a CPU trains (contexts of 64-256, heads of 32-64 features) PyTorch's
CPU attention spends more time around its arithmetic than in it. Its flash kernel takes
~1.07 ms a layer (forward and backward) at nanoGPT's CPU recipe shape on a 2-core Zen 4, about
40 GFLOP/s; in bf16 it is ~2.5x slower still, so a bf16 model casts q, k and v to fp32 for it
and back; and the heads must be transposed out of the QKV projection and back into the output
projection's layout, forward and backward. ``causal_attention.c`` (next to this file) reads q, k
and v straight from the projection's output in its own dtype, writes the output in the layout
the next projection reads, and writes the three gradients straight into one gradient of the
projection's output (docs/BENCHMARKS.md has the step times with and without it). A rotary
model's queries and keys are turned inside it, in fp32, rather than by several small
operations outside (:func:`attention_qkv`'s ``rope``); :func:`attention` takes q, k, v that
other options (QK-norm, value embeddings) have changed first.

How: the C file is compiled once per machine and loaded with :mod:`ctypes`
(:mod:`~scratchgpt.models.c_kernels` says where it is kept and how); it runs on PyTorch's own
threads. :func:`attention_qkv` is an autograd function of the projection's output;
:func:`qkv_forward` and :func:`qkv_backward` are its two directions as plain calls, for code
that writes its own backward (:mod:`~scratchgpt.models.fused_block`).

When it is used: on a CPU with AVX-512 and a C compiler, for plain causal attention over fp32 or
bf16 tensors whose heads have at most :data:`MAX_HEAD_DIM` features and whose context is at most
:data:`MAX_T` (its work space is per head, in each thread's cache), with no attention dropout,
no mask and no KV cache, outside ``torch.compile`` (which fuses attention its own way).
``SCRATCHGPT_ATTENTION_KERNEL=torch`` switches it off (PyTorch's
``scaled_dot_product_attention`` then runs, as it does wherever the kernel cannot be used).
:func:`describe` says which one a process uses.

>>> from scratchgpt.models.attention_kernel import describe
>>> describe() in ("scratchgpt AVX-512 causal attention", "torch scaled_dot_product_attention")
True
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from scratchgpt.models.c_kernels import check_allocated, load_library, profiled

SOURCE = Path(__file__).with_name("causal_attention.c")
MAX_T = 1024
MAX_HEAD_DIM = 256
_DTYPES = (torch.float32, torch.bfloat16)


@functools.cache
def load() -> Any:
    """The compiled library, or None where it cannot be used (see the module docstring)."""
    lib = load_library(SOURCE, "SCRATCHGPT_ATTENTION_KERNEL")
    if lib is None:
        return None
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.attention_forward.argtypes = [i, i, i, i, i, p, p, p, p, p, p, p, p, p, p, p, i]
    lib.attention_backward.argtypes = [i, i, i, i, i, p, p, p, p, p, p, p, p, p, p, p, p, i]
    lib.attention_forward.restype = lib.attention_backward.restype = i
    return lib


def describe() -> str:
    """Which causal attention this process trains with, in words (for benchmark reports)."""
    if load() is not None:
        return "scratchgpt AVX-512 causal attention"
    return "torch scaled_dot_product_attention"


def usable(x: Tensor, head_dim: int) -> bool:
    """Whether the kernel can compute causal attention over ``x`` (B, T, 3C), the fused
    projection's output, with heads of ``head_dim`` features."""
    return (x.device.type == "cpu" and x.dtype in _DTYPES and x.size(1) <= MAX_T
            and head_dim <= MAX_HEAD_DIM and not torch.compiler.is_compiling()
            and load() is not None)


def _strides(t: Tensor) -> tuple[int, ...]:
    """(sequence, head, time) strides of a (B, H, T, D) view, in elements."""
    return t.stride()[:3]


@functools.lru_cache(maxsize=256)
def _longs(values: tuple[int, ...]) -> ctypes.Array:
    """``values`` as a C array of longs, made once per distinct tuple: the kernel only reads it,
    and a training run meets a handful of layouts, call after call."""
    return (ctypes.c_long * len(values))(*values)


def _bf16(t: Tensor) -> bool:
    return t.dtype == torch.bfloat16


Shape = tuple[int, int, int, int]  # B, H, T, D
Rope = tuple[int, int] | tuple[None, None]  # the addresses of the cos and sin tables, or none


def _run_forward(bf16: bool, shape: Shape, ptrs: tuple[int, ...],
                 strides: tuple[ctypes.Array, ...], rope: Rope = (None, None)) -> None:
    """The C forward over (B, H, T, D) = ``shape``: ``ptrs`` are q, k, v, y and lse; ``strides``
    those of q, k, v and y (sequence, head, time); ``rope`` the rotary tables' addresses. The one
    place the forward is called."""
    q, k, v, y, lse = ptrs
    sq, sk, sv, sy = strides
    with profiled("attention_kernel.forward"):
        failed = load().attention_forward(bf16, *shape, q, sq, k, sk, v, sv, y, sy, lse, *rope,
                                          torch.get_num_threads())
    check_allocated(failed, "causal attention kernel")


def _run_backward(bf16: bool, shape: Shape, ptrs: tuple[int, ...], strides: ctypes.Array,
                  rope: Rope = (None, None)) -> None:
    """The C backward: ``ptrs`` are q, k, v, y, dy, lse, then dq, dk, dv (written);
    ``strides`` 3 per tensor in that order, lse left out."""
    with profiled("attention_kernel.backward"):
        failed = load().attention_backward(bf16, *shape, *ptrs, strides, *rope,
                                           torch.get_num_threads())
    check_allocated(failed, "causal attention kernel")


def _forward(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """q, k, v (B, H, T, D) views -> y (B, T, H, D) and lse (B, H, T), the log of each
    softmax's denominator (what the backward needs to recompute the weights)."""
    B, H, T, D = q.shape
    y = q.new_empty(B, T, H, D)
    lse = torch.empty(B, H, T, dtype=torch.float32)
    _run_forward(_bf16(q), (B, H, T, D), tuple(t.data_ptr() for t in (q, k, v, y, lse)),
                 tuple(_longs(_strides(t)) for t in (q, k, v, y.transpose(1, 2))))
    return y, lse


def _backward(saved: tuple[Tensor, ...], dy: Tensor, grads: tuple[Tensor, Tensor, Tensor]) -> None:
    """Writes dq, dk, dv into ``grads`` (three (B, H, T, D) views) from dy (B, T, H, D) and the
    forward's q, k, v, y, lse (``saved``)."""
    q, k, v, y, lse = saved
    views = (q, k, v, y.transpose(1, 2), dy.transpose(1, 2), *grads)
    ptrs = [t.data_ptr() for t in views]
    _run_backward(_bf16(q), tuple(q.shape), (*ptrs[:5], lse.data_ptr(), *ptrs[5:]),
                  _longs(sum((_strides(t) for t in views), ())))


@functools.lru_cache(maxsize=64)
def _qkv_layout(B: int, T: int, H: int, D: int) -> tuple[tuple[ctypes.Array, ...], ctypes.Array]:
    """The strides of q, k and v inside a contiguous (B, T, 3, H, D) projection and of y (B, T,
    H, D): the forward's four and the backward's eight. Computed once per shape: at the small
    shapes the kernel is for, building them from tensor views on every call cost about a
    tenth of the call."""
    qkv, y = (T * 3 * H * D, D, 3 * H * D), (T * H * D, D, H * D)
    return (_longs(qkv),) * 3 + (_longs(y),), _longs(qkv * 3 + y * 2 + qkv * 3)


def rope_tables_for(rope: tuple[Tensor, Tensor] | None, T: int, D: int) -> tuple[Tensor, ...]:
    """The rotary tables as the kernel reads them, (T, D/2) fp32 contiguous; () without. Any
    other shape is refused here: the C code would read past them."""
    if rope is None:
        return ()
    tables = tuple(t.float().contiguous() for t in rope)
    if any(t.shape != (T, D // 2) for t in tables):
        raise ValueError(f"rotary tables must be ({T}, {D // 2}) for {T} positions of heads of "
                         f"{D}, got {[tuple(t.shape) for t in tables]}")
    return tables


def qkv_forward(qkv: Tensor, n_head: int,
                tables: tuple[Tensor, ...] = ()) -> tuple[Tensor, Tensor]:
    """The kernel's forward straight from the fused projection: qkv (B, T, 3C) contiguous ->
    y (B, T, C) in qkv's dtype and lse (B, H, T) fp32, what :func:`qkv_backward` needs besides.
    ``tables``: the rotary tables from :func:`rope_tables_for`, or () without."""
    B, T, C3 = qkv.shape
    shape = (B, n_head, T, C3 // (3 * n_head))
    y = qkv.new_empty(B, T, C3 // 3)
    lse = torch.empty(B, n_head, T, dtype=torch.float32)
    base, step = qkv.data_ptr(), C3 // 3 * qkv.element_size()  # q, then k, then v
    _run_forward(_bf16(qkv), shape, (base, base + step, base + 2 * step, y.data_ptr(),
                                     lse.data_ptr()), _qkv_layout(B, T, n_head, shape[3])[0],
                 table_addresses(tables))
    return y, lse


def qkv_backward(qkv: Tensor, y: Tensor, lse: Tensor, dy: Tensor, n_head: int,
                 tables: tuple[Tensor, ...] = ()) -> Tensor:
    """The gradient of :func:`qkv_forward`'s qkv (B, T, 3C) from dy (B, T, C), contiguous, and
    what the forward gave and took."""
    B, T, C3 = qkv.shape
    D = C3 // (3 * n_head)
    dqkv = torch.empty_like(qkv)
    base, grad, step = qkv.data_ptr(), dqkv.data_ptr(), n_head * D * qkv.element_size()
    _run_backward(_bf16(qkv), (B, n_head, T, D),
                  (base, base + step, base + 2 * step, y.data_ptr(), dy.data_ptr(),
                   lse.data_ptr(), grad, grad + step, grad + 2 * step),
                  _qkv_layout(B, T, n_head, D)[1], table_addresses(tables))
    return dqkv


class _AttentionQKV(torch.autograd.Function):
    """qkv (B, T, 3C) -> y (B, T, C): the heads read from the projection's output (queries and
    keys turned by rotary positions when ``rope`` is given), and their gradients written into
    one gradient of it."""

    @staticmethod
    def forward(ctx: Any, qkv: Tensor, n_head: int, rope: tuple[Tensor, Tensor] | None) -> Tensor:
        qkv = qkv.contiguous()
        tables = rope_tables_for(rope, qkv.size(1), qkv.size(2) // (3 * n_head))
        y, lse = qkv_forward(qkv, n_head, tables)
        ctx.n_head = n_head
        ctx.save_for_backward(qkv, y, lse, *tables)
        return y

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple[Tensor, None, None]:
        qkv, y, lse, *tables = ctx.saved_tensors
        return qkv_backward(qkv, y, lse, dy.contiguous(), ctx.n_head, tuple(tables)), None, None


def table_addresses(tables: tuple[Tensor, ...]) -> Rope:
    """The cos and sin tables' addresses for the C calls, or (None, None) without them."""
    return (tables[0].data_ptr(), tables[1].data_ptr()) if tables else (None, None)


class _Attention(torch.autograd.Function):
    """q, k, v (B, H, T, D) -> y (B, T, C)."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        y, lse = _forward(q, k, v)
        ctx.save_for_backward(q, k, v, y, lse)
        return y.flatten(2)

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v, y, lse = ctx.saved_tensors
        grads = tuple(torch.empty_like(t) for t in (q, k, v))
        _backward((q, k, v, y, lse), dy.contiguous().view_as(y), grads)
        return grads


def attention_qkv(qkv: Tensor, n_head: int, rope: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """Causal multi-head attention straight from the fused projection's output.

    qkv: (B, T, 3C), fp32 or bf16, queries then keys then values, each C = n_head x D features
    (head-major, as ``CausalSelfAttention.c_attn`` lays them out). Returns (B, T, C) in qkv's
    dtype: each head's ``softmax(q k^T / sqrt(D), causal) v``, heads side by side. ``rope``:
    cos and sin of each of the T positions' angles, (T, D/2) each (rows of
    ``layers.rope_tables``): queries and keys are turned by them first, in fp32, as
    ``layers.apply_rope`` turns them. Needs :func:`usable`."""
    return _AttentionQKV.apply(qkv, n_head, rope)


def attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal attention of each head: q, k, v (B, H, T, D), one dtype, fp32 or bf16 -> (B, T,
    H x D), each head's ``softmax(q k^T / sqrt(D), causal) v``, heads side by side. For q, k, v
    an option has changed (rotary positions, QK-norm, value embeddings); needs :func:`usable`."""
    return _Attention.apply(q, k, v)
