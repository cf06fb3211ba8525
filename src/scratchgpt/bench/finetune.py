"""Fine-tuning benchmarks: SMS spam (vs TF-IDF), synthetic instructions, instruction-data.

``--suite sms``: pretrain a small GPT on the training split's messages (no labels; a BPE
tokenizer learned on them), then fine-tune it three ways (all weights, the last blocks, LoRA)
on the UCI SMS Spam Collection's fixed split (seed 0, 70/10/20, stratified: the one
``finetune --task classify`` uses), and score each on the test split beside a TF-IDF +
logistic-regression baseline (scikit-learn defaults) on the same split: accuracy, spam F1,
trainable parameters, optimizer state, time per step. Everything in about 10 minutes on a
2-core CPU.

``--suite synthetic``: pretrain a small character-level GPT on the offline corpus, then
instruction-tune it on generated instructions with exactly checkable answers (reverse a word,
add two numbers, write a date in words; ``finetune/synthetic.py``): held-out exact match of
greedy replies before and after.

``--suite instruction-data``: instruction-tune a base (``--base``, e.g. a GPT-2 directory, or
the synthetic suite's pretrained model) on the 1,100 records of ``instruction-data``: held-out
response loss before and after, and three sample replies.

Named datasets are read from ``$SCRATCHGPT_DATA_DIR`` (``sms-spam.tsv`` or
``SMSSpamCollection``, ``instruction-data.json``) or downloaded.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scratchgpt.bench import JsonOutput, add_json_argument, bench_threads
from scratchgpt.commands.argtypes import (
    positive_int,
    results_dir,
)
from scratchgpt.commands.options import given
from scratchgpt.errors import ConfigError, DataError
from scratchgpt.validation import check_range, flag_of
from scratchgpt.wording import plural

if TYPE_CHECKING:
    from scratchgpt.finetune.base import Base

SUITES = ("sms", "synthetic", "instruction-data")
PRETRAIN_LAYERS = 4  # the pretrained GPT's depth: --last-k trains at most that many blocks
PRETRAIN_WIDTH = 128  # and its width: a LoRA rank above it adds no update it can make
# What each suite writes in --out (the character-level base only when there is no --base).
SMS_TEXT, SMS_BASE, SMS_RUNS = "sms-text", "sms-base", ("sms-full", "sms-last", "sms-lora")
CHAR_BASE, SYNTHETIC_DATA = "stdlib-base", "synthetic.json"
SYNTHETIC_RUN, INSTRUCTION_RUN = "synthetic-sft", "instruction-data-sft"
# The flags only some suites read (None: not given), refused with the others rather than
# ignored; their defaults are filled in once the flags are checked.
SUITE_FLAGS = {"records": ("synthetic",), "lora_rank": ("sms",), "last_k": ("sms",),
               "base": ("synthetic", "instruction-data")}
SUITE_DEFAULTS = {"pretrain_budget": "4m", "records": 24_000, "lora_rank": 4, "last_k": 1}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", choices=SUITES, default="sms", help="which benchmark (sms)")
    p.add_argument("--out", default="runs/bench-finetune",
                   help="folder the runs go in (default runs/bench-finetune)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier run of the suite in --out (and --json FILE)")
    p.add_argument("--pretrain-budget", default=None,
                   help="wall-clock budget of pretraining (default 4m; not with --base, which "
                        "is not pretrained)")
    p.add_argument("--finetune-budget", default="90s",
                   help="wall-clock budget of each fine-tuning run (default 90s)")
    p.add_argument("--epochs", type=float, default=4.0,
                   help="passes over the fine-tuning data, if the budget allows (default 4)")
    p.add_argument("--records", type=int, default=None,
                   help="synthetic suite: generated records, 300 of them held out (24000)")
    p.add_argument("--lora-rank", type=positive_int, default=None,
                   help=f"sms suite: LoRA rank (default 4; at most {PRETRAIN_WIDTH})")
    p.add_argument("--last-k", type=positive_int, default=None,
                   help=f"sms suite: blocks trained by last-k (1; at most {PRETRAIN_LAYERS})")
    p.add_argument("--base", default=None,
                   help="synthetic and instruction-data suites: the base to tune (default: "
                        "pretrain one here)")
    p.add_argument("--threads", type=bench_threads, default=1,
                   help="torch CPU threads (default 1: on a shared 2-core machine two OpenMP "
                        "threads wait on each other; 0 = torch's default)")
    add_json_argument(p, overwrite=False)


def run(args: argparse.Namespace) -> int:
    out, json_out = check_flags(args)
    with json_out.printing():
        return _run(args, out, json_out)


def _run(args: argparse.Namespace, out: Path, json_out: JsonOutput) -> int:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    out.mkdir(parents=True, exist_ok=True)
    print(f"== machine: {platform.processor() or platform.machine()}, "
          f"{plural(torch.get_num_threads(), 'torch thread')}; {_load()}")
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []  # the sms suite's, each as it is measured
    suite = {"sms": functools.partial(sms_suite, rows=rows), "synthetic": synthetic_suite,
             "instruction-data": instruction_data_suite}[args.suite]
    with json_out.kept_on_interrupt(lambda: {"suite": "sms", "rows": rows} if rows else None):
        figures = suite(args, out)
    figures["total_s"] = round(time.perf_counter() - t0, 1)
    print(f"== total wall time {figures['total_s']:.0f} s; {_load()}")
    json_out.emit(figures)
    return 0


def check_flags(args: argparse.Namespace) -> tuple[Path, JsonOutput]:
    """(--out, where --json goes), every flag checked before any work or any file is written: a
    nonsense value, a flag the suite would ignore, a --base that is no GPT, or an earlier run
    of the suite in --out without --overwrite, is one line, not a failure minutes into the
    benchmark (or a run that silently differs from what was asked). Fills in the defaults of
    the flags some suites read, and keeps the --base it loaded as ``args.loaded_base``."""
    from scratchgpt.training.config import parse_duration

    _check_suite_flags(args)
    for dest, value in SUITE_DEFAULTS.items():
        if getattr(args, dest) is None:
            setattr(args, dest, value)
    for flag, budget in (("--pretrain-budget", args.pretrain_budget),
                         ("--finetune-budget", args.finetune_budget)):
        try:
            parse_duration(budget)
        except ConfigError as e:
            raise ConfigError(f"{flag}: {e}") from None
    # (inf and nan were "must be > 0, got inf": refused as every setting refuses them)
    check_range("--epochs", args.epochs, 0, low_open=True)
    if args.last_k > PRETRAIN_LAYERS:
        raise ConfigError(f"--last-k must be at most {PRETRAIN_LAYERS} (the pretrained "
                          f"model's layers), got {args.last_k}")
    if args.lora_rank > PRETRAIN_WIDTH:  # (refused by the LoRA run, after the other two)
        raise ConfigError(f"--lora-rank must be at most {PRETRAIN_WIDTH} (the width of the "
                          f"pretrained model's layers), got {args.lora_rank}")
    if not 600 <= args.records <= 30_000:
        raise ConfigError(f"--records must be in [600, 30000], got {args.records}")
    base = () if args.base else (CHAR_BASE,)
    writes = {"sms": (SMS_TEXT, SMS_BASE, *SMS_RUNS),
              "synthetic": (*base, SYNTHETIC_DATA, SYNTHETIC_RUN),
              "instruction-data": (*base, INSTRUCTION_RUN)}[args.suite]
    out = results_dir(args.out, writes, args.overwrite)
    json_out = JsonOutput(args)
    args.loaded_base = None
    if args.base is not None:
        run_dir = SYNTHETIC_RUN if args.suite == "synthetic" else INSTRUCTION_RUN
        args.loaded_base = _check_base(args.base, out / run_dir)
    return out, json_out


def _check_suite_flags(args: argparse.Namespace) -> None:
    """A flag given that the chosen suite does not read is refused, not ignored."""
    given_flags = given(args, set(SUITE_FLAGS))
    for dest, suites in SUITE_FLAGS.items():
        if dest in given_flags and args.suite not in suites:
            only = " only" if len(suites) == 1 else ""
            raise ConfigError(f"{flag_of(dest)} applies to --suite "
                              f"{' and '.join(suites)}{only}; --suite {args.suite} does not "
                              "read it")
    if args.base is not None and args.pretrain_budget is not None:
        raise ConfigError("--pretrain-budget applies only without --base: a given base is "
                          "tuned as it is, not pretrained")


def _check_base(source: str, run_dir: Path) -> Base:
    """--base, loaded: a GPT the suite's run would not replace, whose tokenizer can write the
    chat template both suites tune it on (loaded here, so that a wrong one is refused before
    the synthetic data or a run directory is written; the fine-tuning then uses it as it
    is)."""
    from scratchgpt.chat import DEFAULT_TEMPLATE, TEMPLATES
    from scratchgpt.finetune.base import check_out_is_not_the_base, load_base
    from scratchgpt.finetune.instruct import check_template_spelling

    check_out_is_not_the_base(run_dir, source, "--base")
    base = load_base(source, "--base")
    try:
        check_template_spelling(base.tokenizer, TEMPLATES[DEFAULT_TEMPLATE])
    except DataError as e:
        raise ConfigError(f"--base {source}: {e}") from None
    return base


def _load() -> str:
    try:
        return "load average " + " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "load average unknown"


# ---- shared steps


def pretrain(data_dir: Path, out: Path, budget: str, threads: int) -> float:
    """A 4-layer, 128-wide GPT trained on ``data_dir`` for ``budget``; returns its val loss."""
    from scratchgpt.data.dataset import TokenDataset
    from scratchgpt.models import model_config
    from scratchgpt.training.config import TrainConfig
    from scratchgpt.training.job import train

    data = TokenDataset(data_dir)
    cfg = TrainConfig(batch_size=16, max_iters=10**9, time_budget=budget, optimizer="muon",
                      learning_rate=6e-3, min_lr=0.0, warmup_iters=100, eval_interval=10**9,
                      eval_iters=20, threads=threads, dtype="fp32")
    gpt = model_config("gpt", vocab_size=data.vocab_size, n_layer=PRETRAIN_LAYERS, n_head=4,
                       n_embd=PRETRAIN_WIDTH,
                       block_size=128, activation="gelu", dropout=0.0)
    result = train(cfg, gpt, data, out, overwrite=True, progress=False)
    result.raise_if_stopped()  # Ctrl-C or SIGTERM ends the bench, not this phase alone
    print(f"pretrained {out}: {result.step} steps in {result.elapsed_s:.0f} s, val loss "
          f"{result.val_loss:.4f}")
    return result.val_loss


def finetune(args: argparse.Namespace, **request: Any) -> Any:
    """One ``scratchgpt finetune`` run (through the library); returns its TrainResult and
    job."""
    from scratchgpt.finetune.plan import FinetuneRequest, plan, starting_figures
    from scratchgpt.training import job

    flags = {"time_budget": args.finetune_budget, "threads": args.threads, "dtype": "fp32",
             **request.pop("train_flags", {})}
    req = FinetuneRequest(overwrite=True, epochs=args.epochs, train_flags=flags, **request)
    train_job = plan(req, log=print)
    before = starting_figures(train_job)
    result = job.run(train_job, progress=False)
    result.raise_if_stopped()
    if "val_loss" in before:
        print(f"held-out response loss: {before['val_loss']:.4f} before, {result.val_loss:.4f} "
              "after")
    result.metrics.update({f"before_{k}": v for k, v in before.items()})
    return result, train_job


# ---- SMS spam


def sms_suite(args: argparse.Namespace, out: Path,
              rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The three ways of fine-tuning a classifier beside a TF-IDF baseline, each row put in
    ``rows`` as it is measured (what a Ctrl-C leaves)."""
    from scratchgpt.data.prepare import prepare_text
    from scratchgpt.finetune.data import read_labelled, stratified_split
    from scratchgpt.models.lora import LoRAConfig

    pairs, where, _ = read_labelled(None, "sms-spam")
    train_idx, _, test_idx = stratified_split([label for _, label in pairs], (0.7, 0.1, 0.2), 0)
    t0 = time.perf_counter()
    corpus = "\n".join(pairs[i][0] for i in train_idx)  # the training split's texts, no labels
    prepare_text(corpus, out / SMS_TEXT, "bpe", vocab_size=2048, source="sms-spam train",
                 overwrite=True)  # check_flags refused an earlier run without --overwrite
    pretrain(out / SMS_TEXT, out / SMS_BASE, args.pretrain_budget, args.threads)
    rows = [] if rows is None else rows
    rows.append(tfidf_baseline(pairs, train_idx, test_idx))
    modes = [("full fine-tuning", dict(policy="all")),
             (f"last {args.last_k} block(s)", dict(policy="last-k", last_k=args.last_k)),
             (f"LoRA r={args.lora_rank}", dict(lora=LoRAConfig(rank=args.lora_rank,
                                                                alpha=2.0 * args.lora_rank)))]
    for (name, mode), run_dir in zip(modes, SMS_RUNS, strict=True):
        result, train_job = finetune(args, task="classify", init_from=str(out / SMS_BASE),
                                     dataset="sms-spam", out=str(out / run_dir), **mode)
        rows.append(_classifier_row(name, result, train_job))
    total = time.perf_counter() - t0
    print_table(rows, where, total)
    return {"suite": "sms", "rows": rows, "pipeline_s": round(total, 1)}


def tfidf_baseline(pairs: list[tuple[str, str]], train_idx: list[int],
                   test_idx: list[int]) -> dict[str, Any]:
    """TF-IDF + logistic regression, scikit-learn's defaults, on the same split."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score, f1_score

    t0 = time.perf_counter()
    vec = TfidfVectorizer()
    x_train = vec.fit_transform([pairs[i][0] for i in train_idx])
    clf = LogisticRegression(max_iter=1000).fit(x_train, [pairs[i][1] for i in train_idx])
    pred = clf.predict(vec.transform([pairs[i][0] for i in test_idx]))
    true = [pairs[i][1] for i in test_idx]
    return {"method": "TF-IDF + logistic regression", "accuracy": accuracy_score(true, pred),
            "spam_f1": f1_score(true, pred, pos_label="spam"),
            "trainable": len(vec.vocabulary_) + 1, "optimizer_mib": None,
            "ms_per_step": None, "seconds": round(time.perf_counter() - t0, 1)}


def _classifier_row(name: str, result: Any, train_job: Any) -> dict[str, Any]:
    from scratchgpt.models import build_model
    from scratchgpt.models.lora import count_parameters

    report = json.loads((train_job.out / "test_metrics.json").read_text())
    trainable, total = count_parameters(build_model(train_job.model))
    return {"method": name, "accuracy": report["accuracy"],
            "spam_f1": report["per_class"]["spam"]["f1"], "trainable": trainable,
            "total": total, "optimizer_mib": round(8 * trainable / 2**20, 2),
            "ms_per_step": round(1000 * result.elapsed_s / max(result.step, 1), 1),
            "steps": result.step, "seconds": round(result.elapsed_s, 1)}


def print_table(rows: list[dict[str, Any]], where: str, total: float) -> None:
    print(f"\nSMS spam ({where}), test split (seed 0, 20%): pipeline {total:.0f} s")
    print(f"| {'method':<28} | accuracy | spam F1 | {'trainable parameters':>22} | "
          "optimizer state | ms/step |")
    print(f"|{'-' * 30}|---------:|--------:|{'-' * 23}:|----------------:|--------:|")
    for r in rows:
        share = f" ({r['trainable'] / r['total']:.1%})" if r.get("total") else " (features)"
        opt = f"{r['optimizer_mib']:.2f} MiB" if r["optimizer_mib"] is not None else "-"
        step = f"{r['ms_per_step']:.1f}" if r["ms_per_step"] is not None else "-"
        params = f"{r['trainable']:,}{share}"
        print(f"| {r['method']:<28} | {r['accuracy']:8.2%} | {r['spam_f1']:7.4f} | "
              f"{params:>22} | {opt:>15} | {step:>7} |")


# ---- instructions


def _char_base(args: argparse.Namespace, out: Path) -> Path:
    """A character-level GPT pretrained on the offline corpus (python-stdlib)."""
    from scratchgpt.data.resolve import resolve_dataset

    data, _ = resolve_dataset("python-stdlib")
    pretrain(data.directory, out / CHAR_BASE, args.pretrain_budget, args.threads)
    return out / CHAR_BASE


def _base(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """The base a suite tunes, as fine-tuning's request names it: --base, which check_flags
    loaded, or a character-level GPT pretrained here."""
    if args.loaded_base is not None:
        return {"init_from": args.loaded_base.source, "base": args.loaded_base}
    return {"init_from": str(_char_base(args, out))}


def synthetic_suite(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from scratchgpt.finetune.synthetic import synthetic_records

    base = _base(args, out)
    (out / SYNTHETIC_DATA).write_text(json.dumps(synthetic_records(args.records, seed=0)))
    result, train_job = finetune(args, task="instruct", **base,
                                 data=str(out / SYNTHETIC_DATA),
                                 out=str(out / SYNTHETIC_RUN), held_out=300 / args.records,
                                 eval_generate=300,
                                 train_flags={"learning_rate": 1e-3, "batch_size": 32})
    print(result.report)
    by_kind = exact_match_by_kind(train_job.task().final_eval)  # the task this run used
    print("exact match by kind: " + ", ".join(f"{k} {v:.2%}" for k, v in by_kind.items()))
    return {"suite": "synthetic", "steps": result.step, **result.metrics,
            "exact_match_by_kind": by_kind}


def exact_match_by_kind(ev: Any) -> dict[str, float]:
    """The held-out exact match of each kind of synthetic instruction."""
    from scratchgpt.finetune.synthetic import kind_of

    hits: dict[str, list[bool]] = {}
    for prompt, hit in zip(ev.prompts, ev.hits, strict=True):
        hits.setdefault(kind_of(prompt), []).append(hit)
    return {kind: sum(h) / len(h) for kind, h in sorted(hits.items())}


def instruction_data_suite(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    result, _ = finetune(args, task="instruct", **_base(args, out),
                         dataset="instruction-data", out=str(out / INSTRUCTION_RUN),
                         eval_generate=3)
    print(result.report)
    return {"suite": "instruction-data", "steps": result.step, **result.metrics}
