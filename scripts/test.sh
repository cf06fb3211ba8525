#!/usr/bin/env bash
# Quick start, part 2: set up with the dev extras and run the whole test suite (offline).
# Tests read Tiny Shakespeare from $SCRATCHGPT_DATA_DIR (default: ../shared/corpora).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh dev
export SCRATCHGPT_DATA_DIR="${SCRATCHGPT_DATA_DIR:-$(cd .. && pwd)/shared/corpora}"
.venv/bin/ruff check src tests benchmarks
.venv/bin/python -m pytest "$@"
