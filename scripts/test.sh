#!/usr/bin/env bash
# Quick start, part 2: set up with the dev extras and run the whole test suite (offline).
# The tests need nothing outside the repository: they build the small corpora they use.
# Extra arguments go to pytest (e.g. scripts/test.sh -x tests/data).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh dev
.venv/bin/ruff check src tests benchmarks
.venv/bin/python -m pytest "$@"
