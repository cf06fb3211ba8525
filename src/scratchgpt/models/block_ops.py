"""The elementwise work of a block's training step: LayerNorms, residual adds, the activation.

Why: in a bf16 training step at the small shapes a CPU trains, the work between a block's four
products costs as much as the products do. PyTorch runs each piece as its own operator over
the whole (N, C) tensor: the LayerNorm, then a cast of its output to bf16 for the product; the
product's bf16 output cast back to fp32, then the residual add; GELU and its backward in bf16,
which PyTorch widens to fp32 and narrows again, element by element. ``block_ops.c`` (next to
this file) does each group in one pass over the rows: the residual add and the next LayerNorm
with its bf16 output; the LayerNorm's backward with the residual's gradient added and the bf16
copy the next product reads; the activation and its gradient. docs/BENCHMARKS.md has the step
times with and without it.

Two implementations of one interface, chosen by :func:`ops`:

- :data:`C_OPS`, the C kernels: the same formulas in fp32, but not PyTorch's summation order,
  so results agree with the modules' path to float rounding (a bf16 result now and then one
  bf16 step away), not bit for bit (tests measure it). bf16 activations are looked up in
  tables of PyTorch's own results, so they are its bit for bit; fp32 ones (an fp32
  evaluation) are computed, GELU's erf and tanh by formulas at least as close to the truth as
  PyTorch's;
- :data:`TORCH_OPS`, PyTorch's own operators, called as the modules under autocast call them:
  bit for bit the modules' path.

:func:`ops` gives the C kernels on a CPU with AVX-512 and a C compiler
(:mod:`~scratchgpt.models.c_kernels`), PyTorch's operators elsewhere or when
``SCRATCHGPT_BLOCK_OPS=torch``. Shapes: x (N, C) fp32 rows; products' inputs and outputs bf16.

>>> import torch
>>> x, w, b = torch.randn(6, 32), torch.ones(32), torch.zeros(32)
>>> _, h, mean, rstd = TORCH_OPS.layer_norm(x, w, b, 1e-5)
>>> h.dtype, tuple(h.shape)
(torch.bfloat16, (6, 32))
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from scratchgpt.models.c_kernels import check_allocated, load_library, profiled

SOURCE = Path(__file__).with_name("block_ops.c")
SWITCH = "SCRATCHGPT_BLOCK_OPS"
BF16 = torch.bfloat16
_aten = torch.ops.aten
# the C file's codes for the activations it computes in fp32
_FP32_ACTS = {"none": 0, "tanh": 1, "relu": 2, "relu2": 3}


class TorchOps:
    """PyTorch's operators, as the modules call them (under bf16 autocast, or in fp32)."""

    name = "torch"

    @staticmethod
    def to_bf16(tensors: list[Tensor | None]) -> list[Tensor | None]:
        """Each fp32 tensor rounded to bf16 (None stays None): the products' weights."""
        return [None if t is None else t.to(BF16) for t in tensors]

    @staticmethod
    def to_fp32(tensors: list[Tensor | None]) -> list[Tensor | None]:
        """Each bf16 tensor widened to fp32 (None stays None): the weights' gradients, as
        autograd casts them to their parameters' dtype."""
        return [None if t is None else t.float() for t in tensors]

    @staticmethod
    def layer_norm(x: Tensor, w: Tensor, b: Tensor | None, eps: float,
                   res: Tensor | None = None,
                   dtype: torch.dtype = BF16) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(x1, h, mean, rstd): x1 = x (+ res, a product's output in ``dtype``), h = LN(x1)
        in ``dtype`` (bf16 for bf16 products, fp32 for fp32 ones), the statistics the
        backward reads."""
        if res is not None:
            x = x + res  # the residual stream stays fp32 (res widened, as autocast's add does)
        h, mean, rstd = _aten.native_layer_norm(x, (x.size(1),), w, b, eps)
        return x, h.to(dtype), mean, rstd

    @staticmethod
    def residual(x: Tensor, y: Tensor) -> Tensor:
        """x (fp32) + y (a product's output, bf16 or fp32), in fp32."""
        return x + y

    @staticmethod
    def activate(f: Tensor, name: str) -> tuple[Tensor | None, Tensor]:
        """(relu(f) where the backward needs it, else None; act(f)) for GELU ("none" or
        "tanh", its approximation), "relu" or "relu2", by the modules' own calls; f bf16 or
        fp32."""
        if name == "relu":
            g = _aten.relu(f)
            return g, g
        if name == "relu2":
            r = _aten.relu(f)
            return r, _aten.pow(r, 2)  # what Tensor.square() calls
        return None, _aten.gelu(f, approximate=name)

    @staticmethod
    def activation_backward(dg: Tensor, f: Tensor, r: Tensor | None, name: str) -> Tensor:
        """The gradient of :meth:`activate`'s g with respect to f, as autograd computes it."""
        if name == "relu2":  # square's backward (dg times 2r), then relu's
            dg = dg * (r * 2)
        if r is not None:
            return _aten.threshold_backward(dg, r, 0)
        return _aten.gelu_backward(dg, f, approximate=name)

    @staticmethod
    def layer_norm_backward(dh: Tensor, x: Tensor, mean: Tensor, rstd: Tensor, w: Tensor,
                            b: Tensor | None, dres: Tensor | None,
                            want_bf16: bool) -> tuple[Tensor, Tensor | None, Tensor, Tensor | None]:
        """(dx, dx in bf16 if ``want_bf16``, dw, db or None) from dh (bf16): the LayerNorm's
        backward, plus ``dres`` (fp32), the gradient reaching x by the residual."""
        dx, dw, db = _aten.native_layer_norm_backward(
            dh.float(), x, (x.size(1),), mean, rstd, w, b, (True, True, b is not None))
        if dres is not None:
            dx += dres
        return dx, dx.to(BF16) if want_bf16 else None, dw, db


def _named(method: Any) -> Any:
    """``method`` inside a profiler range named ``block_ops.<its name>``, so that ``scratchgpt
    bench train --breakdown`` counts the C calls by what they do."""
    label = f"block_ops.{method.__name__}"

    @functools.wraps(method)
    def named(*args: Any, **kwargs: Any) -> Any:
        with profiled(label):
            return method(*args, **kwargs)

    return named


class COps:
    """``block_ops.c``'s kernels, on PyTorch's threads."""

    name = "c"

    @staticmethod
    @_named
    def to_bf16(tensors: list[Tensor | None]) -> list[Tensor | None]:
        return _convert(tensors, BF16)

    @staticmethod
    @_named
    def to_fp32(tensors: list[Tensor | None]) -> list[Tensor | None]:
        return _convert(tensors, torch.float32)

    @staticmethod
    @_named
    def layer_norm(x: Tensor, w: Tensor, b: Tensor | None, eps: float,
                   res: Tensor | None = None,
                   dtype: torch.dtype = BF16) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        N, C = x.shape
        x1 = x if res is None else torch.empty_like(x)
        h = torch.empty(N, C, dtype=dtype)
        mean, rstd = torch.empty(N), torch.empty(N)
        _load().ln_forward(N, C, x.data_ptr(), _ptr(res), _ptr(x1 if res is not None else None),
                           w.data_ptr(), _ptr(b), eps, h.data_ptr(), mean.data_ptr(),
                           rstd.data_ptr(), dtype == BF16, torch.get_num_threads())
        return x1, h, mean, rstd

    @staticmethod
    @_named
    def residual(x: Tensor, y: Tensor) -> Tensor:
        out = torch.empty_like(x)
        _load().residual_add(x.numel(), x.data_ptr(), y.data_ptr(), out.data_ptr(),
                             y.dtype == BF16, torch.get_num_threads())
        return out

    @staticmethod
    @_named
    def activate(f: Tensor, name: str) -> tuple[Tensor | None, Tensor]:
        g = torch.empty_like(f)
        if f.dtype == BF16:  # looked up: PyTorch's own results
            _load().act_forward(f.numel(), activation_tables(name)[0].data_ptr(), f.data_ptr(),
                                g.data_ptr(), torch.get_num_threads())
        else:  # computed (evaluation in fp32)
            _load().act_forward_fp32(f.numel(), _FP32_ACTS[name], f.data_ptr(), g.data_ptr(),
                                     torch.get_num_threads())
        return None, g

    @staticmethod
    @_named
    def activation_backward(dg: Tensor, f: Tensor, r: Tensor | None, name: str) -> Tensor:
        df = torch.empty_like(f)
        _load().act_backward(f.numel(), activation_tables(name)[1].data_ptr(), dg.data_ptr(),
                             f.data_ptr(), df.data_ptr(), torch.get_num_threads())
        return df

    @staticmethod
    @_named
    def layer_norm_backward(dh: Tensor, x: Tensor, mean: Tensor, rstd: Tensor, w: Tensor,
                            b: Tensor | None, dres: Tensor | None,
                            want_bf16: bool) -> tuple[Tensor, Tensor | None, Tensor, Tensor | None]:
        N, C = x.shape
        dx = torch.empty_like(x)
        dx16 = torch.empty(N, C, dtype=BF16) if want_bf16 else None
        dw, db = torch.empty(C), None if b is None else torch.empty(C)
        check_allocated(_load().ln_backward(
            N, C, dh.data_ptr(), x.data_ptr(), mean.data_ptr(), rstd.data_ptr(), w.data_ptr(),
            _ptr(dres), dx.data_ptr(), _ptr(dx16), dw.data_ptr(), _ptr(db),
            torch.get_num_threads()), "LayerNorm backward kernel")
        return dx, dx16, dw, db


Ops = type[TorchOps] | type[COps]
TORCH_OPS: Ops = TorchOps
C_OPS: Ops = COps


def _convert(tensors: list[Tensor | None], dtype: torch.dtype) -> list[Tensor | None]:
    """``tensors`` (fp32 to bf16, or bf16 to fp32) in ``dtype`` by one C call, None kept."""
    given = [t.contiguous() for t in tensors if t is not None]
    if not given:  # (a model without biases)
        return list(tensors)
    out = [torch.empty_like(t, dtype=dtype) for t in given]
    count = len(given)
    pointers = ctypes.c_void_p * count
    _load().convert_many(count, pointers(*(t.data_ptr() for t in given)),
                         pointers(*(t.data_ptr() for t in out)),
                         (ctypes.c_long * count)(*(t.numel() for t in given)), dtype == BF16,
                         torch.get_num_threads())
    converted = iter(out)
    return [None if t is None else next(converted) for t in tensors]


def _ptr(t: Tensor | None) -> int | None:
    """A tensor's address for C, or NULL."""
    return None if t is None else t.data_ptr()


@functools.cache
def activation_tables(name: str) -> tuple[Tensor, Tensor]:
    """The activation ``name`` of every bf16 value, and its derivative there, each (65536,)
    fp32 indexed by the value's bits: PyTorch's own results (:class:`TorchOps`), so the C
    kernels' lookups give its forward bit for bit, and a backward that multiplies dg by the
    derivative and rounds once, as PyTorch's does."""
    every = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(BF16)  # (65536,)
    forward = TorchOps.activate(every, name)[1].float()
    wide = every.float()  # the derivative: the backward of a gradient of ones, in fp32
    grad = TorchOps.activation_backward(torch.ones(65536), wide,
                                        TorchOps.activate(wide, name)[0], name)
    return forward, grad


@functools.cache
def _load() -> Any:
    """The compiled library with its functions' signatures, or None where it cannot be built
    (whatever the switch says: :func:`ops` reads it at each call)."""
    lib = load_library(SOURCE, None)
    if lib is None:
        return None
    p, i, n, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_float
    lib.ln_forward.argtypes = [i, i, p, p, p, p, p, f, p, p, p, i, i]
    lib.residual_add.argtypes = [n, p, p, p, i, i]
    lib.act_forward_fp32.argtypes = [n, i, p, p, i]
    lib.act_forward_fp32.restype = None
    lib.act_forward.argtypes = [n, p, p, p, i]
    lib.act_backward.argtypes = [n, p, p, p, p, i]
    lib.ln_backward.argtypes = [i, i, p, p, p, p, p, p, p, p, p, p, i]
    lib.ln_forward.restype = lib.residual_add.restype = None
    lib.act_forward.restype = lib.act_backward.restype = None
    lib.ln_backward.restype = i
    lib.convert_many.argtypes = [i, p, p, p, i, i]
    lib.convert_many.restype = None
    return lib


def ops() -> Ops:
    """The implementation this process runs: the C kernels where built and not switched off
    (``SCRATCHGPT_BLOCK_OPS=torch``), else PyTorch's operators."""
    if os.environ.get(SWITCH, "").lower() == "torch" or _load() is None:
        return TORCH_OPS
    return C_OPS
