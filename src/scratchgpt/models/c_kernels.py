"""Building scratchgpt's C kernels: compiled on first use, cached, loaded with :mod:`ctypes`.

Six C files ship next to this module: ``int8_matmul.c`` (an int8-weight matrix product,
:mod:`~scratchgpt.models.int8_kernel`), ``decode_step.c`` (a whole GPT decode step,
:mod:`~scratchgpt.models.native`), ``causal_attention.c`` (causal attention for training,
:mod:`~scratchgpt.models.attention_kernel`), ``block_ops.c`` (a training block's
LayerNorms, residual adds and activation, :mod:`~scratchgpt.models.block_ops`),
``tile_matmul.c`` (a training block's bf16 products on AMX tiles, or by AVX512-BF16 dot
products, :mod:`~scratchgpt.models.tile_matmul`) and ``block_kernel.c`` (the last three
compiled together: a training block's forward and backward in one call each,
:mod:`~scratchgpt.models.block_kernel`). All are written for x86 CPUs with AVX-512.

Each is compiled once per machine with the system's C compiler (``cc``, or ``$CC``) into
``kernels/`` of scratchgpt's cache (:func:`scratchgpt.paths.cache_dir`: ``$SCRATCHGPT_CACHE_DIR``,
else ``$XDG_CACHE_HOME/scratchgpt``, else ``~/.cache/scratchgpt``), named by a hash of the
source, the flags, the compiler and the CPU's features, so a home directory shared by
machines of different kinds gets one build for each. A process about to build says so on
stderr, once, where stderr is a terminal (the first command on a machine pauses there for a
few seconds). Built with OpenMP: PyTorch has already
loaded its libgomp, so the kernels run on PyTorch's own threads. The training kernels share
their rows between those threads as a static schedule would, but a thread done with its own
takes over the last rows of a slower one (``shares.h``; ``SCRATCHGPT_SHARES=static``,
:data:`SHARES_SWITCH`, keeps each to its own).

:func:`load_library` returns None where a kernel cannot be used: a CPU without AVX-512, no C
compiler, a failed build, or the kernel switched off by its environment variable (the
modules using it then fall back to PyTorch).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from scratchgpt.paths import cache_dir as scratchgpt_cache

FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
SHARES_SWITCH = "SCRATCHGPT_SHARES"  # =static: no thread takes over another's rows (shares.h)


def cache_dir() -> Path:
    """Where compiled kernels are kept: ``kernels/`` in scratchgpt's one cache."""
    return scratchgpt_cache() / "kernels"


def has_avx512() -> bool:
    """An x86 CPU with AVX-512 (what the kernels are written for)."""
    try:
        return torch.backends.cpu.get_cpu_capability() == "AVX512"
    except AttributeError:
        return False


def _cpu_features() -> str:
    """The CPU's instruction-set flags: ``-march=native`` code built for one CPU may not run on
    another."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return platform.processor()


def _source_bytes(source: Path) -> bytes:
    """The source and the local files it includes (``#include "name"``), and theirs, which the
    build's cache key must cover too (``decode_step.c`` includes ``int8_matmul.c``,
    ``block_kernel.c`` three kernels' files, and these ``simd16.h`` and ``shares.h``)."""
    text = source.read_bytes()
    names = re.findall(rb'^#include "([^"]+)"', text, flags=re.MULTILINE)
    return text + b"".join(_source_bytes(source.parent / name.decode()) for name in names)


def _build(source: Path, compiler: str) -> Path:
    """The compiled library for this source, flags and compiler, built if not cached. The build
    writes a temporary file and renames it, so concurrent processes never load half a file."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                             timeout=30).stdout
    key = hashlib.sha256(_source_bytes(source) + " ".join(FLAGS).encode() + version.encode()
                         + _cpu_features().encode())
    out = cache_dir() / f"{source.stem}-{key.hexdigest()[:16]}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    _say_building()
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        built = Path(tmp) / out.name
        subprocess.run([compiler, *FLAGS, str(source), "-o", str(built), "-lm"], check=True,
                       capture_output=True, timeout=300)
        os.replace(built, out)
    return out


_said_building = False  # whether this process has said that it compiles kernels


def _say_building() -> None:
    """One line on stderr, where it is a terminal, before a process's first build: the first
    command on a machine pauses seconds there while it compiles the kernels it uses. Not where
    stderr is a file or a pipe (a log, a test), whose readers did not ask for it."""
    global _said_building
    if not _said_building and sys.stderr is not None and sys.stderr.isatty():
        print("scratchgpt: compiling its C kernels for this CPU (once per machine, a few "
              "seconds)", file=sys.stderr, flush=True)
        _said_building = True


def load_library(source: Path, switch: str | None) -> ctypes.CDLL | None:
    """``source`` compiled and loaded, or None where it cannot be used: no AVX-512, no
    compiler, a failed build, or ``$switch`` set to ``torch`` (PyTorch's path instead; None:
    the caller reads its switch at each call itself)."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    off = switch is not None and os.environ.get(switch, "").lower() == "torch"
    if off or not has_avx512() or compiler is None:
        return None
    try:
        return ctypes.CDLL(str(_build(source, compiler)))
    except (OSError, subprocess.SubprocessError):
        return None


def check_allocated(failed: int, kernel: str) -> None:
    """A C call's status: MemoryError naming ``kernel`` when it returned nonzero (a thread could
    not allocate its work space), nothing when it returned 0."""
    if failed:
        raise MemoryError(f"{kernel}: no memory for its work space")


def profiled(name: str) -> Any:
    """A range named ``name`` while ``torch.profiler`` records (so a profile, and ``scratchgpt
    bench train --breakdown``, see a C call by its name wherever it is made from; ctypes calls
    are no operator it would see), and nothing otherwise."""
    if torch.autograd._profiler_enabled():
        return torch.profiler.record_function(name)
    return contextlib.nullcontext()
