"""The training speedrun's ablation table: each option alone against a baseline preset, then
the speedrun preset of the budget (the stack), at wall-clock budgets, on several texts. Run
through benchmarks/speedrun.sh.

Every run is ``scratchgpt train --time-budget B`` (or ``--max-iters N`` for a step-matched
pilot) as a user would run it, one after another; quality is the exact full-split validation
loss in nats per token and in bits per character (comparable across tokenizers), speed the
trainer's tokens/s. Results are appended to ``runs/speedrun/results.jsonl``, the tables
written to ``runs/speedrun/table.md`` and a picture of each table's runs (loss against seconds)
to ``runs/speedrun/<text>-<budget>.png``. ``--base`` puts another preset under the ablations and
recipes, and ``--flags`` adds flags to every run: ``--base shakespeare-gpu --flags '--device
cuda'`` is nanoGPT's Shakespeare model on a GPU.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "runs" / "speedrun"

# The base preset of each budget: what a user runs today for that much time.
BASE = {"90s": "cpu-small", "10m": "cpu-medium"}
# Sequence-length warmup and batch-size ramp lengths (updates) per budget: about a quarter of
# the updates such a run makes on a 2-core CPU.
RAMP = {"90s": "500", "10m": "600"}

# Each change alone, as flags on top of the base preset ("{ramp}": the budget's RAMP).
ABLATIONS: dict[str, list[str]] = {
    "baseline": [],
    "two-layers": ["--n-layer", "2"],  # depth for updates: the cheapest change at 90 s
    "wsd": ["--schedule", "wsd"],
    "seq-len-warmup": ["--seq-len-warmup", "{ramp}"],
    "batch-size-ramp": ["--batch-size-ramp", "{ramp}"],
    "rope": ["--pos-encoding", "rope"],
    "qk-norm": ["--qk-norm"],
    "relu2": ["--activation", "relu2"],
    "zero-init-proj": ["--zero-init-proj"],
    "value-embeds": ["--value-embeds", "1"],
    "unet-skips": ["--unet-skips"],
    "logit-softcap": ["--logit-softcap", "30"],
    "untied-head": ["--no-tie-weights"],
    # not a model option: the speedrun reads its data once through, nanoGPT draws windows at
    # random; every window once per epoch is the speedrun's order on a small text
    "epoch-windows": ["--windows", "epoch"],
}
# Every model option and the wsd schedule: the speedrun's options that are not ramps.
MODEL_OPTIONS = ["--pos-encoding", "rope", "--qk-norm", "--activation", "relu2",
                 "--zero-init-proj", "--value-embeds", "1", "--unet-skips",
                 "--logit-softcap", "30", "--no-tie-weights", "--schedule", "wsd"]
# Recipes of more than one change, run only when named in --variants.
RECIPES: dict[str, list[str]] = {
    # with --tokenizer bpe:768, the lowest 90 s loss measured on Tiny Shakespeare
    "two-layers-rope": ["--n-layer", "2", "--pos-encoding", "rope"],
    # with --base cpu-speedrun --tokenizer bpe:768, the 10-minute recipe for a slow CPU
    "four-layers": ["--n-layer", "4"],
    # with --base cpu-speedrun --tokenizer bpe:768, the 10-minute recipe for a CPU with bf16
    # products (about three times the updates): a larger model, pulled harder to zero (0.6
    # until attention in C gave it more updates, which fit the text more closely)
    "six-by-192": ["--n-layer", "6", "--n-embd", "192", "--n-head", "6", "--weight-decay", "0.8"],
    # every option at once on the base preset's shape: cpu-medium-speedrun at 10 minutes (and
    # what the cpu-speedrun preset was at 90 s until it became the 90 s winner)
    "all-options": [*MODEL_OPTIONS, "--seq-len-warmup", "{ramp}", "--batch-size-ramp", "{ramp}"],
    # without the ramps (shakespeare-gpu on a GPU)
    "model-options": MODEL_OPTIONS,
    # nanoGPT's own schedule for its Shakespeare model: AdamW at 1e-3, a cosine to 1e-4 (what
    # shakespeare-gpu trained with before Muon; run it with --budgets 5000)
    "adamw": ["--optimizer", "adamw", "--learning-rate", "1e-3", "--min-lr", "1e-4"],
}
# The stack: the speedrun preset chosen for the budget, as it is.
STACK = "stack"
STACK_PRESET = {"cpu-small": "cpu-speedrun", "cpu-medium": "cpu-medium-speedrun"}
# nanoGPT's CPU recipe (its README: 4 layers, 4 heads, 128 dims, context 64, batch 12, no
# dropout, AdamW at 1e-3 with warmup 100 and a cosine to 1e-4, betas 0.9/0.99, weight decay
# 0.1, grad clip 1, exact GELU) in scratchgpt's trainer, under the same budget.
NANOGPT = "nanogpt-recipe"
NANOGPT_FLAGS = ["--n-layer", "4", "--n-head", "4", "--n-embd", "128", "--block-size", "64",
                 "--batch-size", "12", "--dropout", "0", "--activation", "gelu",
                 "--optimizer", "adamw", "--learning-rate", "1e-3", "--min-lr", "1e-4",
                 "--warmup-iters", "100", "--beta2", "0.99", "--weight-decay", "0.1",
                 "--grad-clip", "1", "--eval-interval", "250", "--eval-iters", "20"]

DONE = re.compile(r"done: (\d+) steps? in ([\d.]+)s \(([\d,]+) tokens/s\); train loss ([\d.]+), "
                  r"val loss ([\d.]+) \(full val split, ([\d.]+) bits/char\)")


def run_flags(variant: str, budget: str, base: str | None = None) -> list[str]:
    """The training flags of ``variant`` at ``budget`` (a duration, or ``N`` updates) on the
    ``base`` preset (default: the budget's)."""
    base = base or BASE.get(budget, "cpu-small")
    if variant == NANOGPT:
        return NANOGPT_FLAGS
    ramp = RAMP.get(budget) or str(int(budget) // 4)  # a pilot of N updates: a quarter
    if variant == STACK:
        if base not in STACK_PRESET:
            raise SystemExit(f"no speedrun preset stacks on {base}: name variants instead")
        return ["--preset", STACK_PRESET[base]]
    flags = {**ABLATIONS, **RECIPES}[variant]
    return ["--preset", base, *(f.format(ramp=ramp) for f in flags)]


def kjv_dataset(cache: Path) -> str | None:
    """The King James Bible (public domain; Debian's ``bible-kjv`` package prints it offline,
    with its chapter headings and verse numbers: ~4.3 M characters), prepared at character
    level; None when the ``bible`` program is missing."""
    target = cache / "kjv-char"
    if (target / "meta.json").is_file():
        return str(target)
    if shutil.which("bible") is None:
        print("kjv: skipped (no 'bible' program: apt-get install bible-kjv)", file=sys.stderr)
        return None
    text = subprocess.run(["bible", "-l80", "gen1:1-rev22:21"], check=True,
                          capture_output=True, text=True).stdout
    cache.mkdir(parents=True, exist_ok=True)
    source = cache / "kjv.txt"
    source.write_text(text, encoding="utf-8")
    print(f"kjv: {len(text):,} characters, sha256 "
          f"{hashlib.sha256(text.encode()).hexdigest()}", file=sys.stderr)
    scratchgpt("prepare", "--data", str(source), "--tokenizer", "char", "--out", str(target))
    return str(target)


# --tokenizer: char, bpe:N, or bpe:N:dropP[xK] (BPE-dropout P, K copies of the training split)
TOKENIZER = re.compile(r"char|bpe:(\d+)(?::drop(0?\.\d+)(?:x(\d+))?)?")


def text_name(dataset: str, tokenizer: str) -> str:
    """How runs of ``dataset`` under ``tokenizer`` are named: ``shakespeare`` at character
    level, ``shakespeare-bpe768`` under ``bpe:768``, ``shakespeare-bpe768drop0.1x16`` under
    ``bpe:768:drop0.1x16`` (also its prepared directory's name)."""
    return dataset if tokenizer == "char" else f"{dataset}-{tokenizer.replace(':', '')}"


def prepared(dataset: str, tokenizer: str) -> str | None:
    """What ``train --dataset`` is given for ``dataset`` under ``tokenizer``: ``char``, the
    text as named (character level), or ``bpe:N``, a byte-level BPE of N ids learned on the
    text's training split (with ``:dropP[xK]``, its training split written as K segmentations
    sampled by BPE-dropout P), prepared once into ``runs/speedrun/data`` before any run is timed
    (as nanoGPT's prepare.py is run before its train.py). None: kjv is unavailable."""
    source = kjv_dataset(OUT / "data") if dataset == "kjv" else dataset
    if source is None or tokenizer == "char":
        return source
    vocab, dropout, copies = TOKENIZER.fullmatch(tokenizer).groups()  # type: ignore[union-attr]
    target = OUT / "data" / text_name(dataset, tokenizer)
    if not (target / "meta.json").is_file():
        text = ["--data", str(OUT / "data" / "kjv.txt")] if dataset == "kjv" else \
            ["--dataset", dataset]
        drop = ["--bpe-dropout", dropout] if dropout else []
        drop += ["--train-copies", copies] if copies else []
        scratchgpt("prepare", *text, "--tokenizer", "bpe", "--vocab-size", vocab, *drop,
                   "--out", str(target))
    return str(target)


def scratchgpt(*args: str) -> str:
    cmd = [sys.executable, "-m", "scratchgpt", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr[-2000:]}")
    return done.stdout


def limit_flags(budget: str) -> list[str]:
    """What ends every run: the wall-clock budget (the updates unbounded), or for a pilot of
    N updates, N updates and no budget (a preset's own budget turned off)."""
    if budget.isdigit():
        return ["--max-iters", budget, "--eval-interval", budget, "--time-budget", ""]
    return ["--time-budget", budget, "--max-iters", "1000000"]


def run_dir(dataset: str, budget: str, variant: str) -> Path:
    return OUT / f"{dataset}-{budget}-{variant}"


def train_once(dataset: str, data_arg: str, budget: str, variant: str,
               args: argparse.Namespace) -> dict:
    flags = run_flags(variant, budget, args.base) + args.flags.split()
    limit = limit_flags(budget)
    out = run_dir(dataset, budget, variant)
    extra = ["--threads", str(args.threads)] if args.threads else []
    t0 = time.perf_counter()
    text = scratchgpt("train", "--dataset", data_arg, *flags, *limit, *extra, "--out", str(out),
                      "--overwrite", "--no-progress")
    wall = time.perf_counter() - t0
    m = DONE.search(text)
    if m is None:
        raise SystemExit(f"no result line from {out}:\n{text[-2000:]}")
    steps, seconds, tok_s, train, val, bpc = m.groups()
    return {"dataset": dataset, "budget": budget, "variant": variant, "flags": " ".join(flags),
            "steps": int(steps), "train_s": float(seconds),
            "tokens_per_s": int(tok_s.replace(",", "")), "train_loss": float(train),
            "val_loss": float(val), "val_bpc": float(bpc), "process_s": round(wall, 1),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def by_text_and_budget(rows: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """The rows of each (dataset, budget), in the order the runs were made."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["dataset"], r["budget"]), []).append(r)
    return groups


def table(rows: list[dict]) -> str:
    """One markdown table per (dataset, budget), in the order the runs were made."""
    out = []
    for (dataset, budget), group in by_text_and_budget(rows).items():
        base = next((r["val_bpc"] for r in group if r["variant"] == "baseline"), None)
        out += [f"\n{dataset}, {budget}:\n",
                "| run | flags | steps | tokens/s | val nats/token | val bits/char | Δ bits/char |",
                "|---|---|---:|---:|---:|---:|---:|"]
        for r in group:
            delta = f"{r['val_bpc'] - base:+.4f}" if base is not None else ""
            out.append(f"| {r['variant']} | `{r['flags']}` | {r['steps']:,} | "
                       f"{r['tokens_per_s']:,} | {r['val_loss']:.4f} | {r['val_bpc']:.4f} | "
                       f"{delta} |")
    return "\n".join(out) + "\n"


def train_bits_per_nat(run: Path) -> float | None:
    """Bits per character of the run's training split per nat per token (a BPE packs more
    characters into a token of the text it was learned on than of the val split), or None
    where the run's dataset cannot be read back."""
    from scratchgpt.data.resolve import resolve_dataset
    from scratchgpt.errors import ScratchGPTError

    try:
        dataset = json.loads((run / "config.json").read_text())["data"]["dataset"]
        return resolve_dataset(dataset, log=None)[0].bits_per_char("train", 1.0)
    except (OSError, ValueError, KeyError, TypeError, ScratchGPTError):
        return None


def figures(rows: list[dict]) -> list[Path]:
    """One picture per (dataset, budget), ``runs/speedrun/<dataset>-<budget>.png``: each run's
    training loss against its seconds (the logged batch losses, smoothed over a fifth of its
    logs, at most 10) and, as a dot at its end, the exact full-split val loss. Both in bits
    per character, each by its own split's characters per token, so that runs with different
    tokenizers share the axis."""
    from scratchgpt.training.metrics import read_rows
    from scratchgpt.viz import running_mean, save_figure, time_curves_figure

    written = []
    for (dataset, budget), group in by_text_and_budget(rows).items():
        curves, finals = {}, {}
        for r in group:
            run = run_dir(dataset, budget, r["variant"])
            to_bpc = train_bits_per_nat(run) or r["val_bpc"] / r["val_loss"]
            logged = [(float(m["elapsed_s"]), float(m["loss"]))
                      for m in read_rows(run / "metrics.csv") if m["loss"]]
            if logged:
                seconds, losses = zip(*logged, strict=True)
                window = min(10, max(1, len(losses) // 5))  # a short run's few logs stay as is
                curves[r["variant"]] = (seconds,
                                        [to_bpc * x for x in running_mean(losses, window)])
            finals[r["variant"]] = (r["train_s"], r["val_bpc"])
        fig = time_curves_figure(curves, finals, "bits/char (line: training batches, "
                                 "dot: val, full split)", f"{dataset}, {budget}")
        written.append(save_figure(fig, OUT / f"{dataset}-{budget}.png"))
    return written


def plan(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(dataset, budget, variant) of every run, ablations first."""
    runs = []
    for budget in args.budgets.split(","):
        for dataset in args.datasets.split(","):
            variants = args.variants.split(",") if args.variants else (
                [*ABLATIONS, STACK, NANOGPT] if dataset == args.ablate_on
                else ["baseline", STACK, NANOGPT])
            runs += [(dataset, budget, v) for v in variants]
    return runs


def thread_count(text: str) -> int:
    """--threads, checked before the first run (a bad one failed every run in turn)."""
    from scratchgpt.commands.argtypes import thread_count as checked

    return checked(text)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budgets", default="90s,10m",
                   help="comma list of time budgets (90s, 10m), or update counts for a "
                        "step-matched pilot (default 90s,10m)")
    p.add_argument("--datasets", default="shakespeare,python-stdlib,kjv",
                   help="comma list: named datasets, prepared directories, or kjv")
    p.add_argument("--ablate-on", default="shakespeare",
                   help="the dataset that gets every ablation; the others get baseline, the "
                        "stack and the nanoGPT recipe")
    p.add_argument("--variants", default="", help="comma list of runs instead of the plan: "
                   + ", ".join([*ABLATIONS, *RECIPES, STACK, NANOGPT]))
    p.add_argument("--threads", type=thread_count, default=None,
                   help="torch threads per run (default: train's choice)")
    p.add_argument("--base", default=None,
                   help="the preset the ablations and recipes change (default: the budget's, "
                        "cpu-small at 90 s and in pilots, cpu-medium at 10 minutes), e.g. "
                        "shakespeare-gpu")
    p.add_argument("--flags", default="",
                   help="training flags added to every run, e.g. '--device cuda --compile'")
    p.add_argument("--tokenizer", default="char",
                   help="char (default), or bpe:N: every text as a byte-level BPE of N ids "
                        "learned on its training split; bits/char stay comparable. "
                        "bpe:N:dropP[xK]: its training split as K (default 16) segmentations "
                        "sampled by BPE-dropout P (prepare --bpe-dropout)")
    args = p.parse_args()
    if not TOKENIZER.fullmatch(args.tokenizer):
        p.error(f"--tokenizer: char, bpe:N or bpe:N:dropP[xK] (e.g. bpe:768:drop0.1x16), "
                f"not {args.tokenizer!r}")
    OUT.mkdir(parents=True, exist_ok=True)
    data = {}
    rows = []
    for dataset, budget, variant in plan(args):
        if dataset not in data:
            data[dataset] = prepared(dataset, args.tokenizer)
        if data[dataset] is None:
            continue
        row = train_once(text_name(dataset, args.tokenizer), data[dataset], budget, variant,
                         args)
        print(json.dumps(row), flush=True)
        with (OUT / "results.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")
        rows.append(row)
    text = table(rows)
    (OUT / "table.md").write_text(text)
    print(text)
    for path in figures(rows):
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
