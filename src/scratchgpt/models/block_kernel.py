"""A training block's bf16 forward and backward, each as one C call.

Why: a fused block (:mod:`~scratchgpt.models.fused_block`) runs its forward as eleven C calls
and its backward as fourteen: the LayerNorms, activation and residual adds
(:mod:`~scratchgpt.models.block_ops`), the products on AMX tiles or AVX512-BF16 dot products
(:mod:`~scratchgpt.models.tile_matmul`) and the attention
(:mod:`~scratchgpt.models.attention_kernel`). Between them Python allocates each result,
reads shapes and builds arguments: measured at nanoGPT's CPU recipe shape, about an eighth of
a training step, time in which the second core waits. ``block_kernel.c`` (next to this file)
runs the same C functions in the same order on the same threads in one call each way, into
buffers laid out here in one allocation per call, so the loss and every gradient are the
composed path's bit for bit (tests hold it to that). docs/BENCHMARKS.md has the step times.

When it is used: where the fused block's bf16 training runs on the C kernels with its products
on tiles or by dot products (a CPU with AMX or AVX512-BF16: :func:`tile_matmul.kind`), and
there in a bf16 evaluation too (the forward alone: the periodic estimates; an fp32
evaluation keeps PyTorch's fp32 products).
``SCRATCHGPT_BLOCK_KERNEL=python`` switches it off: the kernels are then called one by one
from Python, as elsewhere.

The buffers: :data:`KEPT` are written by the forward and read by the backward (bf16 but the
LayerNorms' statistics, the attention's lse and x1, fp32), :data:`FORWARD` and
:data:`BACKWARD` are each call's own; the enums of ``block_kernel.c`` list them in the same
order.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from scratchgpt.models import attention_kernel, block_ops, tile_matmul
from scratchgpt.models.c_kernels import check_allocated, load_library, profiled

SOURCE = Path(__file__).with_name("block_kernel.c")
SWITCH = "SCRATCHGPT_BLOCK_KERNEL"
ALIGN = 64  # bytes: each buffer starts on a cache line

# the buffers by name, in block_kernel.c's order
KEPT = ("h1", "mean1", "rstd1", "qkv", "y", "lse", "x1", "h2", "mean2", "rstd2", "f", "g",
        "bwd_qkv", "bwd_o", "bwd_fc", "bwd_p")
FORWARD = ("fwd_qkv", "fwd_o", "fwd_fc", "fwd_p", "b_qkv", "b_o", "b_fc", "b_p", "o", "p")
BACKWARD = ("d16", "dg", "df", "dh2", "dx1", "dx1_16", "dy", "dqkv", "dh1", "wg")
_FP32 = frozenset(("mean1", "rstd1", "lse", "x1", "mean2", "rstd2", "dx1"))  # the rest bf16


def _elements(B: int, T: int, C: int, H: int, threads: int) -> dict[str, int]:
    """Each buffer's size in elements, for B sequences of T rows of C features in H heads."""
    N = B * T
    sizes = dict.fromkeys(("h1", "y", "x1", "h2", "o", "p", "d16", "dh2", "dx1", "dx1_16", "dy",
                           "dh1"), N * C)
    sizes.update(dict.fromkeys(("mean1", "rstd1", "mean2", "rstd2"), N))
    sizes.update(dict.fromkeys(("f", "g", "dg", "df"), N * 4 * C))
    sizes.update(dict.fromkeys(("bwd_o", "fwd_o"), C * C))
    sizes.update(dict.fromkeys(("bwd_qkv", "fwd_qkv"), 3 * C * C))
    sizes.update(dict.fromkeys(("bwd_fc", "fwd_fc", "bwd_p", "fwd_p"), 4 * C * C))
    sizes.update(qkv=N * 3 * C, dqkv=N * 3 * C, lse=B * H * T, b_qkv=3 * C, b_o=C, b_fc=4 * C,
                 b_p=C)
    # the weight gradients' operands laid out: the longer side once, the shorter per thread
    sizes["wg"] = N * (4 * C + threads * C)
    return sizes


# the projections' biases' gradients, summed here from the backward's buffers as
# fused_block.py sums them (in PyTorch's order): the parameter index, and its buffer
_BIAS_GRADS = ((3, "dqkv"), (5, "dx1_16"), (9, "df"), (11, "d16"))


@functools.cache
def _load() -> Any:
    """The compiled library with its signatures, or None where it has no products to offer
    (:func:`tile_matmul.products_ready`: the same choice as that module's)."""
    lib = load_library(SOURCE, None)
    if lib is None or not tile_matmul.products_ready(lib):
        return None
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.block_forward.argtypes = [p] * 11 + [i]
    lib.block_backward.argtypes = [p] * 12 + [i]
    lib.block_forward.restype = lib.block_backward.restype = i
    return lib


def usable(rows: int, weights: list[Tensor]) -> bool:
    """Whether a fused block of ``rows`` rows whose projections have ``weights`` can train
    through the one-call kernel here: its products on tiles or by dot products
    (:func:`tile_matmul.usable`), its elementwise work on the C kernels, the kernel built and
    not switched off."""
    return (os.environ.get(SWITCH, "").lower() != "python"
            and block_ops.ops() is block_ops.C_OPS and tile_matmul.usable(rows, weights)
            and _load() is not None)


class _Layout:
    """The offsets of a call's buffers for one shape: ``forward`` (the kept buffers', then the
    forward's own) and ``backward`` (the kept, then the backward's own) as C arrays, the sizes
    in bytes of the three allocations, and each buffer's (offset, dtype, elements) by name."""

    def __init__(self, B: int, T: int, C: int, H: int, threads: int):
        self.where: dict[str, tuple[int, torch.dtype, int]] = {}
        elements = _elements(B, T, C, H, threads)
        self.kept = self._place(KEPT, elements)
        self.forward_own = self._place(FORWARD, elements)
        self.backward_own = self._place(BACKWARD, elements)
        offsets = [self.where[name][0] for name in KEPT + FORWARD + BACKWARD]
        kept = len(KEPT)
        self.forward = (ctypes.c_long * (kept + len(FORWARD)))(*offsets[:kept + len(FORWARD)])
        self.backward = (ctypes.c_long * (kept + len(BACKWARD)))(
            *offsets[:kept], *offsets[kept + len(FORWARD):])
        self.shape = (ctypes.c_long * 4)(B, T, C, H)

    def _place(self, names: tuple[str, ...], elements: dict[str, int]) -> int:
        """Lays the buffers ``names`` out one after another; returns the bytes they take."""
        end = 0
        for name in names:
            dtype = torch.float32 if name in _FP32 else torch.bfloat16
            self.where[name] = (end, dtype, elements[name])
            end += -(-elements[name] * dtype.itemsize // ALIGN) * ALIGN
        return end

    def view(self, arena: Tensor, name: str, shape: tuple[int, ...]) -> Tensor:
        """Buffer ``name`` of ``arena`` (bytes) as a tensor of ``shape``."""
        offset, dtype, n = self.where[name]
        return arena[offset:offset + n * dtype.itemsize].view(dtype).view(shape)


@functools.lru_cache(maxsize=64)
def _layout(B: int, T: int, C: int, H: int, threads: int) -> _Layout:
    return _Layout(B, T, C, H, threads)


def _pointers(tensors: tuple[Tensor | None, ...]) -> ctypes.Array:
    return (ctypes.c_void_p * len(tensors))(*(None if t is None else t.data_ptr()
                                              for t in tensors))


def forward(x: Tensor, n_head: int, eps: tuple[float, float], activation: str,
            tables: tuple[Tensor, ...], params: tuple[Tensor | None, ...]) -> tuple[Tensor, Tensor]:
    """x (B, T, C) fp32 -> (the block's output (B, T, C) fp32, what :func:`backward` reads).
    ``params``: the twelve of :class:`~scratchgpt.models.fused_block._Block`, fp32
    contiguous, None for a missing bias; ``tables``: the rotary cos and sin (T, D/2), or ()."""
    B, T, C = x.shape
    x = x.contiguous()
    params = tuple(None if p is None else p.contiguous() for p in params)
    threads = torch.get_num_threads()
    layout = _layout(B, T, C, n_head, threads)
    kept = torch.empty(layout.kept, dtype=torch.uint8)
    own = torch.empty(layout.forward_own, dtype=torch.uint8)
    out = torch.empty(B, T, C)
    cos, sin = attention_kernel.table_addresses(tables)
    with profiled("block_kernel.forward"):
        failed = _load().block_forward(
            layout.shape, (ctypes.c_float * 2)(*eps),
            block_ops.activation_tables(activation)[0].data_ptr(), cos, sin, x.data_ptr(),
            _pointers(params), kept.data_ptr(), own.data_ptr(), layout.forward, out.data_ptr(),
            threads)
    check_allocated(failed, "block kernel")
    return out, kept


def backward(d_out: Tensor, x: Tensor, kept: Tensor, n_head: int, activation: str,
             tables: tuple[Tensor, ...],
             params: tuple[Tensor | None, ...]) -> tuple[Tensor, list[Tensor | None]]:
    """(dx (B, T, C) fp32, the twelve parameters' gradients fp32, None for a missing bias)
    from d_out (B, T, C) fp32, the block's input x and what :func:`forward` kept."""
    B, T, C = d_out.shape
    x, d_out = x.contiguous(), d_out.contiguous()  # (kept alive through the call)
    params = tuple(None if p is None else p.contiguous() for p in params)
    threads = torch.get_num_threads()
    layout = _layout(B, T, C, n_head, threads)
    own = torch.empty(layout.backward_own, dtype=torch.uint8)
    dx = torch.empty(B, T, C)
    summed = {index for index, _ in _BIAS_GRADS}  # (below, from the buffers)
    grads: list[Tensor | None] = [None if p is None or i in summed else torch.empty_like(p)
                                  for i, p in enumerate(params)]
    cos, sin = attention_kernel.table_addresses(tables)
    with profiled("block_kernel.backward"):
        failed = _load().block_backward(
            layout.shape, block_ops.activation_tables(activation)[1].data_ptr(), cos, sin,
            x.data_ptr(), d_out.data_ptr(), _pointers(params), kept.data_ptr(),
            own.data_ptr(), layout.backward, dx.data_ptr(), _pointers(tuple(grads)), threads)
    check_allocated(failed, "block kernel")
    for index, name in _BIAS_GRADS:
        if params[index] is not None:  # dy.sum(0) in bf16, widened: as fused_block.py's
            rows = layout.view(own, name, (B * T, params[index].numel()))
            grads[index] = rows.sum(0).float()
    return dx, grads
