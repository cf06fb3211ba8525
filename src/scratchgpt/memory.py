"""The memory a model needs, estimated before anything is allocated.

A setting can ask for far more than a machine holds (``train --n-layer 100000``, ``sample
--num-samples 1000000000``), and so can a file (a checkpoint or Hugging Face ``config.json``
claiming a million layers beside one layer of weights). Allocating first would swap the machine
to a standstill or get the process killed; so everything that builds a model, an optimizer or a
KV cache first asks this module what it will take, and refuses in one line what does not fit.

    parameters   counted on the meta device (shapes only, no memory); a very deep config is
                 extrapolated from two shallow ones, since every layer adds the same count
    training     weights + gradients + optimizer state (AdamW keeps 2 values per parameter, Muon
                 1 per matrix it owns) + the activations kept for the backward pass
    inference    weights + KV cache (2 x n_layer x batch x length x width) + one prefill's
                 logits and activations

>>> from dataclasses import replace
>>> from scratchgpt.models import model_config
>>> gpt = model_config("gpt", vocab_size=65, n_layer=2, n_head=2, n_embd=32, block_size=16)
>>> parameter_count(gpt) == sum(p.numel() for p in build_model(gpt).parameters())
True
>>> deep = replace(gpt, n_layer=100_000)  # counted at once, without building 100,000 blocks
>>> per_layer = 12 * 32**2 + 13 * 32     # attention and MLP weights and biases, 2 LayerNorms
>>> parameter_count(deep) - parameter_count(gpt) == (100_000 - 2) * per_layer
True
>>> check_fits(training_estimate(deep, batch_size=12), "training", available=2**30)
...                                                          # doctest: +ELLIPSIS
Traceback (most recent call last):
scratchgpt.errors.ConfigError: training needs about ... GiB (weights ..., gradients ..., \
optimizer ..., activations ...), more than the 1.0 GiB of memory available
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from scratchgpt.errors import ConfigError, ScratchGPTError
from scratchgpt.models import ModelConfig, build_model
from scratchgpt.models.gpt import sliding_batch_slots

MEMORY_LIMIT_ENV = "SCRATCHGPT_MEMORY_LIMIT"  # bytes (or 512MiB, 2GiB, ...) deemed available
DIRECT_DEPTH = 64  # deeper configs are extrapolated rather than built on the meta device
FP32 = 4
# Floats kept per token and layer for the backward pass: attention (q, k, v, its output and
# projection) and MLP (4C in, 4C activated, C out), LayerNorms and residuals: ~16 x width.
ACTIVATION_FLOATS = 16
_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6,
          "mib": 2**20, "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12,
          "tib": 2**40}


@dataclass(frozen=True)
class Estimate:
    """Bytes by part (``weights``, ``gradients``, ``kv_cache``, ...); ``total`` is their sum."""

    parts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def describe(self) -> str:
        """``3.2 GiB (weights 1.0, gradients 1.0, ...)``: the total and each part, in the
        unit that shows the total best (GiB, MiB or KiB)."""
        unit = _unit(self.total)
        parts = ", ".join(f"{name.replace('_', ' ')} {_in(b, unit)}"
                          for name, b in self.parts.items())
        return f"{_in(self.total, unit)} {unit} ({parts})"


_SHOWN_UNITS = {"GiB": 2**30, "MiB": 2**20, "KiB": 2**10}  # the units sizes are shown in


def _unit(n: float) -> str:
    """The largest unit in which ``n`` bytes is at least 1 (KiB below that).

    >>> _unit(3 * 2**30), _unit(200 * 2**20), _unit(10)
    ('GiB', 'MiB', 'KiB')
    """
    return next((u for u, size in _SHOWN_UNITS.items() if n >= size), "KiB")


def _in(n: float, unit: str) -> str:
    return f"{n / _SHOWN_UNITS[unit]:,.1f}"


def _size(n: float) -> str:
    """``n`` bytes in its own unit: ``'1.5 GiB'``, ``'10.0 KiB'``."""
    unit = _unit(n)
    return f"{_in(n, unit)} {unit}"


# ---- parameters


class _ShapesOnly(TorchFunctionMode):
    """Inside ``torch.device("meta")``: skip the work that only fills values, which is all a
    parameter count can do without. Initializers return their tensor untouched, and ``arange``
    (position tables) gives an empty meta tensor of its length: torch's meta ``arange`` and
    random initializers load a large Python module on first use (seconds)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name.endswith("_") and name.rstrip("_") in _INITIALIZERS:
            return args[0] if args else kwargs["tensor"]
        if func is torch.arange:
            return _meta_arange(*args, **kwargs)
        return func(*args, **kwargs)


_INITIALIZERS = {"normal", "uniform", "zero", "zeros", "ones", "fill", "constant",
                 "trunc_normal", "kaiming_uniform", "kaiming_normal", "xavier_uniform",
                 "xavier_normal", "orthogonal"}


def _meta_arange(*args: Any, dtype: torch.dtype | None = None, **kwargs: Any) -> torch.Tensor:
    start, end, step = (0, args[0], 1) if len(args) == 1 else (*args, 1)[:3]
    if dtype is None:
        whole = all(isinstance(x, int) for x in (start, end, step))
        dtype = torch.int64 if whole else torch.get_default_dtype()
    return torch.empty(max(0, math.ceil((end - start) / step)), dtype=dtype, device="meta")


def _meta_counts(config: ModelConfig) -> tuple[int, int]:
    """(parameters, parameters of the matrices Muon would own) of a model built on the meta
    device: exact, and free of memory and initialization."""
    from scratchgpt.training.optim import hidden_matrices

    try:
        with torch.device("meta"), _ShapesOnly():
            model = build_model(config)
    except (TypeError, OverflowError, RuntimeError) as e:
        if "verflow" not in str(e):
            raise
        raise ConfigError("this model is too large to build: one of its tensors would have "
                          "more elements than a 64-bit size can count") from None
    return (sum(p.numel() for p in model.parameters()),
            sum(p.numel() for p in hidden_matrices(model)))


def _read(config: ModelConfig, names: tuple[str, ...], default: Any = None) -> Any:
    """The first of ``names`` that ``config`` has, else that the GPT it wraps has (``gpt``: a
    classifier's or LoRA model's backbone), else ``default``. A wrapper's own fields come
    first: a classifier's ``n_classes`` are its outputs, in place of its GPT's vocabulary."""
    for c in (config, getattr(config, "gpt", None)):
        found = next((getattr(c, k) for k in names if c is not None and hasattr(c, k)), None)
        if found is not None:
            return found
    return default


def depth(config: ModelConfig) -> int:
    """The layers of ``config``, or of the GPT a classifier or LoRA model wraps (0 for a
    model without ``n_layer``). Beyond :data:`DIRECT_DEPTH`, counts are extrapolated rather
    than built on the meta device."""
    return _read(config, ("n_layer",), 0)


def _counts(config: ModelConfig) -> tuple[int, int]:
    layers = depth(config)
    if layers <= DIRECT_DEPTH:
        return _meta_counts(config)
    # Beyond the first few layers every layer adds the same parameters, so two shallow
    # builds give the count of any depth. (The shallow depths cover a GPT's value-embedding
    # layers, and a classifier's last_k trained blocks; a config with more tables than that
    # is counted without them: a lower bound.)
    tables = _read(config, ("value_embeds",), 0)
    shrink = {} if 2 * tables + 4 <= DIRECT_DEPTH else {"value_embeds": 0}
    low = max(2, 2 * tables if not shrink else 2, getattr(config, "last_k", 1))
    a, b = (_meta_counts(_with_depth(config, n, shrink)) for n in (low, low + 2))
    return tuple(x + (y - x) * (layers - low) // 2 for x, y in zip(a, b, strict=True))


def _with_depth(config: ModelConfig, n_layer: int, changes: dict[str, Any]) -> ModelConfig:
    """``config`` with ``n_layer`` layers and ``changes``: its own, or those of the GPT it
    wraps (a classifier's or LoRA model's)."""
    gpt = getattr(config, "gpt", None)
    if gpt is None:
        return dataclasses.replace(config, n_layer=n_layer, **changes)
    return dataclasses.replace(config, gpt=dataclasses.replace(gpt, n_layer=n_layer, **changes))


def parameter_count(config: ModelConfig) -> int:
    """The number of parameters a model of ``config`` has (shared weights counted once)."""
    return _counts(config)[0]


# ---- estimates


def _shape(config: ModelConfig) -> tuple[int, int, int, int]:
    """(layers, width, vocabulary, context) of any model config, for activation estimates;
    a model that wraps a GPT (a classifier, a LoRA model) has its GPT's shape, and its own
    outputs."""
    width = _read(config, ("n_embd", "hidden", "d_model", "embed_dim"),
                  1)  # (a bigram model is a table: its logits count)
    layers = _read(config, ("n_layer",), 1) * (2 if hasattr(config, "d_model") else 1)
    vocab = _read(config, ("vocab_size", "tgt_vocab", "n_classes"), 1)
    context = _read(config, ("block_size", "max_positions"), 1)
    return layers, width, vocab, context


def _attends(config: ModelConfig) -> bool:
    """A model with attention heads (a KV cache), its own or the GPT's it wraps."""
    return _read(config, ("n_head",)) is not None


def _attention_floats(config: ModelConfig, tokens: int) -> int:
    """Attention weights kept per token and layer when attention is written out (``math``, or
    attention dropout): one row of ``tokens`` per head. The fused kernel keeps none."""
    config = getattr(config, "gpt", config)  # (a classifier's or LoRA model's: its GPT's)
    if not hasattr(config, "n_head") or not hasattr(config, "attn_impl"):
        return 0
    dropout = config.dropout if config.attn_dropout is None else config.attn_dropout
    return config.n_head * tokens if config.attn_impl == "math" or dropout > 0 else 0


def training_estimate(config: ModelConfig, batch_size: int, optimizer: str = "adamw",
                      grad_accum: int = 1) -> Estimate:
    """Bytes a training process holds at its peak (fp32 weights; bf16 autocast keeps less)."""
    params, muon_params = _counts(config)
    layers, width, vocab, context = _shape(config)
    state = 2 * params if optimizer == "adamw" else 2 * (params - muon_params) + muon_params
    per_token = layers * (ACTIVATION_FLOATS * width + _attention_floats(config, context)) \
        + 3 * vocab  # logits, their log-softmax and its gradient
    return Estimate({"weights": FP32 * params, "gradients": FP32 * params,
                     "optimizer": FP32 * state,
                     "activations": FP32 * batch_size * context * per_token})


def inference_estimate(config: ModelConfig, batch_size: int, length: int | None = None,
                       weight_bytes: int = FP32) -> Estimate:
    """Bytes to generate ``batch_size`` sequences of up to ``length`` tokens (default: the
    model's context): weights, the KV cache (a recurrent state for RNNs; a batch that goes
    past the context holds :func:`~scratchgpt.models.gpt.sliding_batch_slots`), and the
    largest transient, a prefill's logits and activations."""
    layers, width, vocab, context = _shape(config)
    asked, attends = length or context, _attends(config)
    length = min(asked, context) if attends else asked
    cached = length if attends else 1  # an RNN's state is one position
    if attends and batch_size > 1 and asked > context:
        cached = sliding_batch_slots(context)  # rows sliding at their own lengths
    per_token = vocab + ACTIVATION_FLOATS * width + _attention_floats(config, length)
    return Estimate({"weights": weight_bytes * parameter_count(config),
                     "kv_cache": FP32 * 2 * layers * batch_size * cached * width,
                     "activations": FP32 * batch_size * length * per_token})


# ---- what is available


def parse_bytes(text: str) -> int:
    """``"2GiB"``, ``"512 MB"``, ``"1000000"`` -> bytes.

    >>> parse_bytes("1.5GiB") == 3 * 2**29
    True
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ConfigError(f"${MEMORY_LIMIT_ENV}={text!r}: expected a size such as 2GiB or "
                          "512MB")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def available_bytes(device: str | torch.device = "cpu") -> int:
    """Memory free for a new allocation: ``$SCRATCHGPT_MEMORY_LIMIT`` when set; else free GPU
    memory on a CUDA device, or the kernel's ``MemAvailable`` (free RAM plus what caches
    give back) on a CPU."""
    limit = os.environ.get(MEMORY_LIMIT_ENV)
    if limit:
        return parse_bytes(limit)
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return math.inf  # cannot tell: do not refuse


def check_fits(estimate: Estimate, what: str, device: str | torch.device = "cpu",
               copies: int = 1, available: int | None = None,
               error: type[ScratchGPTError] = ConfigError, remedy: str = "") -> None:
    """Raise ``error`` (one line: the estimate, by part, what is available, and ``remedy``,
    what to do, when given) when ``copies`` x ``estimate`` does not fit in the memory
    available on ``device``."""
    free = available_bytes(device) if available is None else available
    need = estimate.total * copies
    if need > free:
        times = f"{copies} processes x " if copies > 1 else ""
        raise error(f"{what} needs about {times}{estimate.describe()}, more than the "
                    f"{_size(free)} of memory available{'; ' + remedy if remedy else ''}")

