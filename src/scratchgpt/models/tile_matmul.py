"""A training block's bf16 products on Intel AMX tiles (or AVX512-BF16 dot products), with
the weights laid out once a step.

Why: at the small shapes a CPU trains (nanoGPT's CPU recipe: 768 rows of 128 to 512
features), PyTorch's bf16 product costs ~35 us a call before any arithmetic (its oneDNN
call, made anew each time: descriptors, a scratch buffer, the weight copied into the tiles'
layout), against ~10 us of arithmetic for the smallest, and a weight gradient (``dy^T x``,
its first operand transposed) took about twice a forward product's time. A training step
makes 51 of them. ``tile_matmul.c`` (next to this file) lays each projection's weight out for
the tiles as it rounds it to bf16, once a step for both products that read it (the forward's
``x W^T`` and the backward's ``dy W``), lays out the weight gradient's operands in one pass
each, and multiplies on the tile registers with calls that cost a few microseconds.
docs/BENCHMARKS.md has the times.

What it computes is what PyTorch's bf16 products compute, the same bits: fp32 sums of bf16
products over the reduction in steps of 32 (as oneDNN's AMX kernel takes them), the bias
added in fp32, rounded once to bf16 (a weight gradient's then widened to the parameter's
fp32, as the cast after PyTorch's product does). Tests hold it to PyTorch's ``mm`` and
``addmm`` and a fused block's gradients to the untiled path's.

On a CPU with AVX512-BF16 but no AMX (AMD's Zen 4), the same layouts are multiplied by the
dot-product instruction instead (:func:`kind` says which): the forward products and the input
gradients are PyTorch's bits there too (oneDNN's kernel for such CPUs sums each pair of
reduction indices in order, as this one does), while a weight gradient sums over the rows in
an order of its own, so a few of its elements in ten thousand round differently, by a few
bf16 steps at most (tests hold it to that, against oneDNN's kernel for such CPUs run on an AMX
CPU).

Used by the fused block's C path (:mod:`~scratchgpt.models.fused_block`) where :func:`usable`:
a CPU with AMX or AVX512-BF16 (``-march=native`` builds the code it has; elsewhere the
library says it has no products), Linux's leave to use the tiles, rows and features in
multiples of 32; PyTorch's products otherwise, or with ``SCRATCHGPT_TILE_MATMUL=torch``
(``=dot``: the dot products even where there are tiles, read at the first use).

>>> import torch
>>> w = torch.randn(64, 32)  # an nn.Linear(32, 64)'s weight
>>> x, dy = torch.randn(32, 32).bfloat16(), torch.randn(32, 64).bfloat16()
>>> if usable(32, [w]):
...     (fwd,), (bwd,) = pack([w])
...     assert torch.equal(linear(x, fwd, None), x.mm(w.bfloat16().t()))
...     assert torch.equal(input_grad(dy, bwd), dy.mm(w.bfloat16()))
...     assert kind() != "tiles" or torch.equal(weight_grad(dy, x), dy.t().mm(x).float())
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from scratchgpt.models.c_kernels import load_library, profiled

SOURCE = Path(__file__).with_name("tile_matmul.c")
SWITCH = "SCRATCHGPT_TILE_MATMUL"
BLOCK = 32  # every dimension a multiple of this
BF16 = torch.bfloat16


def products_ready(lib: Any) -> int:
    """Has ``lib`` (this file's C, or a library built with it) choose its products: 2 on AMX
    tiles, 1 by AVX512-BF16 dot products (where there are no tiles, or with
    ``SCRATCHGPT_TILE_MATMUL=dot``), 0 where it has neither. Every library of a process
    chooses alike (:func:`_tiles_wanted`)."""
    return lib.products_ready(_tiles_wanted())


@functools.cache
def _tiles_wanted() -> int:
    """0 with ``SCRATCHGPT_TILE_MATMUL=dot``, else 1: read once per process, at the first
    library's load."""
    return int(os.environ.get(SWITCH, "").lower() != "dot")


def kind() -> str | None:
    """What the products run on here: "tiles", "dot" (AVX512-BF16 dot products) or None
    (PyTorch's products: neither, or no compiler)."""
    lib = _load()
    return None if lib is None else ("tiles" if lib.kind == 2 else "dot")


def describe() -> str:
    """What a fused block's bf16 products run on in this process, in words (for benchmark
    reports)."""
    if os.environ.get(SWITCH, "").lower() == "torch":
        return "PyTorch's"
    return {"tiles": "AMX tiles", "dot": "AVX512-BF16 dot products"}.get(kind(), "PyTorch's")


@functools.cache
def _load() -> Any:
    """The compiled library with its signatures, or None where it has no products to offer."""
    lib = load_library(SOURCE, None)
    if lib is None:
        return None
    lib.kind = products_ready(lib)
    if not lib.kind:
        return None
    p, i, n = ctypes.c_void_p, ctypes.c_int, ctypes.c_long
    lib.pack_weights.argtypes = [i, p, p, p, p, p, i]
    lib.tile_product.argtypes = [n, n, n, p, n, p, p, p, i]
    lib.tile_weight_grad.argtypes = [n, n, n, p, n, p, n, p, p, i]
    lib.pack_weights.restype = lib.tile_product.restype = lib.tile_weight_grad.restype = None
    return lib


def usable(rows: int, weights: Sequence[Tensor]) -> bool:
    """Whether products of ``rows`` rows with each of ``weights`` (fp32, (out, in)) can run
    here, on the tiles or by dot products (:func:`kind`)."""
    return (rows % BLOCK == 0 and all(w.dtype == torch.float32 and w.dim() == 2
                                      and w.size(0) % BLOCK == 0 and w.size(1) % BLOCK == 0
                                      for w in weights)
            and os.environ.get(SWITCH, "").lower() != "torch" and _load() is not None)


def pack(weights: Sequence[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
    """Each fp32 weight (out, in) rounded to bf16 and laid out for the tiles, for the forward
    product (:func:`linear`) and for the backward's (:func:`input_grad`): two lists of bf16
    tensors of the weights' shapes, their memory in the tiles' order (read them with these
    functions only)."""
    weights = [w.contiguous() for w in weights]
    fwd = [torch.empty(w.shape, dtype=BF16) for w in weights]
    bwd = [torch.empty(w.shape, dtype=BF16) for w in weights]
    count = len(weights)
    pointers, longs = ctypes.c_void_p * count, ctypes.c_long * count
    with profiled("tile_matmul.pack"):
        _load().pack_weights(count, pointers(*(w.data_ptr() for w in weights)),
                             longs(*(w.size(0) for w in weights)),
                             longs(*(w.size(1) for w in weights)),
                             pointers(*(t.data_ptr() for t in fwd)),
                             pointers(*(t.data_ptr() for t in bwd)), torch.get_num_threads())
    return fwd, bwd


def linear(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    """x (M, in) bf16 times the weight (out, in)^T, packed for the forward, plus b (out,)
    bf16 or None: (M, out) bf16, ``torch.addmm(b, x, W.t())``."""
    return _product(x, w, b, w.size(0), "tile_matmul.linear")


def input_grad(dy: Tensor, w: Tensor) -> Tensor:
    """dy (M, out) bf16 times the weight (out, in), packed for the backward: dx (M, in) bf16,
    ``dy.mm(W)``."""
    return _product(dy, w, None, w.size(1), "tile_matmul.input_grad")


def weight_grad(dy: Tensor, x: Tensor) -> Tensor:
    """dy (M, out) and x (M, in) bf16 -> the weight's gradient dy^T x (out, in): the bf16
    product's sums, widened to fp32 (the parameter's dtype)."""
    M, n_out = dy.shape
    n_in = x.size(1)
    dy, x = (t if t.stride(1) == 1 else t.contiguous() for t in (dy, x))
    dw = torch.empty(n_out, n_in)
    # (tile_matmul.c: each thread its own copy of the shorter side's operand; it takes a thread
    # for each 32 of the longer side at most)
    threads = torch.get_num_threads()
    scratch = torch.empty(M * (max(n_out, n_in) + threads * min(n_out, n_in)), dtype=BF16)
    with profiled("tile_matmul.weight_grad"):
        _load().tile_weight_grad(M, n_out, n_in, dy.data_ptr(), dy.stride(0), x.data_ptr(),
                                 x.stride(0), dw.data_ptr(), scratch.data_ptr(), threads)
    return dw


def _product(a: Tensor, packed: Tensor, bias: Tensor | None, n: int, name: str) -> Tensor:
    M, K = a.shape
    if a.stride(1) != 1:
        a = a.contiguous()
    out = torch.empty(M, n, dtype=BF16)
    with profiled(name):
        _load().tile_product(M, n, K, a.data_ptr(), a.stride(0), packed.data_ptr(),
                             None if bias is None else bias.data_ptr(), out.data_ptr(),
                             torch.get_num_threads())
    return out
