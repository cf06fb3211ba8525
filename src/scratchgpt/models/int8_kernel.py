"""scratchgpt's own int8-weight matrix product for AVX-512 CPUs, compiled on first use.

Why: a decode step reads every weight once, so it should be bound by memory bandwidth, and
PyTorch's CPU int8-weight kernel (``aten._weight_int8pack_mm``) keeps too few reads in flight
to get there: GPT-2 124M decoded at ~85 tokens/s with it on a 2-core Zen 4. ``int8_matmul.c``
(next to this file) keeps four rows' sums in flight and prefetches the blocks ahead: about 215
tokens/s on the same machine (docs/BENCHMARKS.md). It widens the int8 weights to bf16 (exactly)
and multiplies them with the activations rounded to bf16 by AVX512-BF16's dot product, which
does twice the multiply-adds of an fp32 FMA per instruction: a 64-token prompt, bound by
arithmetic rather than by reading, runs about 1.5x faster than with fp32 activations.

How: the C file is compiled once per machine and loaded with :mod:`ctypes`
(:mod:`~scratchgpt.models.c_kernels` says where it is kept and how); it runs on PyTorch's own
threads.

When it is not used: a CPU without AVX-512 and AVX512-BF16, no C compiler, a failed build, or
``SCRATCHGPT_INT8_KERNEL=torch`` in the environment; :func:`load` then returns None and
:class:`~scratchgpt.models.fast_decode.Int8Linear` uses PyTorch's kernel. :func:`describe` says
which one a process uses.

>>> from scratchgpt.models.int8_kernel import describe
>>> describe() in ("scratchgpt AVX-512 (bf16 activations, fp32 sums)",
...                "torch _weight_int8pack_mm (bf16 activations)")
True
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from scratchgpt.models.c_kernels import load_library

SOURCE = Path(__file__).with_name("int8_matmul.c")
K_MULTIPLE = 16  # K is padded to a multiple of this (the kernel reads 32 inputs a step, 16 last)


@functools.cache
def load() -> Callable[..., None] | None:
    """The kernel's C function, or None where it cannot be used (see the module docstring)."""
    lib = load_library(SOURCE, "SCRATCHGPT_INT8_KERNEL")
    if lib is None:
        return None
    fn = lib.int8_matmul
    p, i = ctypes.c_void_p, ctypes.c_int
    fn.argtypes = [p, i, i, p, p, p, p, i, i]  # x, M, K, w, scale, bias, y, N, threads
    fn.restype = None
    return fn


def describe() -> str:
    """Which int8 product this process uses, in words (for benchmark reports)."""
    if load() is not None:
        return "scratchgpt AVX-512 (bf16 activations, fp32 sums)"
    return "torch _weight_int8pack_mm (bf16 activations)"


def int8_matmul(x: Tensor, w: Tensor, scale: Tensor, bias: Tensor | None) -> Tensor:
    """``bf16(x) @ (w * scale[:, None]).T + bias`` without a float copy of ``w``.

    x: (M, K) fp32, contiguous; w: (N, K) int8, contiguous, K a multiple of
    :data:`K_MULTIPLE`; scale, bias: (N,) fp32. Returns (M, N) fp32. Needs :func:`load`."""
    fn = load()
    assert fn is not None, "int8_matmul needs the compiled kernel (see load())"
    (m, k), n = x.shape, w.shape[0]
    y = torch.empty(m, n, dtype=torch.float32)
    fn(x.data_ptr(), m, k, w.data_ptr(), scale.data_ptr(),
       None if bias is None else bias.data_ptr(), y.data_ptr(), n, torch.get_num_threads())
    return y
