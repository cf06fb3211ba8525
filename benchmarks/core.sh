#!/usr/bin/env bash
# The core benchmarks (speed and quality on Tiny Shakespeare, character level), run one after
# another on an otherwise idle machine. Usage:
#   benchmarks/core.sh [NANOGPT_DIR]   # NANOGPT_DIR: a karpathy/nanoGPT checkout whose
#                                              # data/shakespeare_char has been prepared
# Prints every figure recorded in docs/BENCHMARKS.md; writes runs under runs/bench-*.
set -euo pipefail
cd "$(dirname "$0")/.."
. benchmarks/lib.sh
help_if_asked benchmarks/core.sh "$@"
need_scratchgpt
export SCRATCHGPT_DATA_DIR="${SCRATCHGPT_DATA_DIR:-$(cd .. && pwd)/shared/corpora}"
nano="${1:-}"
[ -z "$nano" ] || need_nanogpt "$nano"
echo "== machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(date -Is)"

echo "== 1. training throughput, nanoGPT CPU recipe shape (4L/4H/128d, context 64, batch 12)"
scratchgpt bench train --steps 200 --variants fp32,bf16 ${nano:+--nanogpt "$nano" --nanogpt-iters 300}

if [ -n "$nano" ]; then
  echo "== 2. nanoGPT reference recipe, 2000 iterations (its val loss and wall time)"
  ( cd "$nano" && /usr/bin/time -f "nanoGPT wall %e s" python3 train.py config/train_shakespeare_char.py \
      --device=cpu --compile=False --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 \
      --n_embd=128 --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0 \
      --always_save_checkpoint=False --out_dir=/tmp/nanogpt-bench 2>&1 | grep -E "^step|wall" )
fi

echo "== 3. quality at a wall-clock budget: cpu-small, 90 s"
scratchgpt train --dataset shakespeare --preset cpu-small --time-budget 90s \
  --out runs/bench-cpu-small --overwrite --no-progress

echo "== 4. sampling speed: 500 tokens from the cpu-small model"
scratchgpt bench sample --checkpoint runs/bench-cpu-small --tokens 500 --repeats 5

echo "== 5. quality at a wall-clock budget: cpu-medium, 10 min"
scratchgpt train --dataset shakespeare --preset cpu-medium --time-budget 10m \
  --out runs/bench-cpu-medium --overwrite --no-progress
