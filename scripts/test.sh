#!/usr/bin/env bash
# Quick start, part 2: set up with the dev extras, lint, and run the whole test suite (offline).
# The tests need nothing outside the repository: they build the small corpora they use.
# Extra arguments go to pytest (e.g. scripts/test.sh -x tests/data). A lint error does not stop
# the tests from running; the script fails if either fails.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh dev
status=0
.venv/bin/ruff check src tests benchmarks || status=$?
.venv/bin/python -m pytest "$@" || status=$?
exit "$status"
