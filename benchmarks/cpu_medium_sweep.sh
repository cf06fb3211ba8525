#!/usr/bin/env bash
# How the cpu-medium preset was chosen: the runs behind docs/BENCHMARKS.md's "How cpu-medium
# was chosen" table. Each pair runs side by side, one thread each (the 2-core machine's two
# cores), so within a pair the runs are comparable; across pairs only the step-matched ones are.
# Usage: benchmarks/cpu_medium_sweep.sh [PAIR...]   (PAIR: optimizer, budget, dropout, schedule)
set -euo pipefail
cd "$(dirname "$0")/.."
. benchmarks/lib.sh
help_if_asked benchmarks/cpu_medium_sweep.sh "$@"
need_scratchgpt
export SCRATCHGPT_DATA_DIR="${SCRATCHGPT_DATA_DIR:-$(cd .. && pwd)/shared/corpora}"
out=runs/sweep-cpu-medium

run() {  # NAME FLAGS... -> runs/sweep-cpu-medium/NAME, one thread, the cpu-medium preset
  # with the rate schedule it had when these runs were made (lr 4e-3 -> 4e-4); FLAGS override.
  local name=$1; shift
  scratchgpt train --dataset shakespeare --preset cpu-medium --threads 1 --eval-interval 500 \
    --min-lr 4e-4 --out "$out/$name" --overwrite --no-progress "$@" | sed "s/^/$name: /"
}

pair() { run "$@" & }

pairs=("$@")
[ ${#pairs[@]} -gt 0 ] || pairs=(optimizer budget dropout schedule)
for what in "${pairs[@]}"; do  # every name checked before the first pair runs
  case $what in
    optimizer|budget|dropout|schedule) ;;
    *) fail "unknown pair $what: optimizer, budget, dropout or schedule" ;;
  esac
done
mkdir -p "$out"
for what in "${pairs[@]}"; do
  case $what in
    optimizer)  # step-matched: the same 1000 updates of batch 16 x 128
      pair adamw-1k --max-iters 1000 --warmup-iters 100 --optimizer adamw
      pair muon-1k --max-iters 1000 --warmup-iters 100 --optimizer muon ;;
    budget)     # the same 10 minutes, half a machine each
      pair muon-b16-10m --time-budget 10m --optimizer muon
      pair muon-b32-10m --time-budget 10m --optimizer muon --batch-size 32 --warmup-iters 100 ;;
    dropout)    # the same 10 minutes; attention dropout off (the costly kind on a CPU)
      pair muon-drop0.1-10m --time-budget 10m --optimizer muon --dropout 0.1 --attn-dropout 0
      pair muon-drop0.2-10m --time-budget 10m --optimizer muon --dropout 0.2 --attn-dropout 0 ;;
    schedule)   # step-matched at the updates a 10-minute two-thread run makes
      pair muon-minlr0-2270 --max-iters 2270 --optimizer muon --min-lr 0
      pair muon-sinusoidal-2270 --max-iters 2270 --optimizer muon --pos-encoding sinusoidal ;;
    *) echo "unknown pair $what" >&2; exit 2 ;;
  esac
  wait
done
