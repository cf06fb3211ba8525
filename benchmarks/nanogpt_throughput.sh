#!/usr/bin/env bash
# Training throughput against nanoGPT at its CPU recipe's shape (4 layers, 4 heads, 128 dims,
# context 64, batch 12, no dropout, no biases, exact GELU, AdamW), measured as whole processes:
# the same iterations, both evaluating every 250 with 20 batches per split (nanoGPT's README
# recipe), run alternately (benchmarks/alternate.py). Then the steps alone, side by side in one
# invocation (scratchgpt bench train). Run on an otherwise idle machine.
#   benchmarks/nanogpt_throughput.sh NANOGPT_DIR [ROUNDS=5] [ITERS=600] [STEPS=200]
# (~12 min with the defaults on a 2-core CPU). Writes runs/throughput/table.md for
# docs/BENCHMARKS.md. PYTHON: the interpreter with scratchgpt installed (default python3).
# NANOGPT_DIR: a karpathy/nanoGPT checkout. Its data/shakespeare_char is prepared here if
# needed, offline: its prepare.py downloads input.txt only when the file is missing, so Tiny
# Shakespeare is copied there from $SCRATCHGPT_DATA_DIR (default ../shared/corpora) first.
set -euo pipefail
cd "$(dirname "$0")/.."
. benchmarks/lib.sh
help_if_asked benchmarks/nanogpt_throughput.sh "$@"
# Python as it is by default: each module compiled once, its bytecode cached and reused. A
# shell with PYTHONDONTWRITEBYTECODE set would compile every module again at every start
# (~0.1 s of ours, a few ms of nanoGPT's), which a user's Python does not.
unset PYTHONDONTWRITEBYTECODE
export SCRATCHGPT_DATA_DIR="${SCRATCHGPT_DATA_DIR:-$(cd .. && pwd)/shared/corpora}"
[ -n "${1:-}" ] || fail "usage: benchmarks/nanogpt_throughput.sh NANOGPT_DIR [ROUNDS] [ITERS] [STEPS] (--help says more)"
need_nanogpt "$1"
nano="$(cd "$1" && pwd)"
rounds="${2:-5}"
iters="${3:-600}"
steps="${4:-200}"
py="${PYTHON:-python3}"
# nanoGPT's command runs in its own directory: a relative interpreter path (.venv/bin/python)
# must be made absolute first (not resolved through links, so a venv's python stays a venv's)
case "$py" in */*) py="$(cd "$(dirname "$py")" && pwd)/$(basename "$py")" ;; esac
need_python_scratchgpt "$py"
[ -f "$nano/data/shakespeare_char/train.bin" ] || need_corpus tinyshakespeare.txt
md=runs/throughput/table.md
mkdir -p runs/throughput
echo "== machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(uptime), $(date -Is)"
echo "== python $("$py" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, torch.backends.cpu.get_cpu_capability())')"

data="$nano/data/shakespeare_char"
if [ ! -f "$data/train.bin" ]; then
  cp "$SCRATCHGPT_DATA_DIR/tinyshakespeare.txt" "$data/input.txt"
  (cd "$data" && "$py" prepare.py)
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# Our named dataset is prepared into the cache on first use: do it once before timing, as
# nanoGPT's prepare.py was run once above (this run also caches our modules' bytecode).
"$py" -m scratchgpt train --dataset shakespeare --max-iters 1 --n-layer 1 --n-embd 16 --n-head 1 \
  --out "$tmp/warm" --no-progress > /dev/null

shape_nano="--block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --dropout=0.0"
# nanoGPT's train.py sets bias = False: the same model on our side is --no-bias (GPT-2's biases,
# our default, cost a copy of each bias into every product's output on a CPU).
shape_ours="--n-layer 4 --n-head 4 --n-embd 128 --block-size 64 --batch-size 12 --dropout 0 --no-bias"
nano_cmd="$py train.py config/train_shakespeare_char.py --device=cpu --compile=False \
--eval_iters=20 --log_interval=1 $shape_nano --max_iters=$iters --lr_decay_iters=$iters \
--out_dir=$tmp/nanogpt"
ours_cmd="$py -m scratchgpt train --dataset shakespeare $shape_ours --activation gelu \
--max-iters $iters --lr-decay-iters $iters --eval-interval 250 --eval-iters 20 \
--out $tmp/ours --overwrite --no-progress"

{
  echo "Machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'); load before: $(cut -d' ' -f1-3 /proc/loadavg); $(date -u '+%Y-%m-%d %H:%M UTC')."
  echo
  echo "Whole processes, $iters iterations each, $rounds alternating rounds (\`benchmarks/nanogpt_throughput.sh NANOGPT_DIR $rounds $iters $steps\`):"
  echo
} > "$md"
echo "== 1. whole processes, $iters iterations, $rounds alternating rounds"
"$py" benchmarks/alternate.py --rounds "$rounds" --json "$tmp/alternate.json" --markdown "$md" \
  --name nanoGPT --cwd "$nano" --cmd "$nano_cmd" \
  --name scratchgpt --cwd . --cmd "$ours_cmd"

echo "== 2. where our process spends its time (one more run, phases from its own clock)"
"$py" -X importtime -c "import scratchgpt.cli, scratchgpt.training.job" 2> "$tmp/imports.txt"
imports="$(awk -F'|' '$3 ~ /^ *torch$/ {t = $2} $3 ~ /scratchgpt.training.job$/ {j = $2}
  END {printf "torch %.2f s, the training modules with torch %.2f s", t / 1e6, j / 1e6}' \
  "$tmp/imports.txt")"
echo "imports: $imports"
/usr/bin/time -o "$tmp/time.txt" -f "%e s wall, %U s user" $ours_cmd | tail -2 | tee "$tmp/ours.txt"
{
  echo
  echo "One more scratchgpt run: $(cat "$tmp/time.txt") in all; imports: $imports;"
  echo "its own report: $(grep '^done:' "$tmp/ours.txt")"
} >> "$md"

echo "== 3. the training step alone (median ms/step), side by side"
"$py" -m scratchgpt bench train --steps "$steps" --variants fp32 --nanogpt "$nano" \
  --nanogpt-iters $((steps * 3 / 2)) | tee "$tmp/steps.txt"
{
  echo
  echo "The training step alone (\`scratchgpt bench train --steps $steps --variants fp32 --nanogpt NANOGPT_DIR\`):"
  echo
  echo '```'
  cat "$tmp/steps.txt"
  echo '```'
} >> "$md"
echo "== table for docs/BENCHMARKS.md: $md"
cat "$md"
