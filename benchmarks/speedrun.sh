#!/usr/bin/env bash
# The training speedrun's ablation table (docs/BENCHMARKS.md, "Training speedrun"): each option alone
# against the base preset, then the stack (the budget's speedrun preset: cpu-speedrun at 90 s,
# cpu-medium-speedrun at 10 minutes), and nanoGPT's CPU recipe, at 90 s (base cpu-small) and
# 10 minutes (base cpu-medium); quality as val nats/token and bits/char. --variants all-options
# runs every option at once on the base preset.
# Run on an otherwise idle machine: every run is timed by the wall clock. PYTHON: the
# interpreter with scratchgpt installed (default python3).
#   benchmarks/speedrun.sh                      # everything: ~4 h (15 runs per budget on Tiny
#                                               # Shakespeare, 3 each on python-stdlib and kjv)
#   benchmarks/speedrun.sh --budgets 90s        # the 90 s column only (~40 min)
#   benchmarks/speedrun.sh --budgets 10m        # the 10 minute column only (~3.5 h)
#   benchmarks/speedrun.sh --budgets 90s --datasets shakespeare --variants baseline,stack
#   benchmarks/speedrun.sh --budgets 800 --threads 1   # a step-matched pilot (800 updates)
#   benchmarks/speedrun.sh --budgets 90s --tokenizer bpe:768 --variants two-layers,two-layers-rope
#                                               # each text as a byte-level BPE of 768 ids
#   benchmarks/speedrun.sh --budgets 90s --tokenizer bpe:768:drop0.1x16 --variants two-layers-rope
#                                               # its training split as 16 BPE-dropout copies
#   benchmarks/speedrun.sh --budgets 10m --base cpu-speedrun --tokenizer bpe:768 --variants four-layers
#                                               # the 10-minute recipe for a slow CPU, each text
#   benchmarks/speedrun.sh --budgets 10m --base cpu-speedrun --tokenizer bpe:768 --variants six-by-192
#                                               # the same for a CPU with bf16 products
#   benchmarks/speedrun.sh --base shakespeare-gpu --budgets 1200 --datasets shakespeare \
#       --variants baseline,model-options --flags '--device cuda'
#                                               # on a GPU: nanoGPT's Shakespeare model, N updates
# Tiny Shakespeare is read from $SCRATCHGPT_DATA_DIR (default ../shared/corpora) or the cache;
# kjv, the King James Bible, is printed by the `bible` program of Debian's bible-kjv package
# (apt-get install bible-kjv), offline. Writes runs/speedrun/{results.jsonl,table.md} and a
# picture per text and budget, runs/speedrun/TEXT-BUDGET.png (bits/char against seconds).
set -euo pipefail
cd "$(dirname "$0")/.."
export SCRATCHGPT_DATA_DIR="${SCRATCHGPT_DATA_DIR:-$(cd .. && pwd)/shared/corpora}"
echo "== machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(uptime), $(date -Is)"
if command -v nvidia-smi >/dev/null; then echo "== GPU: $(nvidia-smi -L | head -1)"; fi
exec "${PYTHON:-python3}" benchmarks/speedrun.py "$@"
