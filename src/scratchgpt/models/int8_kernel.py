"""scratchgpt's own int8-weight matrix product for AVX-512 CPUs, compiled on first use.

Why: a decode step reads every weight once, so it should be bound by memory bandwidth, and
PyTorch's CPU int8-weight kernel (``aten._weight_int8pack_mm``) keeps too few reads in flight
to get there: GPT-2 124M decoded at ~85 tokens/s with it on a 2-core Zen 4. ``int8_matmul.c``
(next to this file) widens 16 weights per instruction, keeps four rows' sums in flight and
prefetches the blocks ahead: 153-168 tokens/s on the same machine (docs/BENCHMARKS.md).

How: the C file is compiled once per machine with the system's C compiler (``cc``, or ``$CC``)
into ``~/.cache/scratchgpt/kernels`` (``$XDG_CACHE_HOME`` is honoured), named by a hash of the
source, the flags, the compiler and the CPU's features, and loaded with :mod:`ctypes`. It is
built with OpenMP: PyTorch has already loaded its libgomp, so the kernel runs on PyTorch's own
threads.

When it is not used: a CPU without AVX-512, no C compiler, a failed build, or
``SCRATCHGPT_INT8_KERNEL=torch`` in the environment; :func:`load` then returns None and
:class:`~scratchgpt.models.fast_decode.Int8Linear` uses PyTorch's kernel. :func:`describe` says
which one a process uses.

>>> from scratchgpt.models.int8_kernel import describe
>>> describe() in ("scratchgpt AVX-512 (fp32 activations)",
...                "torch _weight_int8pack_mm (bf16 activations)")
True
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

SOURCE = Path(__file__).with_name("int8_matmul.c")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
K_MULTIPLE = 16  # the kernel reads 16 inputs per step: K is padded to a multiple of this


def cache_dir() -> Path:
    """Where compiled kernels are kept."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "scratchgpt" / "kernels"


def _supported() -> bool:
    """An x86 CPU with AVX-512, and the kernel not switched off."""
    if os.environ.get("SCRATCHGPT_INT8_KERNEL", "").lower() == "torch":
        return False
    try:
        return torch.backends.cpu.get_cpu_capability() == "AVX512"
    except AttributeError:
        return False


def _cpu_features() -> str:
    """The CPU's instruction-set flags: ``-march=native`` code built for one CPU may not run on
    another (a home directory shared by machines of different kinds gets one build each)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return platform.processor()


def _build(compiler: str) -> Path:
    """The compiled kernel for this source, flags and compiler, built if not cached. The build
    writes a temporary file and renames it, so concurrent processes never load half a file."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                             timeout=30).stdout
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode() + version.encode()
                         + _cpu_features().encode())
    out = cache_dir() / f"int8_matmul-{key.hexdigest()[:16]}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        built = Path(tmp) / out.name
        subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", str(built)], check=True,
                       capture_output=True, timeout=300)
        os.replace(built, out)
    return out


@functools.cache
def load() -> Callable[..., None] | None:
    """The kernel's C function, or None where it cannot be used (see the module docstring)."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if not _supported() or compiler is None:
        return None
    try:
        lib = ctypes.CDLL(str(_build(compiler)))
    except (OSError, subprocess.SubprocessError):
        return None
    fn = lib.int8_matmul
    p, i = ctypes.c_void_p, ctypes.c_int
    fn.argtypes = [p, i, i, p, p, p, p, i, i]  # x, M, K, w, scale, bias, y, N, threads
    fn.restype = None
    return fn


def describe() -> str:
    """Which int8 product this process uses, in words (for benchmark reports)."""
    if load() is not None:
        return "scratchgpt AVX-512 (fp32 activations)"
    return "torch _weight_int8pack_mm (bf16 activations)"


def int8_matmul(x: Tensor, w: Tensor, scale: Tensor, bias: Tensor | None) -> Tensor:
    """``x @ (w * scale[:, None]).T + bias`` without a float copy of ``w``.

    x: (M, K) fp32, contiguous; w: (N, K) int8, contiguous, K a multiple of
    :data:`K_MULTIPLE`; scale, bias: (N,) fp32. Returns (M, N) fp32. Needs :func:`load`."""
    fn = load()
    assert fn is not None, "int8_matmul needs the compiled kernel (see load())"
    (m, k), n = x.shape, w.shape[0]
    y = torch.empty(m, n, dtype=torch.float32)
    fn(x.data_ptr(), m, k, w.data_ptr(), scale.data_ptr(),
       None if bias is None else bias.data_ptr(), y.data_ptr(), n, torch.get_num_threads())
    return y
