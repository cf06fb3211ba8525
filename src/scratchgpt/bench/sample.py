"""Sampling speed: wall time to generate N tokens (prefill + KV-cached decode) from a model.

By default the model is the cpu-small preset's shape with random weights and a 65-character
vocabulary (speed does not depend on the weights); ``--checkpoint`` times a trained run instead.
The model is prepared as ``sample --dtype`` prepares it (``--dtype``: fp32, bf16, int8). The
figure is generation time inside the process (no interpreter start-up), median of repeats.

``--compile`` times ``sample --compile`` against the eager model in the same run, alternating
(eager, compiled, eager, ...), and reports the one-time compile separately.
"""

from __future__ import annotations

import argparse
import statistics
import time

from scratchgpt.bench import bench_threads
from scratchgpt.commands.argtypes import new_tokens, positive_int
from scratchgpt.training.config import PRESETS

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


def run(args: argparse.Namespace) -> int:
    import torch

    from scratchgpt.generation.generate import generate
    from scratchgpt.generation.sampling import SamplingConfig
    from scratchgpt.models import build_model, config_fields, model_config
    from scratchgpt.models.fast_decode import decode_threads, prepare_for_decode
    from scratchgpt.models.native import describe

    if args.checkpoint:
        from scratchgpt.checkpoints.io import load_language_model
        from scratchgpt.errors import ConfigError

        if args.preset is not None:  # it would be dropped for the checkpoint's shape
            raise ConfigError("--preset shapes a random model; --checkpoint gives the model")
        model, source = load_language_model(args.checkpoint, command="bench sample")
        what = str(source.path)
    else:
        shape = args.preset or DEFAULT_PRESET
        preset = PRESETS[shape]
        fields = config_fields(preset["model"]) - {"vocab_size"}
        model = build_model(model_config(preset["model"], vocab_size=65,
                                         **{k: v for k, v in preset.items() if k in fields}))
        model.eval()
        what = f"{shape} shape, random weights"
    _check_prompt_fits(model, args.prompt_len)
    n_params = model.num_params()
    # as sample prepares it; --compile compares the compiled step with the eager one
    model = prepare_for_decode(model, args.dtype, pack=not args.compile, native=not args.compile)
    torch.set_num_threads(args.threads or decode_threads(model))
    variants = {"eager": model}
    t_compile = 0.0
    if args.compile:
        from scratchgpt.models.compiled import CompiledGPT

        t = time.perf_counter()
        variants["compiled"] = CompiledGPT(model)
        variants["compiled"].warm_up()
        t_compile = time.perf_counter() - t
    cfg = SamplingConfig(args.temperature, None, args.top_p)
    prompt = torch.zeros(1, args.prompt_len, dtype=torch.long)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for i in range(args.repeats + 1):
        for name, m in variants.items():  # alternating, so both see the same machine
            gen = torch.Generator().manual_seed(i)
            t = time.perf_counter()
            out = generate(m, prompt, args.tokens, cfg, gen)
            if i:  # the first run warms up allocators and kernels
                times[name].append(time.perf_counter() - t)
            assert out.shape[1] == args.prompt_len + args.tokens
    threads = torch.get_num_threads()
    print(f"model: {what}, {n_params:,} parameters, {args.dtype}, "
          f"{threads} thread{'s' if threads != 1 else ''}; decode step: {describe(model)}")
    for name, ts in times.items():
        med = statistics.median(ts)
        label = f"{name}: " if args.compile else ""
        print(f"{label}{args.tokens} tokens: median {med:.3f} s over {args.repeats} runs "
              f"(min {min(ts):.3f}, max {max(ts):.3f}) = {args.tokens / med:,.0f} tokens/s")
    if args.compile:
        ratio = statistics.median(times["eager"]) / statistics.median(times["compiled"])
        print(f"compiled: {ratio:.2f}x the eager speed; compiling took {t_compile:.1f} s "
              "(once per process)")
    return 0


def _check_prompt_fits(model, prompt_len: int) -> None:
    """A prompt longer than the model's context would be cut to its last context-length
    tokens, and the figure would time a prompt other than --prompt-len's."""
    from scratchgpt.errors import ConfigError
    from scratchgpt.generation.decode import context_length

    ctx = context_length(model)
    if ctx is not None and prompt_len > ctx:
        raise ConfigError(f"--prompt-len must be in [1, {ctx}] (the model's context), got "
                          f"{prompt_len}")
