#!/usr/bin/env bash
# Quick start, part 1: set up, train the cpu-small GPT on the offline default corpus (this
# Python's standard library sources) for 2 minutes, and sample from it. No network needed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
source .venv/bin/activate
scratchgpt train --preset cpu-small --time-budget "${DEMO_BUDGET:-2m}" --out runs/demo --overwrite
scratchgpt sample --checkpoint runs/demo --prompt "def " --max-new-tokens 400 --temperature 0.8 --seed 0
echo
echo "Loss curve: runs/demo/loss.png   Metrics: runs/demo/metrics.csv"
