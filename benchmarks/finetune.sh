#!/usr/bin/env bash
# The fine-tuning benchmarks of docs/BENCHMARKS.md, one after another, on an otherwise idle
# machine (each figure depends on wall-clock budgets). Usage:
#   benchmarks/finetune.sh [GPT2_DIR]   # GPT2_DIR: a Hugging Face GPT-2 directory (optional)
# Reads sms-spam.tsv (or SMSSpamCollection) and instruction-data.json from
# $SCRATCHGPT_DATA_DIR (default: the corpora folder of ../shared), checked before the first
# suite starts. Writes runs under runs/bench-finetune, replacing those of an earlier run of
# this script (--overwrite).
set -euo pipefail
cd "$(dirname "$0")/.."
. benchmarks/lib.sh
help_if_asked benchmarks/finetune.sh "$@"
need_scratchgpt
export SCRATCHGPT_DATA_DIR="${SCRATCHGPT_DATA_DIR:-$(cd .. && pwd)/shared/corpora}"
# What the suites read, checked before the first starts: a missing one failed its suite only
# when it came (instruction-data's after the other two, some fifteen minutes). sms-spam is read
# under either name.
[ -f "$SCRATCHGPT_DATA_DIR/SMSSpamCollection" ] || need_corpus sms-spam.tsv
need_corpus instruction-data.json
gpt2="${1:-}"
case "$gpt2" in
  ""|hf:*) ;;
  *) [ -e "$gpt2" ] || fail "GPT2_DIR $gpt2 does not exist: give a Hugging Face GPT-2" \
       "directory, or none (suite 3 then tunes the synthetic suite's base)" ;;
esac
echo "== machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(date -Is)"

echo "== 1. SMS spam: pretrain (4 min) + full / last-block / LoRA fine-tuning (90 s each)"
echo "==    vs TF-IDF + logistic regression, same test split"
scratchgpt bench finetune --suite sms --overwrite --json runs/bench-finetune/sms.json

echo "== 2. synthetic instructions: exact match before and after SFT of a small char model"
scratchgpt bench finetune --suite synthetic --finetune-budget 5m --overwrite \
  --json runs/bench-finetune/synthetic.json

echo "== 3. instruction-data: held-out response loss before and after, three replies"
scratchgpt bench finetune --suite instruction-data --finetune-budget 5m --overwrite \
  --base "${gpt2:-runs/bench-finetune/stdlib-base}" \
  --json runs/bench-finetune/instruction-data.json
