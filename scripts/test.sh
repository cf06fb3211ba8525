#!/usr/bin/env bash
# Quick start, part 2: set up with the dev and gguf extras, lint, and run the whole test suite
# (offline once installed). The tests need nothing outside the repository: they build the small
# corpora they use. The gguf extra compiles llama.cpp (llama-cpp-python) the first time, about
# 10 minutes on 2 cores; pip keeps the built wheel, so later set-ups reuse it.
# The tests run in one process per CPU core (pytest-xdist's -n auto): each test uses one thread,
# and many wait on processes they start. Extra arguments go to pytest (e.g. scripts/test.sh -x
# tests/data; -n 0 runs them in this process alone, one after another). A lint error does not
# stop the tests from running; the script fails if either fails.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh dev,gguf
# the playground's browser test drives the system's Chromium (Debian's package)
if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null \
   && command -v apt-get >/dev/null; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get install -y --no-install-recommends chromium \
    || echo "could not install chromium: the playground's browser test will skip" >&2
fi
# the tests against llama.cpp must run here, not skip
export SCRATCHGPT_TEST_REQUIRE="${SCRATCHGPT_TEST_REQUIRE:-gguf,llama_cpp}"
status=0
.venv/bin/ruff check src tests benchmarks || status=$?
.venv/bin/python -m pytest -n auto "$@" || status=$?
exit "$status"
