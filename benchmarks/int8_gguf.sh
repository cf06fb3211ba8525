#!/usr/bin/env bash
# int8 weight-only decode and llama.cpp: quality cost and speed, on an otherwise idle machine.
# Usage: benchmarks/int8_gguf.sh [BUDGET]   (training budget of the BPE model, default 20m)
# Needs the gguf extra (pip install -e '.[gguf]'). Prints every figure; writes runs/bench-*.
set -euo pipefail
cd "$(dirname "$0")/.."
. benchmarks/lib.sh
help_if_asked benchmarks/int8_gguf.sh "$@"
need_scratchgpt
export SCRATCHGPT_DATA_DIR="${SCRATCHGPT_DATA_DIR:-$(cd .. && pwd)/shared/corpora}"
budget="${1:-20m}"
echo "== machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(date -Is)"

echo "== 1. quality cost: cpu-medium on Tiny Shakespeare (char), val loss fp32 / bf16 / int8"
[ -f runs/bench-cpu-medium/best.pt ] || scratchgpt train --dataset shakespeare \
  --preset cpu-medium --time-budget 10m --out runs/bench-cpu-medium --overwrite --no-progress
for dtype in fp32 bf16 int8; do
  scratchgpt eval --checkpoint runs/bench-cpu-medium --dtype "$dtype" --json
done

echo "== 2. quality cost: GPT-2-shaped model (12L/12H/768d) with GPT-2's BPE on Tiny Shakespeare"
[ -f data/shakespeare-gpt2/meta.json ] || scratchgpt prepare --dataset shakespeare \
  --tokenizer gpt2 --out data/shakespeare-gpt2
[ -f runs/bench-gpt2-bpe/best.pt ] || scratchgpt train --dataset data/shakespeare-gpt2 \
  --n-layer 12 --n-head 12 --n-embd 768 --block-size 256 --batch-size 8 --dropout 0 \
  --activation gelu_tanh --optimizer muon --learning-rate 2e-3 --eval-interval 200 \
  --eval-iters 10 --time-budget "$budget" --out runs/bench-gpt2-bpe --overwrite --no-progress
for dtype in fp32 bf16 int8; do
  scratchgpt eval --checkpoint runs/bench-gpt2-bpe --dtype "$dtype" --json
done
echo "-- the same model as GGUF files for llama.cpp"
for t in f32 f16 q8_0; do
  scratchgpt convert --to gguf --type "$t" --checkpoint runs/bench-gpt2-bpe \
    --out "runs/bench-gpt2-bpe/model-$t.gguf" --overwrite
done

echo "== 3. decode speed: GPT-2 124M shape, ours (fp32, bf16, int8) vs llama.cpp (f32, f16, q8_0)"
scratchgpt bench generate --threads 2 --repeats 3 --llama-cpp
