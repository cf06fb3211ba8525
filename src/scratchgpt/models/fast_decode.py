"""Making a trained GPT decode fast on CPU.

Decoding one token at a time is bound by memory bandwidth: every step reads every weight once.
:func:`prepare_for_decode` is the one place a command turns a loaded model into the inference
model of a ``--dtype``: ``fp32`` and ``bf16`` (a cast) keep what the model computes and only
change how weights are laid out; ``int8`` (:func:`quantize_int8`) trades a little accuracy for
a quarter of fp32's weight bytes. Two layout preparations, chosen by the model's dtype:

* :meth:`GPT.decode_layout_` stores each Linear weight in the memory order that the one-row
  matrix product streams fastest (a pure layout change).
* With oneDNN (bf16 where the CPU supports it, and fp32), Linears become
  :class:`PackedLinear` modules holding their weight pre-packed (blocked) for oneDNN's kernels,
  laid out for products of up to :data:`PACK_ROWS` rows: one-token steps and the several-row
  calls that score speculative drafts. bf16: every Linear (oneDNN's bf16 products beat the
  generic ones at every size measured). fp32: at one row, packed products stream large
  weights faster (lm_head 34.5 vs 20.4 GB/s; GPT-2 124M decodes at 43.0 vs 38.6 tok/s with all
  Linears packed vs only the wide ones, docs/BENCHMARKS.md) but cost ~25 us more a call, so
  weights under :data:`PACK_MIN_BYTES` keep a plain copy for one-row products and use the
  packed one for several rows (a 5-row scoring call of a 6L/384d model: 1.16x a one-token step
  instead of 1.76x); the smallest (under :data:`ROWS_MIN_BYTES`) stay plain.

Threads: a small model's decode step is a hundred or so kernels of a few microseconds each, too
short to split; a second thread only adds the cost of waking and joining it, and when the
cores are busy with other work, of waiting for one that is descheduled. :func:`decode_threads`
says when one thread is the better default.

Packed and quantized models are for inference only: their weights cannot be trained or saved
(keep the original for that).

**int8 weight-only decode** (:class:`Int8Linear`): each Linear weight row (one output channel)
is stored as int8 with one scale, ``w[n, k] ~ scale[n] * q[n, k]``, ``scale[n] = max|w[n]| /
127`` (symmetric, per channel). No dequantized copy of the weight is ever made: the product
streams the int8 bytes and converts them in registers, in one of two kernels. Both take their
inputs rounded to bf16 (an int8 weight is exact in bf16, so the product is bf16 times bf16,
summed in fp32):

* on CPUs with AVX-512 and its bf16 dot product, scratchgpt's own
  (:mod:`scratchgpt.models.int8_kernel`, compiled on first use): fp32 sums and outputs, with
  software prefetch so that a decode step streams its weights near the memory bandwidth, and
  a prompt gets twice fp32's multiply-adds per instruction (GPT-2 124M: 1.7x PyTorch's
  kernel's decode, 2x its prefill);
* elsewhere, PyTorch's int8-weight kernel (``aten._weight_int8pack_mm``, what gpt-fast uses on
  CPU). On x86 its vectorized path takes bf16 activations (its fp32 path is scalar code, ~10x
  slower) and returns bf16.

Everything else (LayerNorm, attention, GELU, the residual stream, the KV cache) stays fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from scratchgpt.errors import ConfigError
from scratchgpt.models import int8_kernel

DTYPES = ("fp32", "bf16", "int8")  # the inference precisions of --dtype


def packing_available(dtype: torch.dtype = torch.bfloat16) -> bool:
    """True when oneDNN can pack Linear weights of ``dtype`` on this CPU."""
    try:
        if not (torch.backends.mkldnn.is_available()
                and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
            return False
        return dtype == torch.float32 or (dtype == torch.bfloat16
                                          and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


# The rows a packed weight's blocked layout is chosen for (oneDNN picks it by the expected
# rows of the product). Measured (`bench decode-step --variants packed --tokens 1,5,9`, the
# 6L/384d Shakespeare target, fp32, 1 thread, Zen 4): packed for 8 rows, a one-row product is
# as fast as packed for one row (5.3-5.6 ms a step either way), while calls of 5 and 9 rows,
# a speculative scoring call, cost 4.3-4.6 and 5.0-5.4 ms instead of 7.5 and 8.3.
PACK_ROWS = 8


class PackedLinear(nn.Module):
    """``nn.Linear`` with its weight pre-packed by oneDNN (:data:`PACK_ROWS`).

    ``row_weight=True`` also keeps the plain weight, as it was laid out, for one-row products:
    for fp32 weights under :data:`PACK_MIN_BYTES` the plain product is the faster at one row,
    the packed one at several (twice the weight bytes; such weights are at most a few MiB)."""

    def __init__(self, linear: nn.Linear, row_weight: bool = False):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), PACK_ROWS)
        self.row_weight = w if row_weight else None  # (out, in), its decode layout
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.dtype = w.dtype

    def forward(self, x: Tensor) -> Tensor:
        """x: (..., in_features) -> (..., out_features)."""
        if self.row_weight is not None and x.numel() == self.in_features:  # one row
            return F.linear(x, self.row_weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


# The smallest fp32 weight (bytes) whose packed product pays at one row. Measured per Linear
# (fp32, batch 1, `bench decode-step --variants layout,packed` and the product alone): a packed
# product costs ~25 us more per call, so it loses below ~4 MiB (cpu-small's 128x512: 40 vs
# 16 us; a whole cpu-small decode step 2.45 vs 1.62 ms) and gains above it with 2 threads
# (768x3072: 153 vs 238 us). With one thread the plain layout was as fast or faster at every
# size measured, so this is the threshold for the default thread count.
PACK_MIN_BYTES = 4 * 2**20
# fp32 weights from this size up to PACK_MIN_BYTES are packed for calls of several rows and
# keep their plain weight for one row (PackedLinear's row_weight). Below it, a few rows cost
# about the same either way or less plain: cpu-medium (192 wide; 0.6 MB weights at most) scores
# 5 tokens in 2.11-2.30 ms plain, 2.39-2.45 ms packed; the 6L/384d model (1.8-2.4 MB) in
# 4.3-5.0 ms packed, 7.4-7.5 ms plain (1 thread, Zen 4).
ROWS_MIN_BYTES = 2**20


def _pack_linears(model: nn.Module, min_bytes: int, row_min_bytes: int | None = None) -> None:
    """Pack every Linear of ``min_bytes`` or more; those of ``row_min_bytes`` up to
    ``min_bytes`` are packed with their plain weight kept for one-row products."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, nn.Linear):
                continue
            size = child.weight.nbytes
            if size >= min_bytes:
                setattr(parent, name, PackedLinear(child))
            elif row_min_bytes is not None and size >= row_min_bytes:
                setattr(parent, name, PackedLinear(child, row_weight=True))


def optimize_for_decode(model: nn.Module, pack: str | int | None = "auto") -> nn.Module:
    """Prepare a GPT (already cast to its inference dtype, on CPU) for fast decoding; returns
    it. Every Linear gets the decode weight layout (:meth:`GPT.decode_layout_`); then, with
    oneDNN (fp32, or bf16 where the CPU has it), ``pack`` says which are packed:

    * ``"auto"``, what was measured fastest: bf16, every Linear (a 6L/384d step 2.7 vs 4.5
      ms, cpu-medium 2.0 vs 2.4 ms, 1 thread, Zen 4); fp32, in a model that decodes on
      several threads (over :data:`SINGLE_THREAD_MAX_BYTES`), every Linear of
      :data:`ROWS_MIN_BYTES` or more (GPT-2 124M, 2 threads: a step 21.8 vs 23.1 ms, its
      768x768 products 2.4 ms plain); in a smaller one, those of :data:`PACK_MIN_BYTES` or
      more, and those of :data:`ROWS_MIN_BYTES` or more with their plain weight kept for one
      row (see :class:`PackedLinear`);
    * a number: every Linear of that many bytes or more (0: all of them);
    * ``None``: none. This suits a server, whose batch size changes from step to step: oneDNN
      keeps state for every input shape a packed Linear has seen (about 0.6 MB per shape for a
      128 x 512 weight, measured), so memory would grow with each new batch size.

    Other models are returned unchanged."""
    from scratchgpt.models.gpt import GPT

    if not isinstance(model, GPT):
        return model
    model.decode_layout_()
    weight = model.lm_head.weight
    if pack is None or weight.device.type != "cpu" or not packing_available(weight.dtype):
        return model
    if pack != "auto":
        _pack_linears(model, int(pack))
    elif weight.dtype == torch.bfloat16:
        _pack_linears(model, 0)
    elif weight_bytes(model) > SINGLE_THREAD_MAX_BYTES:
        _pack_linears(model, ROWS_MIN_BYTES)
    else:
        _pack_linears(model, PACK_MIN_BYTES, ROWS_MIN_BYTES)
    return model


class DecodeWrapper(nn.Module):
    """A GPT that runs some of its calls its own way (a compiled or a C decode step) and the
    rest as the wrapped model does. The model is its one submodule, so its weights count as
    this module's, and any other attribute (``config``, ``num_params``, ...) is the model's."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)  # parameters, buffers, submodules: self.model
        except AttributeError:
            return getattr(self._modules["model"], name)

    def new_cache(self, batch_size: int, max_len: int | None = None,
                  dtype: torch.dtype | None = None):
        """The wrapped model's cache."""
        return self.model.new_cache(batch_size, max_len, dtype)


# ---- int8 weight-only


def torch_int8_available() -> bool:
    """True when this PyTorch has the CPU int8-weight matmul kernel."""
    return hasattr(torch.ops.aten, "_weight_int8pack_mm")


def int8_available() -> bool:
    """True when an int8-weight product can run here: scratchgpt's own kernel, or PyTorch's
    CPU int8-weight matmul."""
    return int8_kernel.load() is not None or torch_int8_available()


# Both kernels read 16 input features per step (PyTorch's: 8 with AVX2, 16 with AVX-512, with
# aligned loads), so the inner dimension is padded with zeros to a multiple of this.
INT8_K_MULTIPLE = int8_kernel.K_MULTIPLE


def quantize_rows_int8(w: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric per-row int8: w (N, K) float -> (q (N, K) int8, scale (N,) bf16).

    ``scale[n] = max|w[n]| / 127`` rounded to bf16 (the kernel's scale dtype) *before*
    rounding ``w / scale``, so ``q * scale`` is exactly the weight the kernel multiplies by;
    the error per weight is at most ``scale / 2`` (plus clamping where bf16 rounded the scale
    down). An all-zero row gets scale 1."""
    amax = w.detach().float().abs().amax(dim=1)  # (N,)
    scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax)).to(torch.bfloat16)
    q = torch.round(w.detach().float() / scale.float()[:, None]).clamp_(-127, 127)  # (N, K)
    return q.to(torch.int8), scale


class Int8Linear(nn.Module):
    """``nn.Linear`` with weight-only int8 weights (per output channel, symmetric).

    Reads a quarter of fp32's weight bytes per product. ``forward`` accepts any dtype and
    returns that dtype; the product takes its inputs rounded to bf16 and sums in fp32 (see the
    module docstring).

    >>> lin = Int8Linear(nn.Linear(64, 32))
    >>> lin.weight.dtype, tuple(lin.weight.shape), lin(torch.randn(2, 5, 64)).shape
    (torch.int8, (32, 64), torch.Size([2, 5, 32]))
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        if not int8_available():
            raise ConfigError("int8 decode needs scratchgpt's int8 kernel (AVX-512 and a C "
                              "compiler) or a PyTorch with aten._weight_int8pack_mm (2.4 or "
                              "later)")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        q, scale = quantize_rows_int8(linear.weight)
        self.pad = -self.in_features % INT8_K_MULTIPLE
        self.register_buffer("weight", F.pad(q, (0, self.pad)).contiguous())  # (N, K + pad)
        self.register_buffer("scale", scale)  # (N,) bf16
        self.register_buffer("scale_f32", scale.float())  # (N,) the same values, for ours
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        self.register_buffer("bias", bias)  # (N,) fp32 or None

    def dequantized(self) -> Tensor:
        """The weight the kernel multiplies by, (N, K) fp32 (for tests and error bounds)."""
        w = self.weight[:, : self.in_features].float() * self.scale.float()[:, None]
        return w

    def forward(self, x: Tensor) -> Tensor:
        """x: (..., in_features) -> (..., out_features), in x's dtype."""
        if x.device.type == "cpu" and int8_kernel.load() is not None:
            return self._ours(x)
        lead = x.shape[:-1]
        # a fresh contiguous bf16 copy: the kernel needs 2-D, aligned rows (the copy is one
        # activation row per token, tiny next to the weight it is multiplied with)
        a = x.reshape(-1, self.in_features).to(torch.bfloat16, copy=True)  # (M, K)
        if self.pad:
            a = F.pad(a, (0, self.pad))  # (M, K + pad), zeros meet the zero-padded weight
        y = torch.ops.aten._weight_int8pack_mm(a, self.weight, self.scale)  # (M, N) bf16
        y = y.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.reshape(*lead, self.out_features)

    def _ours(self, x: Tensor) -> Tensor:
        """scratchgpt's AVX-512 kernel (:mod:`~scratchgpt.models.int8_kernel`): inputs rounded
        to bf16 in the kernel, fp32 sums, bias added in the kernel."""
        lead = x.shape[:-1]
        a = x.reshape(-1, self.in_features)  # (M, K)
        if a.dtype != torch.float32:  # (each op skipped here is a dispatch saved per product)
            a = a.float()
        if self.pad:
            a = F.pad(a, (0, self.pad))  # zeros meet the zero-padded weight
        elif not a.is_contiguous():
            a = a.contiguous()
        y = int8_kernel.int8_matmul(a, self.weight, self.scale_f32, self.bias)  # (M, N) fp32
        if x.dtype != torch.float32:
            y = y.to(x.dtype)
        return y.view(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, int8 per-channel")


def quantize_int8(model: nn.Module) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` (fp32, CPU) by an :class:`Int8Linear`; returns
    it. Embeddings and LayerNorms stay fp32 (a decode step reads one embedding row, not the
    table). A tied ``lm_head`` gets its own int8 copy; the embedding keeps the fp32 table."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, Int8Linear(child))
    return model


def to_inference_dtype(model: nn.Module, dtype: str) -> nn.Module:
    """``model`` (fp32) in the inference precision ``dtype`` (one of :data:`DTYPES`): fp32
    unchanged, bf16 cast (the KV cache follows the weights' dtype), int8 quantized. In place;
    returns it."""
    if dtype not in DTYPES:
        raise ConfigError(f"unknown inference dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    if dtype == "bf16":
        model.to(torch.bfloat16)
    elif dtype == "int8":
        if not any(isinstance(m, nn.Linear) for m in model.modules()):
            raise ConfigError(f"int8 quantizes linear layers, and a {type(model).__name__} has "
                              "none (it would run in fp32 under int8's name); use fp32")
        quantize_int8(model)
    return model


def model_weights(model: nn.Module) -> list[Tensor]:
    """Every tensor ``model`` holds, once each: parameters, buffers, and the tensors of
    packed or quantized layers (which are plain attributes)."""
    seen: dict[int, Tensor] = {}
    for m in model.modules():
        for t in (*m.parameters(recurse=False), *m.buffers(recurse=False), *vars(m).values()):
            if isinstance(t, Tensor):
                seen.setdefault(id(t), t)
    return list(seen.values())


def weight_bytes(model: nn.Module) -> int:
    """Bytes of every tensor ``model`` holds (:func:`model_weights`), each counted once."""
    return sum(t.numel() * t.element_size() for t in model_weights(model))


# Up to this many bytes of weights, a batch-1 decode step decodes fastest on one thread.
# Measured (thread CPU and wall time, 500 sampled tokens, 2-core machine under load from other
# jobs): cpu-small (3.2 MB) 0.97 s with 1 thread vs 7.6 s with 2; cpu-medium (10.7 MB) 2.1 vs
# 11.6 s. Larger models are bound by memory bandwidth, which more threads do raise.
SINGLE_THREAD_MAX_BYTES = 16 * 2**20


def decode_threads(model: object) -> int:
    """The CPU threads to decode ``model`` with when the user chose none: 1 for a torch model
    of at most :data:`SINGLE_THREAD_MAX_BYTES` of weights, else torch's current setting."""
    if isinstance(model, nn.Module) and weight_bytes(model) <= SINGLE_THREAD_MAX_BYTES:
        return 1
    return torch.get_num_threads()


def prepare_for_decode(model: nn.Module, dtype: str = "fp32", pack: bool = True,
                       native: bool = True, native_rows: int | None = None) -> nn.Module:
    """The inference model of ``--dtype``: :func:`to_inference_dtype`, then (fp32, bf16) the
    fast weight layout of :func:`optimize_for_decode` (``pack=False``: no oneDNN packing, for
    a server; see there); with ``native``, a GPT that the C decode step can run is returned
    wrapped in :class:`~scratchgpt.models.native.NativeGPT`, which runs its one-token steps in
    one C call (``native_rows``: the most rows of a small model's batch it takes; default
    :data:`~scratchgpt.models.native.SMALL_MODEL_ROWS`). Every command that generates
    (sample, chat, the benches, a server) prepares its model here. In place; returns it (or
    its wrapper)."""
    from scratchgpt.models import native as c_step

    to_inference_dtype(model, dtype)
    # the C step reads the trained layouts: taken before optimize_for_decode changes them
    weights = c_step.c_step_weights(model) if native else None
    if dtype != "int8":  # int8 Linears already hold the kernel's own layout
        optimize_for_decode(model, "auto" if pack else None)
    if weights is None:  # (a model the C step cannot run: prepared and eager)
        return model
    return c_step.NativeGPT(model, weights, native_rows or c_step.SMALL_MODEL_ROWS)
