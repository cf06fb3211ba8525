"""Dates -> ISO (or --task reverse) with the Transformer, attention LSTM and plain LSTM in a budget.

Each model trains from scratch on the generated dates task for the same wall-clock budget, then is
scored on the fixed held-out dates (never seen in training): exact match of the greedy decode,
overall and by source length. Every held-out pair is decoded, as the documented figures were
(``seq2seq train`` decodes the first 256 unless --eval-pairs). Memory is checked for every
model before the first trains. Targets (docs/bench_seq2seq.md): Transformer >= 98%, attention
LSTM >= 95%, each within 10 minutes on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import platform
import time

from scratchgpt.bench import JsonOutput, add_json_argument, bench_threads, refuse_repeats
from scratchgpt.commands.argtypes import duration, positive_int, seed_int
from scratchgpt.data.translation import TASKS
from scratchgpt.wording import plural

ARCH_ORDER = ("transformer", "lstm-attention", "lstm")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--budget", type=duration, default="10m",
                   help="training time per model, e.g. 10m, 90s (default: 10m)")
    p.add_argument("--archs", nargs="+", choices=ARCH_ORDER, default=list(ARCH_ORDER),
                   help="which models to run (default: all three)")
    p.add_argument("--threads", type=bench_threads, default=1,
                   help="torch CPU threads (default 1: on a shared 2-core machine 2 OpenMP "
                        "threads spin-wait and ran 6x slower in our measurements; 0 = torch's "
                        "default)")
    p.add_argument("--task", choices=sorted(TASKS), default="dates",
                   help="generated task (default: dates; 'reverse' has sources of 10-60 "
                        "characters, where the plain LSTM's bottleneck shows)")
    p.add_argument("--n-train", type=positive_int, default=200_000, help="training pairs (200,000)")
    p.add_argument("--n-test", type=positive_int, default=2_000,
                   help="held-out pairs, every one of them decoded for the exact match "
                        "(2000)")
    p.add_argument("--seed", type=seed_int, default=0,
                   help="seed of the generated pairs and of every model's weights (0)")
    p.add_argument("--batch-size", type=positive_int, default=64,
                   help="pairs per training step (64)")
    p.add_argument("--learning-rate", "--lr", type=float, default=2e-3,
                   help="Adam learning rate of every model (2e-3)")
    add_json_argument(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    refuse_repeats("--archs", args.archs)
    out = JsonOutput(args)
    with out.printing():
        return _run(args, out)


def _run(args: argparse.Namespace, out: JsonOutput) -> int:
    import torch

    from scratchgpt.data.translation import DataSpec
    from scratchgpt.training import seq2seq

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    cfg = seq2seq.train_config({"batch_size": args.batch_size, "seed": args.seed,
                                "learning_rate": args.learning_rate,
                                "time_budget": args.budget, "threads": args.threads})
    data = DataSpec(task=args.task, n_train=args.n_train, n_test=args.n_test, seed=args.seed)
    seq2seq.check_pairs_fit(data)  # before a generator makes pairs for ever
    task = seq2seq.Seq2SeqTask.from_spec(data)  # (made once: each model trains on a fresh copy)
    check_memory(task, args.archs, cfg)
    machine = " ".join(filter(None, (platform.machine(), platform.processor())))
    print(f"machine: {machine}, "
          f"{plural(torch.get_num_threads(), 'torch thread')}, torch {torch.__version__}; "
          f"task {args.task}; budget {cfg.time_budget_s:.0f}s per model")
    rows: list[dict] = []

    def figures() -> dict:
        return {"budget_s": cfg.time_budget_s, "threads": torch.get_num_threads(),
                "results": rows}

    with out.kept_on_interrupt(lambda: figures() if rows else None):
        for arch in args.archs:  # a model cut short has no row: its figures are not its own
            rows.append(_run_arch(arch, task.fresh(), cfg, not args.no_progress))
    print("\narch             params   steps  train s   exact match")
    for r in rows:
        print(f"{r['arch']:<15} {r['params']:>7,} {r['steps']:>7} {r['train_seconds']:>8.0f}"
              f"   {r['exact_match']:.2%}")
    out.emit(figures())
    return 0


def check_memory(task, archs: list[str], cfg) -> None:
    """Every model's training and final evaluation fit in memory, counted as ``seq2seq
    train`` counts them (the longest pair, the batch, attention included): checked before the
    first model trains, as a long --task reverse or a huge --batch-size was stopped only by
    the allocator, in a traceback, after the models before it had trained."""
    from scratchgpt.training import seq2seq

    for arch in archs:
        seq2seq.check_memory(task, task.model_config(arch), cfg)


def _run_arch(arch: str, task, cfg, progress: bool) -> dict:
    """Train one architecture from scratch on ``task``, a fresh one (no run directory), and
    score it."""
    from scratchgpt.training.seq2seq import format_eval
    from scratchgpt.training.trainer import Trainer

    t0 = time.perf_counter()
    trainer = Trainer(cfg, task.model_config(arch), task, progress=progress)
    res = trainer.fit()
    res.raise_if_stopped()  # Ctrl-C, SIGTERM: no figures for a model cut short
    ev = task.final_eval
    print(f"== {arch}: {format_eval(ev)}", flush=True)
    return {"arch": arch, "params": trainer.model.num_params(), "steps": res.step,
            "train_seconds": round(res.elapsed_s, 1), "target_tokens_seen": trainer.state.tokens,
            "final_train_loss": res.train_loss,
            "held_out_loss": res.val_loss, "exact_match": ev.exact_match, "held_out": ev.total,
            "by_length": {k.strip(): c / n for k, (c, n) in ev.by_length.items()},
            # the pairs of each bucket, printed beside its exact match ("(3/8)")
            "by_length_pairs": {k.strip(): n for k, (_, n) in ev.by_length.items()},
            "wall_seconds": round(time.perf_counter() - t0, 1)}
