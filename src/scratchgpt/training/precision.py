"""Where and in what precision training runs: one policy for every training.

``auto`` picks CUDA when there is a GPU, and bf16 autocast wherever the hardware runs it fast
(GPUs with bf16, CPUs with AVX512-BF16 or AMX); elsewhere fp32. On a CPU without bf16 support
a bf16 matrix product is emulated and many times slower than fp32, so asking for it there is
refused.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import torch

from scratchgpt.errors import ConfigError
from scratchgpt.validation import FLAGS, named


def resolve_device(name: str, options: Mapping[str, str] = FLAGS) -> torch.device:
    """``auto`` -> cuda if available, else cpu; ``cuda`` without a GPU is an error (named as
    ``options`` name settings: validation.FLAGS or KEYWORDS)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{named(options, 'device', 'cuda')} was asked for, but no CUDA GPU "
                          "is available")
    return torch.device(name)


def bf16_supported(device: torch.device) -> bool:
    """True where bf16 matrix products run in hardware (not emulated)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    # bf16 matmuls are fast on CPUs with AMX or AVX512-BF16, slow emulation elsewhere.
    return torch.backends.cpu.get_cpu_capability() in ("AVX512", "AMX") and \
        torch.ops.mkldnn._is_mkldnn_bf16_supported()


def resolve_dtype(name: str, device: torch.device) -> str:
    """``auto`` -> ``bf16`` where supported (measured 1.5x per step on an AVX512-BF16 CPU even
    for the smallest preset), else ``fp32``; ``bf16`` where unsupported is an error."""
    if name != "auto":
        if name == "bf16" and not bf16_supported(device):
            raise ConfigError(f"bf16 is not supported on this {device.type}")
        return name
    return "bf16" if bf16_supported(device) else "fp32"


def resolve_muon_dtype(name: str, device: torch.device) -> str:
    """Muon's Newton-Schulz precision: ``auto`` as the compute precision resolves it; ``bf16``
    is allowed everywhere (torch's own Muon: emulated, so slow, where unsupported)."""
    return resolve_dtype("auto", device) if name == "auto" else name


def autocast(device: torch.device, dtype: str) -> Any:
    """The context the forward pass and loss run in: bf16 autocast, or nothing (fp32)."""
    if dtype == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
