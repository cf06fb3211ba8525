#!/usr/bin/env bash
# Quick start, part 2: set up with the dev and gguf extras and run the whole test suite
# (offline once installed). The gguf extra compiles llama.cpp (llama-cpp-python) the first time,
# about 10 minutes on 2 cores; pip keeps the built wheel, so later set-ups reuse it.
# Tests read Tiny Shakespeare from $SCRATCHGPT_DATA_DIR (default: ../shared/corpora).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh dev,gguf
# the tests against llama.cpp must run here, not skip
export SCRATCHGPT_TEST_REQUIRE="${SCRATCHGPT_TEST_REQUIRE:-gguf,llama_cpp}"
export SCRATCHGPT_DATA_DIR="${SCRATCHGPT_DATA_DIR:-$(cd .. && pwd)/shared/corpora}"
.venv/bin/ruff check src tests benchmarks
.venv/bin/python -m pytest "$@"
