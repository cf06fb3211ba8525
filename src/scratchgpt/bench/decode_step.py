"""Where a decode step's time goes: kernels by kind against the bytes they read, and Python.

One call of the model with ``T`` new tokens after ``--context`` cached ones (``T = 1``: a decode
step; ``T = K + 1``: speculative decoding's scoring call) is timed as generation runs it, then
taken apart: every PyTorch kernel the call ran is recorded (a ``TorchDispatchMode``) and the
recorded kernels are replayed in order with the same inputs, each timed. So the report says

* the call as the model code runs it, median over ``--repeats``;
* the kernels alone (the replay): what the step would cost with no Python in between;
* per kind of kernel (matrix products, attention, norms, activations, cache writes, ...): time,
  share, and for the products the weight bytes read and the rate they stream at, against the
  read bandwidth of the machine (the ceiling of a batch-1 decode step);
* Python and dispatch: the call minus its kernels (module calls, views, argument checks);
* sampling: the next-token choice of a decode step (greedy, and temperature / top-p);
* with several ``--tokens``, each call against the one-token step (scoring K + 1 positions
  should cost little more than one decode step).

With one thread the clock is the thread's CPU time, which a machine shared with other jobs
disturbs least; with more threads it is wall time. ``--variants`` compares weight preparations
side by side, alternating repeat by repeat: ``prepared`` (the PyTorch step as
``fast_decode.prepare_for_decode`` prepares it: oneDNN packing for large Linears only),
``plain`` (the weights as trained), ``layout`` (``GPT.decode_layout_``), ``packed`` (every
Linear packed by oneDNN), ``native`` (what ``sample`` runs where it can: the whole step in one
C call, ``models/native.py``; it runs no PyTorch kernels to take apart, so only its time is
reported).

    scratchgpt bench decode-step --preset cpu-medium --tokens 1,5 --threads 1
    scratchgpt bench decode-step --n-layer 12 --n-head 12 --n-embd 768 --variants prepared,packed
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scratchgpt.bench import JsonOutput, add_json_argument, bench_threads_positive, refuse_repeats
from scratchgpt.commands.argtypes import non_negative_int, positive_int
from scratchgpt.validation import flag_of
from scratchgpt.wording import plural

# Kernels by kind (the aten / extension op names a GPT's forward and the sampler run).
KINDS: dict[str, tuple[str, ...]] = {
    "matmul": ("addmm", "mm", "bmm", "mv", "addmv", "matmul", "linear", "_linear_pointwise",
               "_mkl_linear", "_weight_int8pack_mm", "linear_dynamic", "baddbmm"),
    "attention": ("_scaled_dot_product_flash_attention_for_cpu", "_softmax", "softmax",
                  "_safe_softmax", "masked_fill", "masked_fill_"),
    "norm": ("native_layer_norm", "layer_norm", "_fused_rms_norm", "rms_norm"),
    "activation": ("gelu", "relu", "tanh", "square", "pow"),
    "cache write / copy": ("copy_", "index_copy_", "index_put_", "clone", "_to_copy",
                           "contiguous", "cat", "stack"),
    "embedding": ("embedding", "index_select", "index"),
    "sampling": ("argmax", "sort", "topk", "cumsum", "searchsorted", "uniform_", "rand",
                 "multinomial", "scatter", "gather", "minimum"),
    "views (no data)": ("view", "_unsafe_view", "transpose", "permute", "t", "expand", "slice",
                        "select", "unbind", "split", "split_with_sizes", "narrow", "as_strided",
                        "unsqueeze", "squeeze", "reshape", "alias", "detach", "lift_fresh",
                        "_reshape_alias"),
}
VARIANTS = ("prepared", "plain", "layout", "packed", "native")
# the random model's shape without --preset or --checkpoint: GPT-2 124M's
RANDOM_SHAPE = {"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024}
CONTEXT = 64  # cached tokens without --context (fewer where the model has less room)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", default=None, help="run directory or .pt file (optional)")
    p.add_argument("--preset", default=None,
                   help="model shape of a training preset (e.g. cpu-small, cpu-medium), random "
                        "weights, vocabulary --vocab-size (default 65 here)")
    for flag, default in RANDOM_SHAPE.items():
        p.add_argument(flag_of(flag), type=positive_int, default=None,
                       help=f"of a random model without --preset (default {default})")
    p.add_argument("--vocab-size", type=positive_int, default=None,
                   help="vocabulary of a random model (default 50257, or 65 with --preset)")
    p.add_argument("--dtype", choices=("fp32", "bf16", "int8"), default="fp32",
                   help="inference precision, as sample --dtype (default fp32)")
    p.add_argument("--variants", default="prepared",
                   help=f"comma list of weight preparations to compare: {', '.join(VARIANTS)} "
                        "(default prepared)")
    p.add_argument("--tokens", default="1",
                   help="comma list of new tokens per call (default 1: a decode step; K+1 = "
                        "scoring K drafts), e.g. 1,5")
    p.add_argument("--context", type=int, default=None,
                   help=f"tokens already in the cache (default {CONTEXT}, or as many as the "
                        "model's positions leave room for beside --tokens)")
    p.add_argument("--repeats", type=positive_int, default=None,
                   help="timed calls per variant (default: about 2 s of calls)")
    p.add_argument("--threads", type=bench_threads_positive, default=1,
                   help="torch threads (default 1: thread CPU time is the clock)")
    p.add_argument("--ops", type=non_negative_int, default=0,
                   help="also list the N costliest kernels of each call by op name (0 = none)")
    add_json_argument(p)


# ---- recording and replaying the kernels of one call


@dataclass
class Kernel:
    """One recorded kernel call: the op, its arguments, and the model bytes it reads."""

    op: Any
    args: tuple
    kwargs: dict
    kind: str
    weight_bytes: int


def kind_of(op: Any) -> str:
    """The kind of a kernel by its op name (``aten::addmm`` -> matmul), else 'other'."""
    name = op._schema.name.split("::")[-1] if hasattr(op, "_schema") else str(op)
    return next((kind for kind, names in KINDS.items() if name in names), "other")


def _key(t: Any) -> int:
    """A tensor's identity for weight counting: its data pointer, or for an opaque (oneDNN
    packed) tensor, which has none, the object itself."""
    import torch

    return t.data_ptr() if t.layout == torch.strided else id(t)


def model_tensors(model: Any) -> dict[int, int]:
    """:func:`_key` -> bytes of every weight the model holds (``fast_decode.model_weights``),
    so that a recorded kernel's weight reads can be counted."""
    from scratchgpt.models.fast_decode import model_weights

    return {_key(t): t.numel() * t.element_size() for t in model_weights(model)}


WEIGHT_READERS = ("matmul", "norm")  # kinds that read whole weights (an embedding reads a row)


def _weight_bytes(kind: str, args: tuple, weights: dict[int, int]) -> int:
    import torch

    if kind not in WEIGHT_READERS:
        return 0
    return sum(weights.get(_key(a), 0) for a in args if isinstance(a, torch.Tensor))


def record(fn: Callable[[], Any], weights: dict[int, int]) -> list[Kernel]:
    """Run ``fn`` once and return every kernel it dispatched, in order."""
    from torch.utils._python_dispatch import TorchDispatchMode

    calls: list[Kernel] = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            kind = kind_of(func)
            calls.append(Kernel(func, args, kwargs, kind, _weight_bytes(kind, args, weights)))
            return func(*args, **kwargs)

    with Recorder():
        fn()
    return calls


def replay(kernels: list[Kernel], clock: Callable[[], int]) -> tuple[int, list[int]]:
    """Run the recorded kernels in order: (total ns without per-kernel clocks, ns per kernel)."""
    t0 = clock()
    for k in kernels:
        k.op(*k.args, **k.kwargs)
    total = clock() - t0
    each = []
    for k in kernels:
        t = clock()
        k.op(*k.args, **k.kwargs)
        each.append(clock() - t)
    return total, each


def clock_overhead(clock: Callable[[], int], n: int = 2000) -> float:
    """ns that reading the clock twice adds to a measurement (subtracted per kernel)."""
    samples = []
    for _ in range(n):
        t = clock()
        samples.append(clock() - t)
    return statistics.median(samples)


# ---- one call, measured


@dataclass
class CallProfile:
    """What one kind of call (a variant, T new tokens) costs."""

    variant: str
    tokens: int
    call_ns: list[int] = field(default_factory=list)
    replay_ns: list[int] = field(default_factory=list)
    kernel_ns: list[list[int]] = field(default_factory=list)
    kernels: list[Kernel] = field(default_factory=list)
    c_step_bytes: int = 0  # a C step (no PyTorch kernels): the weight bytes it reads

    def summary(self, overhead_ns: float) -> dict[str, Any]:
        call = statistics.median(self.call_ns)
        replayed = statistics.median(self.replay_ns)
        per_kernel = [max(statistics.median(ns) - overhead_ns, 0.0)
                      for ns in zip(*self.kernel_ns, strict=True)]
        scale = replayed / max(sum(per_kernel), 1.0)  # per-kernel clocks -> the replay's total
        kinds: dict[str, dict[str, float]] = {}
        ops: dict[str, float] = {}
        for k, ns in zip(self.kernels, per_kernel, strict=True):
            row = kinds.setdefault(k.kind, {"ms": 0.0, "calls": 0, "weight_bytes": 0})
            row["ms"] += ns * scale / 1e6
            row["calls"] += 1
            row["weight_bytes"] += k.weight_bytes
            ops[str(k.op)] = ops.get(str(k.op), 0.0) + ns * scale / 1e6
        for row in kinds.values():
            row["share"] = row["ms"] * 1e6 / call
            row["gb_s"] = row["weight_bytes"] / (row["ms"] * 1e6) if row["ms"] else 0.0
        return {"variant": self.variant, "tokens": self.tokens, "call_ms": call / 1e6,
                "kernels_ms": replayed / 1e6, "python_ms": max(call - replayed, 0.0) / 1e6,
                "n_kernels": len(self.kernels),
                "weight_bytes": sum(k.weight_bytes for k in self.kernels) + self.c_step_bytes,
                "c_step": bool(self.c_step_bytes),
                "kinds": dict(sorted(kinds.items(), key=lambda kv: -kv[1]["ms"])),
                "ops_ms": dict(sorted(ops.items(), key=lambda kv: -kv[1]))}


def forward_call(model: Any, context: int, tokens: int) -> Callable[[], Any]:
    """A call of the model on ``tokens`` new tokens after ``context`` cached ones; the cache
    rolls back after each call, so every call sees the same state."""
    import torch

    from scratchgpt.generation.decode import score

    cache = model.new_cache(1, context + tokens)
    if not cache.rewinds:
        from scratchgpt.errors import ConfigError

        raise ConfigError("bench decode-step times a model whose cache rolls back to the same "
                          "context before each call (a GPT or bigram, not a recurrent model)")
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    score(model, cache, torch.randint(0, vocab, (1, context), generator=g))
    idx = torch.randint(0, vocab, (1, tokens), generator=g)

    def call():
        score(model, cache, idx)
        cache.rollback(context)

    call.cache = cache  # type: ignore[attr-defined]
    return call


def sampling_calls(vocab: int) -> dict[str, Callable[[], Any]]:
    """The next-token choice of a decode step on one row of logits: greedy and sampled."""
    import torch

    from scratchgpt.generation.sampling import SamplingConfig, next_token

    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(0)
    greedy, sampled = SamplingConfig(0.0), SamplingConfig(0.8, None, 0.95)
    return {"greedy": lambda: next_token(logits, greedy, g),
            "temperature 0.8, top-p 0.95": lambda: next_token(logits, sampled, g)}


def time_calls(calls: dict[str, Callable[[], Any]], repeats: int,
               clock: Callable[[], int]) -> dict[str, float]:
    """Median ns of each call, the calls alternating."""
    out: dict[str, list[int]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, fn in calls.items():
            t = clock()
            fn()
            out[name].append(clock() - t)
    return {name: statistics.median(v) for name, v in out.items()}


# ---- models


def build(args: argparse.Namespace) -> tuple[Any, str]:
    """The fp32 model to time (a checkpoint, a preset's shape, or the --n-* shape) and a name."""
    from scratchgpt.models.gpt import GPT, GPTConfig

    given = [flag_of(k) for k in RANDOM_SHAPE if getattr(args, k) is not None]
    if given and (args.checkpoint or args.preset):
        from scratchgpt.errors import ConfigError

        raise ConfigError(f"{', '.join(given)} shape a random model; "
                          f"{'--checkpoint' if args.checkpoint else '--preset'} gives the shape")
    if args.checkpoint:
        from scratchgpt.checkpoints.io import load_language_model

        model, source = load_language_model(args.checkpoint, command="bench decode-step")
        return model.float().eval(), str(source.path)
    if args.preset:
        from scratchgpt.errors import ConfigError
        from scratchgpt.training.config import PRESETS
        from scratchgpt.wording import a_kind

        if args.preset not in PRESETS:
            raise ConfigError(f"unknown preset {args.preset!r}")
        p = PRESETS[args.preset]
        if p.get("model", "gpt") != "gpt":  # its fields would shape a GPT it does not train
            raise ConfigError(f"--preset {args.preset} trains {a_kind(p['model'])} model; "
                              "bench decode-step times GPT shapes")
        fields = set(GPTConfig.__dataclass_fields__) - {"vocab_size", "dropout"}
        cfg = GPTConfig(vocab_size=args.vocab_size or 65,
                        **{k: v for k, v in p.items() if k in fields})
        name = f"{args.preset} shape"
    else:
        shape = {k: getattr(args, k) or default for k, default in RANDOM_SHAPE.items()}
        cfg = GPTConfig(vocab_size=args.vocab_size or 50257, **shape)
        name = "GPT shape"
    import torch

    from scratchgpt import memory

    memory.check_fits(memory.inference_estimate(cfg, 1), f"timing a {name}")
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    return model, (f"{name} {cfg.n_layer}L/{cfg.n_head}H/{cfg.n_embd}d vocab {cfg.vocab_size}, "
                   "random weights")


def variant_model(base: Any, variant: str, dtype: str) -> Any:
    """A copy of ``base`` prepared as ``variant`` (see the module doc)."""
    import copy

    from scratchgpt.models.fast_decode import (
        optimize_for_decode,
        prepare_for_decode,
        to_inference_dtype,
    )

    model = copy.deepcopy(base)
    if variant in ("prepared", "native"):
        return prepare_for_decode(model, dtype, native=variant == "native")
    to_inference_dtype(model, dtype)
    if variant == "layout":
        model.decode_layout_()
    elif variant == "packed":
        optimize_for_decode(model, pack=0)
    return model


def _parse(args: argparse.Namespace) -> tuple[list[str], list[int]]:
    from scratchgpt.errors import ConfigError

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        raise ConfigError(f"--variants: choose from {', '.join(VARIANTS)}, got {args.variants!r}")
    try:
        tokens = [int(t) for t in args.tokens.split(",") if t.strip()]
    except ValueError:
        raise ConfigError(f"--tokens is a comma list of integers, got {args.tokens!r}") from None
    if not tokens or min(tokens) < 1:
        raise ConfigError(f"--tokens lists counts >= 1, got {args.tokens!r}")
    if args.context is not None and args.context < 1:
        raise ConfigError(f"--context must be >= 1, got {args.context}")
    refuse_repeats("--variants", variants)  # each was timed again, a row of the table each time
    refuse_repeats("--tokens", [str(t) for t in tokens])
    return variants, tokens


def run(args: argparse.Namespace) -> int:
    import torch

    from scratchgpt.bench.generate import read_bandwidth

    variants, token_counts = _parse(args)
    out = JsonOutput(args)
    torch.set_num_threads(args.threads)
    clock = time.thread_time_ns if args.threads == 1 else time.perf_counter_ns
    base, what = build(args)
    args.context = fit_context(args.context, max(token_counts), base.config.block_size)
    profiles: list[CallProfile] = []

    def measured() -> dict[str, Any] | None:  # on Ctrl-C: the calls timed at least once
        timed = [p for p in profiles if p.kernel_ns]  # (appended last of a repeat)
        if not timed:
            return None
        ns = clock_overhead(clock)
        return {**_settings(args, what), "calls": [p.summary(ns) for p in timed]}

    def show(figures: dict[str, Any]) -> None:  # on Ctrl-C: the calls timed
        print(format_report({**figures, "read_bandwidth_gb_s": read_bandwidth() / 1e9}))

    with torch.inference_mode(), out.kept_on_interrupt(measured, show):
        models = {v: variant_model(base, v, args.dtype) for v in variants}
        profile_calls(models, token_counts, args, clock, profiles)
        overhead = clock_overhead(clock)
        sampling = time_calls(sampling_calls(base.config.vocab_size), 300, clock)
    report = {**_settings(args, what), "read_bandwidth_gb_s": read_bandwidth() / 1e9,
              "calls": [p.summary(overhead) for p in profiles],
              "sampling_ms": {k: v / 1e6 for k, v in sampling.items()}}
    with out.printing():
        print(format_report(report))
    out.emit(report)
    return 0


def _settings(args: argparse.Namespace, what: str) -> dict[str, Any]:
    return {"model": what, "top_ops": args.ops, "dtype": args.dtype, "threads": args.threads,
            "clock": "thread CPU time" if args.threads == 1 else "wall time",
            "context": args.context}


def fit_context(context: int | None, tokens: int, positions: int) -> int:
    """The cached tokens to time: ``context`` (``--context``), refused where it and the call's
    ``tokens`` new ones outgrow the model's ``positions``; without it :data:`CONTEXT`, or the
    room there is (the report says which).

    >>> fit_context(None, 5, 32), fit_context(27, 5, 32)
    (27, 27)
    """
    from scratchgpt.errors import ConfigError

    room = positions - tokens
    if room < 1:
        raise ConfigError(f"--tokens {tokens} leaves no room for a cached context in the "
                          f"model's {positions} positions")
    if context is None:
        return min(CONTEXT, room)
    if context > room:
        raise ConfigError(f"--context must be in [1, {room}] (the model's {positions} "
                          f"positions less --tokens {tokens}), got {context}")
    return context


def profile_calls(models: dict[str, Any], token_counts: list[int], args: argparse.Namespace,
                  clock: Callable[[], int], profiles: list[CallProfile]) -> None:
    """Time every (variant, T) call as run, and its kernels replayed, all alternating, each
    call's profile appended to ``profiles`` (its times too, as they are taken)."""
    calls = {}
    for v, model in models.items():
        for t in token_counts:
            fn = forward_call(model, args.context, t)
            fn()  # warm-up: first calls allocate and pick kernels
            prof = CallProfile(v, t, kernels=record(fn, model_tensors(model)),
                               c_step_bytes=c_step_bytes(model, t))
            calls[(v, t)] = fn
            profiles.append(prof)
    repeats = args.repeats or _repeats_for(calls, clock)
    for _ in range(repeats):
        for prof in profiles:
            fn = calls[(prof.variant, prof.tokens)]
            t = clock()
            fn()
            prof.call_ns.append(clock() - t)
            total, each = replay(prof.kernels, clock)
            fn.cache.rollback(args.context)  # type: ignore[attr-defined]
            prof.replay_ns.append(total)
            prof.kernel_ns.append(each)


def c_step_bytes(model: Any, tokens: int) -> int:
    """The weight bytes of a one-token call that runs in C (0 for any other call)."""
    from scratchgpt.models.native import NativeGPT

    return model.step_bytes() if isinstance(model, NativeGPT) and tokens == 1 else 0


def _repeats_for(calls: dict, clock: Callable[[], int], budget_s: float = 2.0) -> int:
    """Enough repeats for ~``budget_s`` of calls (each repeat also replays them twice)."""
    t = clock()
    for fn in calls.values():
        fn()
    one = max((clock() - t) / 1e9, 1e-6)
    return max(5, min(500, int(budget_s / (3 * one))))


def format_report(r: dict[str, Any]) -> str:
    bw = r["read_bandwidth_gb_s"]
    lines = [f"{r['model']}, {r['dtype']}, {plural(r['threads'], 'thread')}, clock: {r['clock']}, "
             f"{r['context']} tokens cached; read bandwidth (sum of 512 MiB) {bw:.1f} GB/s"]
    one = {c["variant"]: c["call_ms"] for c in r["calls"] if c["tokens"] == 1}
    for c in r["calls"]:
        ceiling = c["weight_bytes"] / (bw * 1e9) * 1e3
        vs_one = (f", {c['call_ms'] / one[c['variant']]:.2f}x the 1-token call"
                  if c["tokens"] > 1 and c["variant"] in one else "")
        lines.append(f"\n[{c['variant']}] {c['tokens']} new token(s): {c['call_ms']:.3f} ms per "
                     f"call{vs_one}; weights read {c['weight_bytes'] / 1e6:.1f} MB (at the read "
                     f"bandwidth: {ceiling:.3f} ms)")
        if c.get("c_step"):
            rate = c["weight_bytes"] / (c["call_ms"] * 1e6)
            lines.append(f"  one C call (models/native.py): its weights stream at {rate:.1f} "
                         "GB/s; no PyTorch kernels to take apart")
            continue
        lines.append(f"  {'kernels, replayed without Python':38s} {c['kernels_ms']:8.3f} ms "
                     f"{c['kernels_ms'] / c['call_ms']:6.1%}  ({c['n_kernels']} kernels)")
        for kind, k in c["kinds"].items():
            rate = f"  {k['gb_s']:6.1f} GB/s of weights" if k["weight_bytes"] else ""
            lines.append(f"    {kind:34s} {k['ms']:8.3f} ms {k['share']:6.1%}  "
                         f"{k['calls']:4d} calls{rate}")
        lines.append(f"  {'Python and dispatch (the rest)':38s} {c['python_ms']:8.3f} ms "
                     f"{c['python_ms'] / c['call_ms']:6.1%}")
        for op, ms in list(c["ops_ms"].items())[: r["top_ops"]]:
            lines.append(f"      {op:44s} {ms:8.3f} ms")
    if "sampling_ms" in r:  # (not timed in a run stopped part-way)
        lines.append("\nnext-token choice on one row of logits: " + ", ".join(
            f"{name} {ms:.3f} ms" for name, ms in r["sampling_ms"].items()))
    return "\n".join(lines)
