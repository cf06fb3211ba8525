"""Sampling speed: wall time to generate N tokens (prefill + KV-cached decode) from a model.

By default the model is the cpu-small preset's shape with random weights and a 65-character
vocabulary (speed does not depend on the weights); ``--checkpoint`` times a trained run instead.
The model is prepared as ``sample --dtype`` prepares it (``--dtype``: fp32, bf16, int8). The
figure is generation time inside the process (no interpreter start-up), median of repeats.

``--compile`` times ``sample --compile`` against the eager model in the same run, alternating
(eager, compiled, eager, ...), and reports the one-time compile separately.

``--json`` prints the figures and their settings as one JSON object (``--json FILE`` writes
it); a run stopped by Ctrl-C gives the runs timed so far, marked ``"interrupted": true``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from scratchgpt.bench import JsonOutput, add_json_argument, bench_threads
from scratchgpt.commands.argtypes import new_tokens, positive_int
from scratchgpt.training.config import PRESETS
from scratchgpt.wording import plural

DEFAULT_PRESET = "cpu-small"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", default=None, help="run directory or .pt file (optional)")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="model shape of a random model, without --checkpoint (default "
                        f"{DEFAULT_PRESET})")
    p.add_argument("--tokens", type=new_tokens, default=500,
                   help="new tokens per sample (500)")
    p.add_argument("--prompt-len", type=positive_int, default=1, help="prompt tokens (1)")
    p.add_argument("--temperature", type=float, default=0.8,
                   help="softmax temperature of the samples (0.8)")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus mass (0.95)")
    p.add_argument("--repeats", type=positive_int, default=5,
                   help="timed runs after one warm-up; the median is reported (5)")
    p.add_argument("--dtype", choices=("fp32", "bf16", "int8"), default="fp32",
                   help="inference precision, as sample --dtype (default fp32)")
    p.add_argument("--compile", action="store_true",
                   help="also time the compiled decode step (sample --compile), alternating "
                        "with the eager one; fp32 only")
    p.add_argument("--threads", type=bench_threads, default=0,
                   help="CPU threads (0 = as sample chooses: 1 for a small model, else "
                        "torch's default)")
    add_json_argument(p)


def run(args: argparse.Namespace) -> int:
    if args.checkpoint and args.preset is not None:  # it would be dropped for the checkpoint's
        from scratchgpt.errors import ConfigError  # shape

        raise ConfigError("--preset shapes a random model; --checkpoint gives the model")
    out = JsonOutput(args)
    with out.printing():
        return _run(args, out)


def _run(args: argparse.Namespace, out: JsonOutput) -> int:
    import torch

    from scratchgpt.generation.sampling import SamplingConfig
    from scratchgpt.models.fast_decode import decode_threads, prepare_for_decode
    from scratchgpt.models.native import describe

    model, what = _model(args)
    _check_prompt_fits(model, args.prompt_len)
    n_params = model.num_params()
    # as sample prepares it; --compile compares the compiled step with the eager one
    model = prepare_for_decode(model, args.dtype, pack=not args.compile, native=not args.compile)
    torch.set_num_threads(args.threads or decode_threads(model))
    report: dict[str, Any] = {
        "model": what, "params": n_params, "dtype": args.dtype,
        "threads": torch.get_num_threads(), "decode_step": describe(model),
        "tokens": args.tokens, "prompt_len": args.prompt_len,
        "temperature": args.temperature, "top_p": args.top_p, "repeats": args.repeats}
    variants = {"eager": model}
    if args.compile:
        from scratchgpt.models.compiled import CompiledGPT

        t = time.perf_counter()
        variants["compiled"] = CompiledGPT(model)
        variants["compiled"].warm_up()
        report["compile_s"] = time.perf_counter() - t
    cfg = SamplingConfig(args.temperature, None, args.top_p)
    times: dict[str, list[float]] = {name: [] for name in variants}
    with out.kept_on_interrupt(lambda: _figures(report, times) if times["eager"] else None,
                               lambda figures: _print_report(figures, args.compile)):
        _time_variants(variants, cfg, args, times)
    figures = _figures(report, times)
    _print_report(figures, args.compile)
    out.emit(figures)
    return 0


def _model(args: argparse.Namespace) -> tuple[Any, str]:
    """The model to time, in eval mode, and how the report names it: ``--checkpoint``'s, or
    one of ``--preset``'s shape with random weights."""
    if args.checkpoint:
        from scratchgpt.checkpoints.io import load_language_model

        model, source = load_language_model(args.checkpoint, command="bench sample")
        return model, str(source.path)
    from scratchgpt.models import build_model, config_fields, model_config

    shape = args.preset or DEFAULT_PRESET
    preset = PRESETS[shape]
    fields = config_fields(preset["model"]) - {"vocab_size"}
    model = build_model(model_config(preset["model"], vocab_size=65,
                                     **{k: v for k, v in preset.items() if k in fields}))
    model.eval()
    return model, f"{shape} shape, random weights"


def _time_variants(variants: dict[str, Any], cfg: Any, args: argparse.Namespace,
                   times: dict[str, list[float]]) -> None:
    """One untimed warm-up and ``--repeats`` timed runs of each variant, taking turns, each
    run's seconds appended to ``times`` as it ends (what a Ctrl-C leaves is kept)."""
    import torch

    from scratchgpt.generation.generate import generate

    prompt = torch.zeros(1, args.prompt_len, dtype=torch.long)
    for i in range(args.repeats + 1):
        for name, m in variants.items():  # alternating, so both see the same machine
            gen = torch.Generator().manual_seed(i)
            t = time.perf_counter()
            out = generate(m, prompt, args.tokens, cfg, gen)
            if i:  # the first run warms up allocators and kernels
                times[name].append(time.perf_counter() - t)
            assert out.shape[1] == args.prompt_len + args.tokens


def _figures(report: dict[str, Any], times: dict[str, list[float]]) -> dict[str, Any]:
    """The --json figures: the settings and each variant's timed runs (their count, median,
    min and max seconds, tokens/s of the median), fewer than --repeats where Ctrl-C (or
    SIGTERM) stopped the run."""
    results = []
    for name, ts in times.items():
        if ts:
            med = statistics.median(ts)
            results.append({"variant": name, "runs": len(ts), "median_s": med,
                            "min_s": min(ts), "max_s": max(ts),
                            "tokens_per_s": report["tokens"] / med})
    figures = {**report, "results": results}
    if len(results) == 2:  # eager and compiled
        figures["compiled_speedup"] = results[0]["median_s"] / results[1]["median_s"]
    return figures


def _print_report(figures: dict[str, Any], compiled: bool) -> None:
    threads, tokens = figures["threads"], figures["tokens"]
    print(f"model: {figures['model']}, {figures['params']:,} parameters, {figures['dtype']}, "
          f"{plural(threads, 'thread')}; decode step: "
          f"{figures['decode_step']}")
    for r in figures["results"]:
        label = f"{r['variant']}: " if compiled else ""
        print(f"{label}{tokens} tokens: median {r['median_s']:.3f} s over "
              f"{plural(r['runs'], 'run')} (min {r['min_s']:.3f}, max {r['max_s']:.3f}) = "
              f"{r['tokens_per_s']:,.0f} tokens/s")
    if "compiled_speedup" in figures:  # (not when Ctrl-C came before its first run)
        print(f"compiled: {figures['compiled_speedup']:.2f}x the eager speed; compiling took "
              f"{figures['compile_s']:.1f} s (once per process)")


def _check_prompt_fits(model, prompt_len: int) -> None:
    """A prompt longer than the model's context would be cut to its last context-length
    tokens, and the figure would time a prompt other than --prompt-len's."""
    from scratchgpt.errors import ConfigError
    from scratchgpt.generation.decode import context_length

    ctx = context_length(model)
    if ctx is not None and prompt_len > ctx:
        raise ConfigError(f"--prompt-len must be in [1, {ctx}] (the model's context), got "
                          f"{prompt_len}")
