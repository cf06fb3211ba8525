#!/usr/bin/env bash
# Create .venv (once) and install scratchgpt into it, editable. Usage: scripts/setup.sh [EXTRAS]
#   scripts/setup.sh        -> core install (torch, numpy, tqdm, matplotlib)
#   scripts/setup.sh dev    -> plus test and parity tools (pytest, ruff, transformers, tiktoken)
#   scripts/setup.sh dev,gguf -> plus GGUF export and llama.cpp (compiled once, ~10 minutes)
# PyTorch 2.13.0 is installed first, and a torch 2.13.0 already in .venv is kept: make .venv
# with the CPU build (pip install torch==2.13.0 --index-url
# https://download.pytorch.org/whl/cpu) to avoid PyPI's Linux wheel, the CUDA build with its
# NVIDIA libraries.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
venv=.venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
py="$venv/bin/python"
stamp="$venv/.scratchgpt-installed${extras:+-$extras}"
# The gguf extra compiles llama.cpp for this CPU. On CPUs with AMX (Xeons since Sapphire
# Rapids) its AMX kernels stopped the process with an illegal instruction (tilezero, in its
# q8_0 products) on a 2-core Xeon host where PyTorch's own AMX products run: build it without
# them (its AVX-512 kernels remain).
if [[ ",$extras," == *,gguf,* ]] && grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
  no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  export CFLAGS="${CFLAGS:+$CFLAGS }$no_amx" CXXFLAGS="${CXXFLAGS:+$CXXFLAGS }$no_amx"
fi
# Reinstall only when pyproject.toml changed since the last install of these extras.
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  "$py" -m pip install -q --upgrade pip >/dev/null
  "$py" -m pip install -q "torch==2.13.0"
  "$py" -m pip install -q -e ".${extras:+[$extras]}"
  touch "$stamp"
fi
# pip reuses a wheel it built before whatever the flags, and a .venv set up before may hold
# one: llama.cpp built with the AMX kernels is dropped from pip's cache and built again
# without them (once; the new wheel is kept)
amx_built="import llama_cpp as l; assert b'AMX_INT8 = 1' in l.llama_print_system_info()"
if [ -n "${no_amx:-}" ] && "$py" -c "$amx_built" 2>/dev/null; then
  echo "rebuilding llama.cpp without its AMX kernels (about 10 minutes on 2 cores)" >&2
  "$py" -m pip cache remove llama_cpp_python >/dev/null || true
  "$py" -m pip install -q --force-reinstall --no-deps \
    "llama-cpp-python==$("$py" -c 'import llama_cpp; print(llama_cpp.__version__)')"
fi
