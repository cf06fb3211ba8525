"""Training throughput (tokens/s) and achieved FLOP/s against this machine's matmul peak.

Default shape = the nanoGPT CPU recipe: 4 layers, 4 heads, 128 dims, context 64, batch 12,
character vocabulary of Tiny Shakespeare (65), no biases (its ``train.py`` sets ``bias = False``;
``--bias`` adds GPT-2's). Each variant (precision, compile, optimizer, fused blocks or
modules) runs the same full training step as ``scratchgpt train``: batch sampling, forward,
loss, backward, clipping, fused AdamW. The variants take turns, ``--steps / --rounds`` steps
at a time, so that a machine slowing down for a while slows them all alike; each is timed by
the median of its steps. Pass ``--nanogpt DIR`` (a checkout of karpathy/nanoGPT with its
shakespeare_char data prepared) to run its train.py beside ours in the same invocation, at
the same shape, biases and dropout, and print the ratio.
``--breakdown`` then shows where each variant's step spends its time, by kind of operator.

A ``-1thread`` variant runs the same step on one thread. Beside its variant on all of them it
gives the step's serial part (Amdahl's law): with N threads a step takes T_N = S + P / N, on
one T_1 = S + P, so S = (N T_N - T_1) / (N - 1), the time the step runs on one core while the
others wait (Python, dispatch, operators too small to split, each call's own set-up). With
``--breakdown`` the same is worked out for each kind of operator.

>>> serial_part(t_n=20.0, t_1=32.0, n=2)  # ms: 8 on one core, 24 split over the two
8.0
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scratchgpt.bench import JsonOutput, add_json_argument
from scratchgpt.bench.breakdown import format_breakdown, step_breakdown
from scratchgpt.commands.argtypes import positive_int
from scratchgpt.wording import plural

NANOGPT_VOCAB = 65  # Tiny Shakespeare's characters, the vocabulary of nanoGPT's recipe
ROUNDS = 5  # turns without --rounds (one per step where there are fewer steps)


def add_arguments(p: argparse.ArgumentParser) -> None:
    # the model and batch of nanoGPT's CPU recipe (its README's command for a laptop)
    p.add_argument("--n-layer", type=positive_int, default=4, help="blocks (4)")
    p.add_argument("--n-head", type=positive_int, default=4, help="attention heads (4)")
    p.add_argument("--n-embd", type=positive_int, default=128, help="model width (128)")
    p.add_argument("--block-size", type=positive_int, default=64, help="context in tokens (64)")
    p.add_argument("--batch-size", type=positive_int, default=12, help="windows per step (12)")
    p.add_argument("--vocab-size", type=positive_int, default=NANOGPT_VOCAB,
                   help=f"vocabulary size ({NANOGPT_VOCAB}, Tiny Shakespeare's characters)")
    p.add_argument("--activation", default="gelu", choices=("gelu", "gelu_tanh", "relu", "relu2"),
                   help="MLP activation; nanoGPT uses the exact gelu (default gelu)")
    p.add_argument("--steps", type=int, default=200, help="timed steps per variant (200)")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps first (20)")
    p.add_argument("--rounds", type=int, default=None,
                   help=f"turns each variant takes at its timed steps, at most --steps "
                        f"(default {ROUNDS}, or --steps where it is fewer)")
    p.add_argument("--variants", default="fp32,bf16",
                   help="comma list of PRECISION[-compile][-muon][-modules][-torchops][-torchmm]"
                        "[-calls][-static][-1thread] (default fp32,bf16)"
                        ": fp32 or bf16, optionally torch.compile'd, optionally with --optimizer "
                        "muon instead of AdamW, optionally with every block running its modules "
                        "(bf16 trains a plain block as one function, models/fused_block.py), "
                        "optionally with that function's elementwise work on PyTorch's "
                        "operators rather than its C kernels (models/block_ops.py), optionally "
                        "with its products on PyTorch's rather than on AMX tiles where the CPU "
                        "has them (models/tile_matmul.py), optionally with the block's C kernels "
                        "called one by one from Python rather than in one call each way "
                        "(models/block_kernel.py), optionally with each C kernel's threads "
                        "kept to their own rows rather than taking over a slower thread's last "
                        "ones (models/shares.h), optionally on one thread (beside the "
                        "same variant on all threads it gives the step's serial part) (e.g. "
                        "bf16,bf16-torchops,bf16-torchmm,bf16-1thread)")
    p.add_argument("--muon-dtype", default="auto", choices=("auto", "bf16", "fp32"),
                   help="precision of Muon's Newton-Schulz iteration in the -muon variants: "
                        "bf16 (torch.optim.Muon's own; emulated on CPUs without bf16), fp32, "
                        "or auto, what the presets train with: bf16 where the hardware has "
                        "it, else fp32 (default auto)")
    p.add_argument("--bias", action=argparse.BooleanOptionalAction, default=False,
                   help="biases in the Linear layers and LayerNorms, as GPT-2 and scratchgpt "
                        "train's default; off by default, as in nanoGPT's recipe")
    p.add_argument("--dropout", type=float, default=0.0, help="model dropout (0)")
    p.add_argument("--attn-dropout", type=float, default=None,
                   help="attention dropout alone (default: the same as --dropout)")
    p.add_argument("--nanogpt", default=None, help="nanoGPT checkout to run side by side")
    p.add_argument("--nanogpt-iters", type=positive_int, default=300,
                   help="iterations of nanoGPT's train.py (300; the first tenth untimed)")
    p.add_argument("--breakdown", action="store_true",
                   help="then profile each variant's step, the variants again taking "
                        "turns, and show where its time goes: products, attention, casts, "
                        "activation, ... (torch.profiler; each kind's median over the turns)")
    add_json_argument(p)


def matmul_peak(dtype_name: str, n: int = 2048, reps: int = 8) -> float:
    """Best observed FLOP/s of an n x n x n matmul in this dtype."""
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def flops_per_token(n_params: int, n_layer: int, n_embd: int, block: int) -> float:
    """Training FLOPs per token: 6 per weight (fwd + bwd) plus attention's 12*L*C*T."""
    return 6 * n_params + 12 * n_layer * n_embd * block


OPTIONS = ("compile", "muon", "modules", "torchops", "torchmm", "calls", "static", "1thread")


def parse_variant(variant: str) -> tuple[str, set[str]]:
    """'bf16-compile-muon' -> ('bf16', {'compile', 'muon'})."""
    from scratchgpt.errors import ConfigError

    dtype, *options = variant.strip().split("-")
    if dtype not in ("fp32", "bf16") or not set(options) <= set(OPTIONS):
        raise ConfigError(f"unknown variant {variant!r}: PRECISION"
                          + "".join(f"[-{o}]" for o in OPTIONS) + ", PRECISION fp32 or bf16")
    return dtype, set(options)


def serial_part(t_n: float, t_1: float, n: int) -> float:
    """The serial part S of a step that takes ``t_n`` on ``n`` threads and ``t_1`` on one,
    by Amdahl's law (module docstring); in the unit of the times."""
    return (n * t_n - t_1) / (n - 1)


def gpt_config(args: argparse.Namespace) -> Any:
    """The GPT every variant trains, from the shape flags."""
    from scratchgpt.models.gpt import GPTConfig

    return GPTConfig(vocab_size=args.vocab_size, block_size=args.block_size,
                     n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                     dropout=args.dropout, attn_dropout=args.attn_dropout,
                     activation=args.activation, bias=args.bias)


def variant_step(args: argparse.Namespace, variant: str) -> tuple[Callable[[], Any], Any]:
    """The full training step of ``variant`` as ``scratchgpt train`` runs it (batch sampling,
    forward, loss, backward, clipping, the update), ready to call: (step, model)."""
    import numpy as np
    import torch

    from scratchgpt.data.dataset import random_windows
    from scratchgpt.models import block_kernel, block_ops, fused_block, tile_matmul
    from scratchgpt.models.c_kernels import SHARES_SWITCH
    from scratchgpt.models.gpt import GPT
    from scratchgpt.training.allocator import keep_freed_memory
    from scratchgpt.training.config import TrainConfig
    from scratchgpt.training.optim import make_optimizer
    from scratchgpt.training.precision import resolve_muon_dtype
    from scratchgpt.training.task import LanguageModelTask
    from scratchgpt.training.trainer import train_step

    dtype, options = parse_variant(variant)
    keep_freed_memory()  # as the Trainer does
    torch.manual_seed(0)
    cfg = gpt_config(args)
    model = GPT(cfg)
    device = torch.device("cpu")
    train = TrainConfig(batch_size=args.batch_size, learning_rate=1e-3, weight_decay=0.1,
                        optimizer="muon" if "muon" in options else "adamw", grad_clip=1.0)
    opt = make_optimizer(model, train.learning_rate, train.weight_decay,
                         (train.beta1, train.beta2), train.optimizer,
                         muon_dtype=resolve_muon_dtype(args.muon_dtype, device))
    fwd = torch.compile(model) if "compile" in options else model
    # Batches come from a token array exactly as in training (random windows).
    tokens = np.random.default_rng(0).integers(0, args.vocab_size, 1_000_000).astype(np.uint16)
    gen = torch.Generator().manual_seed(0)

    def next_batch():
        return random_windows(tokens, args.batch_size, args.block_size, gen)

    params = list(model.parameters())  # listed once, as the Trainer does

    def step():
        return train_step(model, fwd, opt, LanguageModelTask.loss, train, next_batch, device,
                          dtype, params)

    if "modules" in options:
        step = switched_off(step, fused_block.SWITCH)
    if "torchops" in options:
        step = switched_off(step, block_ops.SWITCH)
    if "torchmm" in options:
        step = switched_off(step, tile_matmul.SWITCH)
    if "calls" in options:
        step = switched_off(step, block_kernel.SWITCH, "python")
    if "static" in options:
        step = switched_off(step, SHARES_SWITCH, "static")
    return (_on_one_thread(step) if "1thread" in options else step), model


def switched_off(step: Callable[[], Any], switch: str, value: str = "torch") -> Callable[[], Any]:
    """``step`` with the environment switch ``switch`` set to ``value`` for the step's
    duration (torch: PyTorch's path instead of scratchgpt's, the fused block's modules, PyTorch's
    operators inside it, or its products; python for the block's kernels called one by one;
    static for the C kernels' threads kept to their own rows), and put back after it."""
    import os

    def switched_step() -> Any:
        saved = os.environ.get(switch)
        os.environ[switch] = value
        try:
            return step()
        finally:
            if saved is None:
                del os.environ[switch]
            else:
                os.environ[switch] = saved

    return switched_step


def _on_one_thread(step: Callable[[], Any]) -> Callable[[], Any]:
    """``step`` on one thread, the thread count put back after it."""
    import torch

    def one_thread_step() -> Any:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return step()
        finally:
            torch.set_num_threads(threads)

    return one_thread_step


def serial_parts(results: list[dict], threads: int) -> dict[str, dict[str, float]]:
    """For each of our variants timed both on ``threads`` threads and with ``-1thread``
    (``results`` from :func:`time_variants`): its step's serial part in ms and as a share of
    its step, by the variant's name."""
    timed = {}
    for r in results:
        dtype, options = parse_variant(r["variant"])
        timed[dtype, frozenset(options)] = r
    parts: dict[str, dict[str, Any]] = {}
    for (dtype, options), one in timed.items():
        base = timed.get((dtype, options - {"1thread"}))
        if "1thread" in options and base is not None and threads > 1:
            t_n, t_1 = base["ms_per_step"], one["ms_per_step"]
            if not t_1 / threads <= t_n <= t_1:  # no S in [0, T_N] fits: the law does not hold
                parts[base["variant"]] = {"serial_ms": None, "of_step": None, "ms_per_step": t_n,
                                          "ms_per_step_1thread": t_1}
                continue
            s = serial_part(t_n, t_1, threads)
            parts[base["variant"]] = {"serial_ms": s, "of_step": s / t_n}
            if "breakdown_ms" in base and "breakdown_ms" in one:  # where it is, by kind
                parts[base["variant"]]["by_kind_ms"] = {
                    k: serial_part(base["breakdown_ms"][k], one["breakdown_ms"][k], threads)
                    for k in base["breakdown_ms"]}
    return parts


def serial_line(variant: str, part: dict[str, Any], threads: int) -> str:
    """The report's line on a variant's serial part (``part`` from :func:`serial_parts`).
    Where the step on ``threads`` threads took longer than on one (threads that waited on
    each other: a busy machine), or under 1/``threads`` of it, no serial part fits Amdahl's
    law: one was printed anyway, longer than the step ('30.93 ms of its step ... (165%)')."""
    if part["serial_ms"] is not None:
        return (f"{variant}: {part['serial_ms']:.2f} ms of its step on one core while the "
                f"other threads wait ({part['of_step']:.0%}; Amdahl's law from 1 and {threads} "
                "threads)")
    t_n, t_1 = part["ms_per_step"], part["ms_per_step_1thread"]
    how = (f"is slower than {t_1:.2f} on 1 (the threads waited on each other)" if t_n > t_1
           else f"is under 1/{threads} of {t_1:.2f} on 1")
    return (f"{variant}: no serial part by Amdahl's law: {t_n:.2f} ms/step on {threads} "
            f"threads {how}")


def turns(rounds: int | None, steps: int) -> int:
    """The turns each variant takes at its ``steps`` timed steps: ``rounds`` (``--rounds``),
    refused where some turn would have no step; without it :data:`ROUNDS`, or ``steps`` where
    they are fewer.

    >>> turns(None, 200), turns(None, 3), turns(3, 3)
    (5, 3, 3)
    """
    from scratchgpt.errors import ConfigError
    from scratchgpt.validation import check_range

    if rounds is None:
        return min(ROUNDS, steps)
    check_range("--rounds", rounds, 1)
    if rounds > steps:
        raise ConfigError(f"--rounds must be in [1, {steps}] (at most --steps: a step at least "
                          f"per turn), got {rounds}")
    return rounds


def time_variants(args: argparse.Namespace, variants: list[str],
                  so_far: list[dict] | None = None) -> list[dict]:
    """Each variant's result: its steps warmed up (a compiled one compiled) one variant after
    another, then timed taking turns, ``args.rounds`` turns of ``args.steps / args.rounds``
    steps each. ``so_far`` holds the results of the turns done after each turn (what a
    Ctrl-C leaves)."""
    so_far = [] if so_far is None else so_far
    built = [variant_step(args, v) for v in variants]
    first_steps = []
    for step, _ in built:
        t = time.perf_counter()
        step()  # the first step (a compiled variant's compile) is reported apart
        first_steps.append(time.perf_counter() - t)
        for _ in range(args.warmup - 1):
            step()
    times: list[list[float]] = [[] for _ in variants]
    rounds = args.rounds  # turns() has checked it: a step at least per turn
    for r in range(rounds):
        for (step, _), own in zip(built, times, strict=True):
            for _ in range(args.steps // rounds + (r < args.steps % rounds)):
                t = time.perf_counter()
                step()
                own.append(time.perf_counter() - t)
        so_far[:] = [_result(args, v, model, statistics.median(own), first)
                     for v, (_, model), own, first in zip(variants, built, times, first_steps,
                                                          strict=True)]
    results = list(so_far)
    if args.breakdown:  # the same steps, now profiled: where each one's time goes
        for result, parts in zip(results, _breakdowns([s for s, _ in built], args.steps, rounds),
                                 strict=True):
            result["breakdown_ms"] = parts
    return results


def _breakdowns(steps: list[Callable[[], Any]], timed: int, rounds: int) -> list[dict]:
    """Each step's :func:`step_breakdown`, profiled taking turns as the timing does (a tenth
    of its steps, at least 5, over ``rounds`` turns): each kind's median over the turns, and
    their sum as the total."""
    per_turn = max(timed // 10 // rounds, 1)
    turns = max(rounds, -(-5 // per_turn))
    seen: list[list[dict[str, float]]] = [[] for _ in steps]
    for _ in range(turns):
        for step, own in zip(steps, seen, strict=True):
            own.append(step_breakdown(step, per_turn))
    medians = []
    for own in seen:
        parts = {k: statistics.median(p[k] for p in own) for k in own[0] if k != "total"}
        medians.append({**parts, "total": sum(parts.values())})
    return medians


def _result(args: argparse.Namespace, variant: str, model: Any, median_s: float,
            first_step_s: float) -> dict:
    tok = args.batch_size * args.block_size
    cfg = model.config
    fpt = flops_per_token(sum(p.numel() for p in model.parameters()), cfg.n_layer, cfg.n_embd,
                          cfg.block_size)
    result = {"variant": variant, "ms_per_step": median_s * 1e3, "tokens_per_s": tok / median_s,
              "tflops": tok / median_s * fpt / 1e12, "first_step_s": first_step_s}
    return result


def run_nanogpt(args: argparse.Namespace) -> dict:
    """Run nanoGPT's own train.py with its CPU recipe, at the shape our variants train (the
    recipe's by default), and parse its per-iteration times."""
    from scratchgpt.errors import ConfigError

    root, iters = Path(args.nanogpt), args.nanogpt_iters
    if not (root / "train.py").is_file():
        raise ConfigError(f"--nanogpt {root}: no train.py there")
    if args.activation != "gelu" or args.vocab_size != NANOGPT_VOCAB or \
            args.attn_dropout not in (None, args.dropout):
        # its model has one dropout, the exact GELU and Tiny Shakespeare's characters
        raise ConfigError("--nanogpt trains nanoGPT's own model: exact GELU, one dropout, "
                          f"{NANOGPT_VOCAB} characters; drop --activation, --attn-dropout and "
                          "--vocab-size, or --nanogpt")
    cmd = [sys.executable, "train.py", "config/train_shakespeare_char.py", "--device=cpu",
           "--compile=False", f"--block_size={args.block_size}",
           f"--batch_size={args.batch_size}", f"--n_layer={args.n_layer}",
           f"--n_head={args.n_head}", f"--n_embd={args.n_embd}", f"--bias={args.bias}",
           f"--max_iters={iters}", f"--lr_decay_iters={iters}", f"--dropout={args.dropout}",
           "--eval_interval=100000", "--eval_iters=1", "--log_interval=1",
           "--always_save_checkpoint=False"]
    done = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    ms = [float(m) for m in re.findall(r"^iter \d+: loss [\d.]+, time ([\d.]+)ms",
                                       done.stdout, re.M)]
    if done.returncode != 0 or not ms:
        last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        raise ConfigError(f"--nanogpt {root}: its train.py gave no step times ({last[:200]})")
    ms = ms[len(ms) // 10:]  # drop the first 10% (warm-up)
    med = statistics.median(ms) / 1e3
    return {"variant": "nanoGPT (reference)", "ms_per_step": med * 1e3,
            "tokens_per_s": args.batch_size * args.block_size / med, "tflops": None,
            "first_step_s": None}


def run(args: argparse.Namespace) -> int:
    import torch

    from scratchgpt import memory
    from scratchgpt.models import attention_kernel, tile_matmul
    from scratchgpt.validation import check_range

    variants = [v.strip() for v in args.variants.split(",")]
    dtypes = {parse_variant(v)[0] for v in variants}  # a typo fails now
    if len(set(variants)) < len(variants):  # the same step twice: no comparison, twice the time
        from scratchgpt.errors import ConfigError

        raise ConfigError(f"--variants names a variant twice: {args.variants}")
    check_range("--steps", args.steps, 1)
    args.rounds = turns(args.rounds, args.steps)
    check_range("--warmup", args.warmup, 0)
    out = JsonOutput(args)
    # each variant's model and optimizer live while it is timed (AdamW's state, Muon's less)
    memory.check_fits(memory.training_estimate(gpt_config(args), args.batch_size),
                      "this training step")
    # Only the precisions being timed: a bf16 matmul is emulated (slow) on CPUs without bf16.
    peaks = {d: matmul_peak(d) for d in ("fp32", "bf16") if d in dtypes}
    threads = torch.get_num_threads()
    report = {"threads": threads, "matmul_peak_tflops":
              {k: round(v / 1e12, 3) for k, v in peaks.items()},
              "attention": attention_kernel.describe(),
              "block_products": tile_matmul.describe()}
    results: list[dict] = []
    ours: list[dict] = []  # on Ctrl-C: the variants' results of the turns timed
    with out.kept_on_interrupt(lambda: {**report, "results": with_peaks(results + ours, peaks,
                                                                      threads)}
                               if results or ours else None,
                               lambda figures: _print_report(args, figures, peaks)):
        if args.nanogpt:
            results.append(run_nanogpt(args))
        ours = time_variants(args, variants, ours)
    report.update(results=with_peaks(results + ours, peaks, threads),
                  serial=serial_parts(ours, threads))
    with out.printing():
        _print_report(args, report, peaks)
    out.emit(report)
    return 0


def with_peaks(results: list[dict], peaks: dict[str, float], threads: int) -> list[dict]:
    """``results``, each with ``of_peak`` (the table's "of peak"): its FLOP/s over the matmul
    peak of its precision, one thread's share of it for a -1thread variant; None where
    there is no figure (nanoGPT's row)."""
    out = []
    for r in results:
        peak = peaks.get("bf16" if r["variant"].startswith("bf16") else "fp32")
        if peak and "1thread" in r["variant"].split("-"):
            peak /= threads  # one thread's share of the peak measured on all of them
        out.append({**r, "of_peak": r["tflops"] * 1e12 / peak if r["tflops"] and peak
                    else None})
    return out


def _print_report(args: argparse.Namespace, report: dict, peaks: dict[str, float]) -> None:
    """The report as a table, then the serial parts and the breakdowns there are."""
    results, threads = report["results"], report["threads"]
    serial = report.get("serial", {})  # (none for a run stopped part-way)
    ref = results[0]["tokens_per_s"] if args.nanogpt else None
    print(f"matmul peak (2048^3, {plural(threads, 'thread')}): "
          + ", ".join(f"{d} {v / 1e12:.3f} TFLOP/s" for d, v in peaks.items()))
    print(f"model {args.n_layer}L/{args.n_head}H/{args.n_embd}d, context {args.block_size}, "
          f"batch {args.batch_size}, {'with' if args.bias else 'no'} biases; attention: "
          f"{report['attention']}; a fused block's bf16 products: {report['block_products']}")
    print(f"{'variant':22s} {'ms/step':>8s} {'tokens/s':>10s} {'TFLOP/s':>8s} {'of peak':>8s}"
          f" {'vs ref':>7s}")
    for r in results:
        frac = f"{r['of_peak']:8.1%}" if r.get("of_peak") is not None else f"{'':8s}"
        tfl = f"{r['tflops']:8.3f}" if r["tflops"] else f"{'':8s}"
        ratio = f"{r['tokens_per_s'] / ref:6.2f}x" if ref else ""
        print(f"{r['variant']:22s} {r['ms_per_step']:8.2f} {r['tokens_per_s']:10,.0f} {tfl} "
              f"{frac} {ratio:>7s}")
    for variant, part in serial.items():
        print(serial_line(variant, part, threads))
    for r in results:
        if "breakdown_ms" in r:
            print("\n".join(format_breakdown(r["variant"], r["breakdown_ms"])))
    for variant, part in serial.items():
        if "by_kind_ms" in part:
            print("\n".join(format_breakdown(variant, part["by_kind_ms"], "serial part")))
