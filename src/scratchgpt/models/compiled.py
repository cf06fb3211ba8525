"""A GPT whose one-token decode step is one ``torch.compile``'d graph (gpt-fast style).

A small model's decode step is not bound by its weights but by the fixed cost of each of its
~90 PyTorch kernels and ~45 module calls (``scratchgpt bench decode-step`` takes one apart).
Compiled, the module calls disappear and the step becomes a few generated C++ loops: at batch
1 the one-row matrix products are decomposed into multiply-and-sum loops that fuse with the
bias, the activation and the LayerNorms around them (Inductor's ``decompose_mm_pass``, on CPU
for one row and sides of at most 2,048). cpu-small's step goes from ~0.9 to ~0.3 ms on one
thread (docs/BENCHMARKS.md).

A compiled graph is specialized to its input shapes, so the step must not change shape from
one token to the next. :meth:`GPT.decode_static` attends over the whole cache buffer with a
mask of the filled slots and takes the slot as a tensor; :class:`CompiledGPT` always allocates
caches of the full context, so one graph serves every position of every generation. It
compiles batch-1 steps, the latency case where per-op cost dominates (one sample, a stream,
speculative drafts); batches and calls of other lengths (prefills, the scoring of speculative
drafts) run the eager model on the same cache: both paths read and write the same slots.

It is for small models: :data:`COMPILE_MAX_BYTES` of weights at most. A larger model's
step is bound by its products, which compiling does not speed up, while the whole-buffer
attention reads every slot of the context at every step.

Compiling costs time once per process (~10-25 s for the cpu-* presets on two
cores; PyTorch caches the generated code on disk, which cuts later runs to a few seconds), so
it pays for long generations, not for one short sample::

    model = CompiledGPT(prepare_for_decode(load_model("runs/shakespeare")[0], pack=False,
                                            native=False))
    out = generate(model, prompt, 500, SamplingConfig(temperature=0.8))
"""

from __future__ import annotations

import shutil
from typing import Any

import torch
from torch import Tensor, nn

from scratchgpt.errors import ConfigError
from scratchgpt.models.fast_decode import (
    SINGLE_THREAD_MAX_BYTES,
    DecodeWrapper,
    Int8Linear,
    PackedLinear,
    optimize_for_decode,
    prepare_for_decode,
    weight_bytes,
)
from scratchgpt.models.gpt import GPT, KVCache

# Inductor's options. cpp_wrapper: the generated C++ is called from a C++ wrapper, not Python
# (a cpu-small step 0.42 vs 0.51 ms, measured); decompose_mm_pass: one-row products become
# fused loops (0.33 vs 0.42 ms). Weight prepacking (freezing) and autotuned GEMM templates
# were measured too and gained nothing at this size.
_OPTIONS = {"cpp_wrapper": True, "post_grad_fusion_options": {"decompose_mm_pass": {}}}


# The largest model (bytes of weights) --compile takes. The compiled step pays where per-op
# cost dominates: cpu-small (3.2 MB) 0.35 vs 0.61 s for 500 tokens, cpu-medium (10.7 MB) a
# step 0.93 vs 1.63 ms. GPT-2 124M (498 MB, context 1024) went from 24 to 90 ms a step: its
# products gain nothing, and the whole-buffer attention reads every slot of the context.
COMPILE_MAX_BYTES = SINGLE_THREAD_MAX_BYTES


def compile_available() -> str | None:
    """None when this machine can compile a decode step, else the reason it cannot."""
    if not any(shutil.which(cc) for cc in ("g++", "c++", "clang++")):
        return "--compile needs a C++ compiler (g++ or clang++) on the PATH"
    return None


def compile_refusal(model: Any) -> str | None:
    """Why ``model`` cannot decode compiled (a one-line reason), or None when it can."""
    if not isinstance(model, GPT):
        return "--compile applies to GPT models only"
    if any(isinstance(m, PackedLinear) for m in model.modules()):
        return "--compile takes a model without oneDNN-packed weights (pack=False)"
    if (any(isinstance(m, Int8Linear) for m in model.modules())
            or model.lm_head.weight.dtype != torch.float32):
        # compiled, int8 products round differently from the eager kernel (measured: other
        # tokens), and bf16 attention runs in bf16 where the eager path computes it in fp32:
        # the compiled step would not give the eager model's tokens
        return "--compile computes in fp32: it takes --dtype fp32 only"
    size = weight_bytes(model)
    if size > COMPILE_MAX_BYTES:
        return (f"--compile is for small models (at most {COMPILE_MAX_BYTES / 2**20:.0f} MiB "
                f"of weights; this one has {size / 2**20:,.0f} MiB): a larger model's step is "
                "bound by its products, not by per-op cost, and the compiled step reads the "
                "whole context's cache (GPT-2 124M decoded 3.8x slower compiled)")
    return compile_available()


class CompiledGPT(DecodeWrapper):
    """``model`` with its one-token steps compiled; everything else is the model's own.

    Implements the :class:`~scratchgpt.models.cache.CachedLM` interface the decode loop
    drives; the model is its one submodule (so its weights count as this module's) and any
    other attribute (``config``, ``num_params``, ...) is the model's.

    >>> from scratchgpt.models.gpt import GPTConfig
    >>> m = CompiledGPT(GPT(GPTConfig(vocab_size=65, n_layer=1, n_head=2, n_embd=16,
    ...                                block_size=32)).eval())
    >>> m.new_cache(2, max_len=8).max_len   # always the whole context: one graph for all
    32
    """

    def __init__(self, model: Any):
        reason = compile_refusal(model)
        if reason:
            raise ConfigError(reason)
        super().__init__(model)
        # one new token only. Prefills stay eager: a prompt's length varies, and the 48-token
        # re-prefill of a sliding cpu-small window, compiled, was no faster (2.1 vs 2.4 ms:
        # it is bound by its products, not by per-op cost)
        self.step = torch.compile(model.decode_static, fullgraph=True, dynamic=False,
                                  options=_OPTIONS)

    @torch.inference_mode()  # as the decode loop runs: a graph is compiled per grad mode
    def warm_up(self) -> None:
        """Compile the one-token step now, on a scratch cache, rather than at the first token
        of a generation."""
        idx = torch.zeros(1, 1, dtype=torch.long, device=self.model.lm_head.weight.device)
        self(idx, self.new_cache(1))

    def new_cache(self, batch_size: int, max_len: int | None = None,
                  dtype: torch.dtype | None = None) -> KVCache:
        """A cache of the whole context, whatever ``max_len`` asks: the compiled step is
        specialized to the cache's shape, so every generation gets the same one. (Nothing
        changes for the caller: a window slides only once the context is full.)"""
        return self.model.new_cache(batch_size, None, dtype)

    def forward(self, idx: Tensor, cache: KVCache | None = None,
                last_only: bool = False) -> Tensor:
        """idx (B, T) -> logits (B, T, V), as ``GPT.forward``; compiled for one new token of
        one row (B = T = 1) that fits the cache.

        Batches run eager: a graph is specialized to its batch size, and the batch of a
        generation shrinks as rows finish, so each new size would cost a compile (and the
        decomposed one-row products that make the step fast apply to one row only)."""
        B, T = idx.shape
        if (B != 1 or T != 1 or not isinstance(cache, KVCache)
                or cache.pos + T > cache.max_len):  # (the eager path raises the errors)
            return self.model(idx, cache, last_only)
        pos_offset = cache.pos_offset
        if pos_offset is None:
            pos_offset = torch.zeros(B, dtype=torch.long, device=idx.device)
        key_mask = cache.key_mask
        if key_mask is None:
            key_mask = torch.ones(B, cache.max_len, dtype=torch.bool, device=idx.device)
        slot = torch.arange(cache.pos, cache.pos + T, device=idx.device)  # (T,)
        logits = self.step(idx, slot, pos_offset, key_mask, cache.k, cache.v)  # (B, T, V)
        cache.pos += T
        return logits


def prepare_compiled(model: Any, dtype: str = "fp32", required: bool = True) -> nn.Module:
    """``model`` ready to decode with its one-token steps compiled: cast by
    :func:`~scratchgpt.models.fast_decode.prepare_for_decode` without oneDNN packing (the
    compiler lays out the products itself), then wrapped in :class:`CompiledGPT`. A model
    that cannot decode compiled (:func:`compile_refusal`) raises ``ConfigError``, or, when not
    ``required``, is prepared as usual (packed where that pays) and returned eager: a
    speculative pair compiles its small draft while a large target stays eager."""
    prepare_for_decode(model, dtype, pack=False, native=False)
    reason = compile_refusal(model)
    if reason is None:
        return CompiledGPT(model)
    if required:
        raise ConfigError(reason)
    return optimize_for_decode(model)  # (int8 Linears are left as they are)
