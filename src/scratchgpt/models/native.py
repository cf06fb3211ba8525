"""A GPT whose one-token decode step is one call into C (``decode_step.c``), llama.cpp style.

Why: decoding one token reads every weight once, so a step should take about the weights'
bytes over the memory bandwidth. PyTorch gets the products there, but a step of GPT-2 124M
also spends ~3 ms around them (about 150 kernel launches, module calls and allocations; `bench
decode-step` takes one apart), and a small model's step is nearly all such overhead.
``decode_step.c`` runs the whole step (embedding, LayerNorms, products, attention over the KV
cache, the output head) in one OpenMP region, streaming each weight row once with software
prefetch.

What it computes is the model's own forward: weights fp32, bf16 or int8 (those of
:class:`~scratchgpt.models.fast_decode.Int8Linear`, the same quantized values as the eager int8
model), activations, norms, attention and sums fp32. fp32 and bf16 weights are multiplied in
fp32 arithmetic; int8 products are ``int8_matmul.c``'s, which the C file includes: inputs
rounded to bf16, fp32 sums, as in the eager int8 model. fp32 and int8 steps give the eager
model's logits up to float rounding (tested); a bf16 step is closer to the fp32 model than the
eager bf16 one, which rounds every activation to bf16.

When it is used: steps of one new token per row on a :class:`~scratchgpt.models.gpt.KVCache`
(a sample, a stream, a chat, a speculative draft, and batches of a few rows: prompts, beams,
a server's running batch; :data:`SMALL_MODEL_ROWS`), for GPTs of every option but
``--no-residual``, ``--no-layernorm`` and ``--no-mlp`` (:func:`native_refusal`; the speedrun's
rotary positions, QK-norm, value embeddings, U-net skips and soft-capped logits included), on
x86 CPUs with AVX-512 and a C compiler (:mod:`~scratchgpt.models.c_kernels`). Everything else
(prompts, calls that score several tokens, larger batches) runs the eager model on the same
cache: both read and write the same slots. A row of a batch the C step takes is computed
exactly as it is alone (the same bits). ``SCRATCHGPT_DECODE_KERNEL=torch`` switches it off.

Memory: the C step reads the weights in their trained layout (rows of the ``(out, in)``
matrix), while the eager model (for prompts) keeps the layouts that PyTorch's kernels stream
fastest (:func:`~scratchgpt.models.fast_decode.optimize_for_decode`), so fp32 and bf16 models
hold their larger matrices twice. int8 models share theirs.

>>> from scratchgpt.models.gpt import GPT, GPTConfig
>>> model = GPT(GPTConfig(vocab_size=65, n_layer=2, n_head=2, n_embd=32, block_size=16))
>>> from scratchgpt.models.fast_decode import prepare_for_decode
>>> fast = prepare_for_decode(model.eval(), "fp32")
>>> cache = fast.new_cache(1)
>>> fast(torch.tensor([[1, 2, 3]]), cache).shape      # a prompt: the eager model
torch.Size([1, 3, 65])
>>> fast(torch.tensor([[4]]), cache).shape            # one token: one C call (where built)
torch.Size([1, 1, 65])
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from scratchgpt.models.c_kernels import load_library
from scratchgpt.models.fast_decode import DecodeWrapper, Int8Linear
from scratchgpt.models.gpt import GPT, KVCache

SOURCE = Path(__file__).with_name("decode_step.c")
SWITCH = "SCRATCHGPT_DECODE_KERNEL"
_WTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.int8: 2}
_ACTS = {"gelu_tanh": 0, "gelu": 1, "relu": 2, "relu2": 3}

_P, _I, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float

# The most rows (sequences) a C step takes; larger batches run the eager model, whose oneDNN
# products use the CPU's arithmetic better once a step is bound by it rather than by reading the
# weights or by per-op cost. Measured (``benchmarks/c_step_rows.py``, ms a step, C against
# PyTorch, 2 threads, Zen 4): cpu-small 0.12 vs 0.50 at 1 row, 0.61 vs 0.93 at 16, 1.16 vs 1.29
# at 32; a 6L/384d model (43 MB) 1.2 vs 2.9 at 1 row, 5.0 vs 5.6 at 16, 9.3 vs 8.7 at 32;
# GPT-2 124M (497 MB) 13.7 vs 19.8 at 1 row, 16.1 vs 19.0 at 3, 21.1 vs 20.4 at 4.
# A server gives a small model's whole batch to the C step (``small_rows``) even past that:
# while a C step runs, the Python thread that streams tokens to the clients can run too (a C
# call releases the GIL once, where PyTorch's step takes it back between its ~90 ops):
# cpu-small, 16 clients, 3,854-4,190 tokens/s against 2,703-3,152 with batches of 4 in C
# (docs/BENCHMARKS.md).
SMALL_MODEL_BYTES = 64 * 2**20
SMALL_MODEL_ROWS, LARGE_MODEL_ROWS = 16, 3


def describe(model: Any) -> str:
    """How ``model`` runs its one-token steps, in words (for benchmark reports)."""
    if isinstance(model, NativeGPT):
        return "one C call a token (decode_step.c)"
    return "PyTorch"


class _Linear(ctypes.Structure):
    _fields_ = [("w", _P), ("scale", _P), ("bias", _P),
                ("n_out", _I), ("n_in", _I), ("stride", _I)]


class _Layer(ctypes.Structure):
    _fields_ = [("ln1_w", _P), ("ln1_b", _P), ("ln2_w", _P), ("ln2_b", _P),
                ("attn", _Linear), ("proj", _Linear), ("fc", _Linear), ("fc_proj", _Linear),
                ("q_norm", _P), ("k_norm", _P), ("ve", _P), ("ve_bf16", _I), ("ve_lambda", _F)]


class _Model(ctypes.Structure):
    _fields_ = [("n_layer", _I), ("n_head", _I), ("n_embd", _I), ("wtype", _I), ("act", _I),
                ("eps", _F), ("softcap", _F),
                ("wte", _P), ("wte_bf16", _I), ("wpe", _P), ("rope_cos", _P), ("rope_sin", _P),
                ("layers", ctypes.POINTER(_Layer)), ("lnf_w", _P), ("lnf_b", _P),
                ("head", _Linear), ("n_skip", _I), ("skip_weights", _P)]


class _Step(ctypes.Structure):
    _fields_ = [("B", _I), ("slot", _I), ("max_len", _I), ("cache_bf16", _I),
                ("tokens", _P), ("positions", _P), ("firsts", _P), ("kc", _P), ("vc", _P)]


@functools.cache
def _library() -> ctypes.CDLL | None:
    return load_library(SOURCE, SWITCH)


def load() -> Callable[..., None] | None:
    """The C step, or None where it cannot be used (see the module docstring)."""
    lib = _library()
    if lib is None:
        return None
    fn = lib.gpt_decode_step
    # model, the call (rows, slot, cache), work, logits, threads
    fn.argtypes = [ctypes.POINTER(_Model), ctypes.POINTER(_Step), _P, _P, _I]
    fn.restype = None
    return fn


def native_refusal(model: Any) -> str | None:
    """Why ``model`` cannot decode in the C step (a one-line reason), or None when it can."""
    if not isinstance(model, GPT):
        return "the C decode step runs GPT models only"
    cfg = model.config
    unsupported = ((not cfg.residual, "--no-residual"), (not cfg.layernorm, "--no-layernorm"),
                   (not cfg.mlp, "--no-mlp"))
    flag = next((flag for bad, flag in unsupported if bad), None)
    if flag:
        return f"the C decode step does not implement {flag}"
    linears = [model.lm_head] + [m for block in model.transformer.h for m in (
        block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj)]
    odd = next((m for m in linears if type(m) not in (nn.Linear, Int8Linear)), None)
    if odd is not None:  # e.g. LoRA adapters not merged, or weights packed already
        return f"the C decode step reads plain or int8 Linears, not {type(odd).__name__}"
    if model.lm_head.weight.device.type != "cpu":
        return "the C decode step runs on the CPU"
    lib = _library()
    if lib is None:
        return ("the C decode step needs an x86 CPU with AVX-512 and a C compiler (cc), and "
                f"{SWITCH} not set to torch")
    if isinstance(model.lm_head, Int8Linear) and not lib.gpt_decode_int8():
        return "the C decode step's int8 products need a CPU with AVX512-BF16"
    return None


class _Weights:
    """The C step's view of a model: ctypes structures pointing into tensors it keeps alive."""

    def __init__(self, model: GPT):
        self.keep: list[Tensor] = []
        self.step_bytes = 0  # what one step reads: all but the one row of each table
        cfg, tr = model.config, model.transformer
        layers = (_Layer * cfg.n_layer)(*[self._layer(model, i) for i in range(cfg.n_layer)])
        wte = self._tensor(tr.wte.weight.detach(), table=True)
        wpe = rope = None  # the position table added to x, or the rotation of q and k
        if cfg.pos_encoding == "learned":
            wpe = tr.wpe.weight
        elif cfg.pos_encoding == "sinusoidal":
            wpe = model.sinusoid
        else:
            rope = (model.rope_cos, model.rope_sin)
        skips = model.skip_weights
        head = model.lm_head
        self.model = _Model(
            n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd,
            wtype=_WTYPES[head.weight.dtype], act=_ACTS[cfg.activation],
            eps=cfg.layer_norm_eps, softcap=cfg.logit_softcap,
            wte=wte, wte_bf16=int(tr.wte.weight.dtype == torch.bfloat16),
            wpe=self._float(wpe, table=True),
            rope_cos=self._float(rope and rope[0], table=True),
            rope_sin=self._float(rope and rope[1], table=True),
            layers=layers, lnf_w=self._float(tr.ln_f.weight), lnf_b=self._bias(tr.ln_f),
            head=self._linear(head), n_skip=0 if skips is None else len(skips),
            skip_weights=self._float(skips))
        self.layers = layers  # (the structure points into this array: keep it alive)

    def _tensor(self, t: Tensor | None, table: bool = False) -> int | None:
        if t is None:
            return None
        t = t.contiguous()
        self.keep.append(t)
        self.step_bytes += 0 if table else t.nbytes
        return t.data_ptr()

    def _float(self, t: Tensor | None, table: bool = False) -> int | None:
        """An fp32 copy of a parameter or buffer (or the tensor itself if fp32 already)."""
        return None if t is None else self._tensor(t.detach().float(), table)

    def _bias(self, module: nn.Module | None) -> int | None:
        return self._float(getattr(module, "bias", None))

    def _linear(self, lin: nn.Module) -> _Linear:
        if isinstance(lin, Int8Linear):  # (N, K + pad) int8, one fp32 scale per row
            w, scale = lin.weight, self._tensor(lin.scale_f32)
        else:
            w, scale = lin.weight.detach().contiguous(), None  # (N, K), the trained layout
        return _Linear(w=self._tensor(w), scale=scale, bias=self._bias(lin),
                       n_out=lin.out_features, n_in=lin.in_features, stride=w.shape[1])

    def _layer(self, model: GPT, i: int) -> _Layer:
        block, table = model.transformer.h[i], model.ve_table[i]
        attn = block.attn
        ve = None if table is None else model.transformer.ve[table].weight.detach()
        qk = (None, None) if attn.q_norm is None else (attn.q_norm.weight, attn.k_norm.weight)
        return _Layer(ln1_w=self._float(block.ln_1.weight), ln1_b=self._bias(block.ln_1),
                      ln2_w=self._float(block.ln_2.weight), ln2_b=self._bias(block.ln_2),
                      attn=self._linear(attn.c_attn), proj=self._linear(attn.c_proj),
                      fc=self._linear(block.mlp.c_fc), fc_proj=self._linear(block.mlp.c_proj),
                      q_norm=self._float(qk[0]), k_norm=self._float(qk[1]),
                      ve=self._tensor(ve, table=True), ve_bf16=int(ve is not None and
                                                                    ve.dtype == torch.bfloat16),
                      ve_lambda=0.0 if attn.ve_lambda is None else float(attn.ve_lambda.detach()))


class NativeGPT(DecodeWrapper):
    """``model`` with its one-token steps of up to ``max_rows`` rows run by ``decode_step.c``;
    everything else is the model's own (see the module docstring).

    Implements the :class:`~scratchgpt.models.cache.CachedLM` interface; the model is its one
    submodule and any other attribute (``config``, ``num_params``, ...) is the model's."""

    def __init__(self, model: GPT, weights: _Weights, small_rows: int = SMALL_MODEL_ROWS):
        super().__init__(model)
        self._weights = weights
        self._step = load()
        self._work: Tensor | None = None  # scratch of the C step, sized by the cache
        small = weights.step_bytes <= SMALL_MODEL_BYTES
        self.max_rows = small_rows if small else LARGE_MODEL_ROWS

    def step_bytes(self) -> int:
        """Bytes of weights a C step reads (every matrix, scale, bias and norm; one row of
        each embedding table, not counted)."""
        return self._weights.step_bytes

    def _native_call(self, idx: Tensor, cache: KVCache | None) -> bool:
        """Whether this call is one the C step takes: one new token per row."""
        return (idx.dim() == 2 and idx.shape[1] == 1 and idx.shape[0] <= self.max_rows
                and isinstance(cache, KVCache)
                and cache.batch_size == idx.shape[0] and cache.pos < cache.max_len
                and not self.model.training and not torch.is_grad_enabled()
                and cache.k.is_contiguous() and cache.v.is_contiguous()
                and cache.k.dtype in (torch.float32, torch.bfloat16))

    def forward(self, idx: Tensor, cache: KVCache | None = None,
                last_only: bool = False) -> Tensor:
        """idx (B, T) -> logits (B, T, V), as ``GPT.forward``; one C call for one new token
        per row (T = 1) that fits the cache."""
        if not self._native_call(idx, cache):
            return self.model(idx, cache, last_only)
        cfg = self.model.config
        tokens = idx[:, 0].to(torch.int32)  # (B,)
        if not bool(((tokens >= 0) & (tokens < cfg.vocab_size)).all()):
            return self.model(idx, cache, last_only)  # (the eager path raises the error)
        B, slot = idx.shape[0], cache.pos
        firsts = (torch.zeros(B, dtype=torch.int32) if cache.pos_offset is None
                  else cache.pos_offset.to(torch.int32))  # (B,) padding slots of each row
        positions = (slot - firsts).clamp_min(0).to(torch.int32)  # (B,) as KVCache numbers them
        step = _Step(B=B, slot=slot, max_len=cache.max_len,
                     cache_bf16=int(cache.k.dtype == torch.bfloat16),
                     tokens=tokens.data_ptr(), positions=positions.data_ptr(),
                     firsts=firsts.data_ptr(), kc=cache.k.data_ptr(), vc=cache.v.data_ptr())
        need = B * ((10 + self._weights.model.n_skip) * cfg.n_embd + cfg.n_head * cache.max_len)
        if self._work is None or self._work.numel() < need:
            self._work = torch.empty(need, dtype=torch.float32)
        logits = torch.empty(B, 1, cfg.vocab_size, dtype=torch.float32)
        self._step(ctypes.byref(self._weights.model), ctypes.byref(step), self._work.data_ptr(),
                   logits.data_ptr(), torch.get_num_threads())
        cache.pos += 1
        return logits


def c_step_weights(model: nn.Module) -> _Weights | None:
    """What the C step reads of ``model`` (already in its inference dtype, with its Linears
    still in their trained layout), or None when the C step cannot run it
    (:func:`native_refusal`). :func:`~scratchgpt.models.fast_decode.prepare_for_decode` calls
    it before it changes the eager model's layouts."""
    return _Weights(model) if native_refusal(model) is None else None
