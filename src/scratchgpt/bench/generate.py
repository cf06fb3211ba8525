"""Generation speed: decode tokens/s against transformers and llama.cpp, and the bandwidth ceiling.

Default shape = GPT-2 124M (12 layers, 12 heads, 768 dims, vocabulary 50257, context 1024) with
random weights, a 64-token prompt, 256 new tokens, greedy, batch 1, in each ``--dtypes``
precision: fp32, bf16 and int8 (weight-only, per-channel; ``models/fast_decode.py``). The same
weights go to ``transformers.GPT2LMHeadModel`` through our exporter (fp32, bf16) and, with
``--llama-cpp``, to llama.cpp through a GGUF file we write (fp32 <-> f32, bf16 <-> f16, int8 <->
q8_0), run by llama-cpp-python. All run in this process, alternating per repeat, timed the same
way: the wall-clock time of each new token as it is emitted (our ``stream``; a ``streamer`` on
transformers' ``generate``; one ``eval`` per token on llama.cpp), so prefill (prompt -> first
token) and decode (every later token) are separated.

Also reported: the decode ceiling (bytes each token must read / measured read bandwidth),
cached vs full-recompute time for 512 new tokens, batched throughput, and what bf16 and int8
cost in accuracy (max logit difference on the prompt, where greedy output first diverges from
fp32).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from scratchgpt.bench import JsonOutput, add_json_argument, bench_threads, refuse_repeats
from scratchgpt.commands.argtypes import non_negative_int, positive_int
from scratchgpt.wording import plural

DTYPES = ("fp32", "bf16", "int8")
GGUF_TYPE = {"fp32": "f32", "bf16": "f16", "int8": "q8_0"}  # llama.cpp's counterpart of each
WHO = ("ours", "transformers", "llama.cpp")


RECOMPUTE_TOKENS = 512  # new tokens of the cached vs full-recompute comparison


def add_arguments(p: argparse.ArgumentParser) -> None:
    # a random-weight model of GPT-2 124M's shape unless given
    p.add_argument("--n-layer", type=positive_int, default=12, help="blocks (12)")
    p.add_argument("--n-head", type=positive_int, default=12, help="attention heads (12)")
    p.add_argument("--n-embd", type=positive_int, default=768, help="model width (768)")
    p.add_argument("--vocab-size", type=positive_int, default=50257,
                   help="vocabulary size (50257, GPT-2's)")
    p.add_argument("--block-size", type=positive_int, default=1024,
                   help="context in tokens (1024)")
    p.add_argument("--prompt-len", type=positive_int, default=64,
                   help="prompt tokens, prefilled before the timed decode (64)")
    p.add_argument("--new-tokens", type=positive_int, default=256,
                   help="tokens decoded per run (256)")
    p.add_argument("--repeats", type=positive_int, default=3,
                   help="runs per variant; the median and best decode rate are reported (3)")
    p.add_argument("--dtypes", default="fp32,bf16,int8",
                   help="comma list of fp32, bf16, int8 (default all three; bf16 is emulated, "
                        "and slow, on CPUs without bf16 instructions)")
    p.add_argument("--threads", type=bench_threads, default=None,
                   help="torch (and llama.cpp) threads (default: torch's choice; 1 is steadier "
                        "on a busy machine)")
    p.add_argument("--no-hf", action="store_true", help="skip the transformers reference")
    p.add_argument("--llama-cpp", action="store_true",
                   help="also run llama.cpp (pip install llama-cpp-python) on the same weights "
                        "written as GGUF: f32 against fp32, f16 against bf16, q8_0 against int8")
    p.add_argument("--plain", action="store_true",
                   help="skip optimize_for_decode (weight layout / bf16 packing)")
    p.add_argument("--recompute-tokens", type=non_negative_int, default=None,
                   help=f"new tokens for the cached vs full-recompute comparison (0 = skip; "
                        f"default {RECOMPUTE_TOKENS}, or what the context leaves after the "
                        "prompt)")
    p.add_argument("--batch", type=non_negative_int, default=8,
                   help="batch for batched throughput (default 8; 0 = skip)")
    add_json_argument(p)


def read_bandwidth(n_bytes: int = 512 * 2**20, reps: int = 5) -> float:
    """Best observed bytes/s of summing a float32 tensor far larger than the caches."""
    import torch

    x = torch.ones(n_bytes // 4)
    x.sum()
    best = min(_timed(x.sum) for _ in range(reps))
    return n_bytes / best


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _rates(stamps: list[float], t0: float, prompt_len: int) -> dict:
    """Prefill seconds and tokens/s (start -> first token) and decode tokens/s (first -> last
    token)."""
    prefill = stamps[0] - t0
    return {"prefill_s": prefill, "prefill_tok_s": prompt_len / prefill,
            "decode_tok_s": (len(stamps) - 1) / (stamps[-1] - stamps[0])}


def time_ours(model, prompt, n: int) -> tuple[dict, list[int]]:
    from scratchgpt.generation.generate import stream
    from scratchgpt.generation.sampling import SamplingConfig

    stamps, tokens = [], []
    t0 = time.perf_counter()
    for tok in stream(model, prompt, n, SamplingConfig(temperature=0)):
        stamps.append(time.perf_counter())
        tokens.append(int(tok[0]))
    return _rates(stamps, t0, prompt.size(1)), tokens


def time_hf(model, prompt, n: int) -> tuple[dict, list[int]]:
    import torch
    from transformers.generation.streamers import BaseStreamer

    stamps: list[float] = []

    class Clock(BaseStreamer):
        def put(self, value):  # first call: the prompt; then one call per new token
            stamps.append(time.perf_counter())

        def end(self):
            pass

    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                             max_new_tokens=n, min_new_tokens=n, pad_token_id=0,
                             use_cache=True, streamer=Clock())
    return _rates(stamps[1:], t0, prompt.size(1)), out[0, prompt.size(1):].tolist()


def time_llama_cpp(llm, prompt: list[int], n: int) -> tuple[dict, list[int]]:
    """Greedy decoding on llama.cpp: one ``eval`` for the prompt, then one per new token, the
    next token the argmax of the last position's logits (no end-of-text stop, as ours)."""
    import llama_cpp
    import numpy as np

    def last_logits():  # (vocab,) a view of llama.cpp's own buffer
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1),
                                     shape=(llm.n_vocab(),))

    stamps, tokens = [], []
    llm.reset()  # the next eval starts at position 0 (and drops the old KV cache entries)
    t0 = time.perf_counter()
    llm.eval(prompt)
    for i in range(n):
        tokens.append(int(last_logits().argmax()))
        stamps.append(time.perf_counter())
        if i < n - 1:
            llm.eval([tokens[-1]])
    return _rates(stamps, t0, len(prompt)), tokens


@contextmanager
def llama_cpp_model(base, gguf_type: str, n_ctx: int, threads: int) -> Iterator[tuple[Any, int]]:
    """``base`` (our fp32 GPT) written as a GGUF of ``gguf_type`` and loaded by llama.cpp:
    yields (llama_cpp.Llama, bytes a decode step reads); closed and deleted afterwards."""
    import llama_cpp

    from scratchgpt.checkpoints.gguf import save_gguf
    from scratchgpt.tokenizers import BPETokenizer

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"bench-{gguf_type}.gguf"
        # any tokenizer will do (prompts are ids): the 256 byte tokens; padded to the vocabulary
        save_gguf(base, path, BPETokenizer([], {}, backend="python"), gguf_type)
        llm = llama_cpp.Llama(str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx,
                              n_threads=threads, n_threads_batch=threads, verbose=False)
        try:
            yield llm, gguf_step_bytes(path)
        finally:
            llm.close()


def gguf_step_bytes(path: Path) -> int:
    """Bytes of a GGUF file's tensors that a decode step reads: all but the position table
    (one row is read) and, when the head is untied, the token embedding (one row)."""
    from gguf import GGUFReader

    sizes = {t.name: int(t.n_bytes) for t in GGUFReader(path).tensors}
    skip = {"position_embd.weight"} | ({"token_embd.weight"} if "output.weight" in sizes
                                       else set())
    return sum(n for name, n in sizes.items() if name not in skip)


def step_bytes(model) -> int:
    """Bytes a decode step of our GPT reads: every Linear (int8 weights with their scales, or
    the float weights) and LayerNorm; of the embedding tables only one row each, left out (a
    tied head is counted as the Linear it is)."""
    from torch import nn

    from scratchgpt.models.fast_decode import Int8Linear, PackedLinear

    total = 0
    for m in model.modules():
        if isinstance(m, Int8Linear | nn.Linear | nn.LayerNorm):
            total += sum(t.nbytes for t in (*m.parameters(recurse=False),
                                             *m.buffers(recurse=False)) if t is not None)
        elif isinstance(m, PackedLinear):
            total += m.in_features * m.out_features * m.dtype.itemsize
            total += 0 if m.bias is None else m.bias.nbytes
    return total


def recompute_vs_cache(model, prompt, n: int, points: int = 6) -> dict:
    """Time ``n`` cached greedy tokens; estimate the no-cache time from ``points`` timed full
    forward passes at evenly spaced lengths (trapezoid rule: running all n is too slow)."""
    import torch

    from scratchgpt.generation.generate import generate
    from scratchgpt.generation.sampling import SamplingConfig

    cached = _timed(lambda: generate(model, prompt, n, SamplingConfig(temperature=0)))
    T0 = prompt.size(1)
    lengths = [T0 + round(i * (n - 1) / (points - 1)) for i in range(points)]
    ids = torch.randint(0, model.config.vocab_size, (1, T0 + n))
    with torch.inference_mode():
        secs = [_timed(lambda L=L: model(ids[:, :L])) for L in lengths]
    full = sum((lengths[i + 1] - lengths[i]) * (secs[i] + secs[i + 1]) / 2
               for i in range(points - 1)) + secs[-1]
    return {"new_tokens": n, "cached_s": cached, "full_recompute_s_est": full,
            "speedup": full / cached, "timed_lengths": lengths}


def batched(model, vocab: int, prompt_len: int, n: int, batch: int) -> dict:
    """Throughput of ``generate_batch`` on ``batch`` prompts of varied lengths (left padding)."""
    import torch

    from scratchgpt.generation.generate import generate_batch
    from scratchgpt.generation.sampling import SamplingConfig

    g = torch.Generator().manual_seed(1)
    lengths = [prompt_len - (i * prompt_len) // (2 * batch) for i in range(batch)]
    prompts = [torch.randint(0, vocab, (L,), generator=g).tolist() for L in lengths]
    secs = _timed(lambda: generate_batch(model, prompts, n, SamplingConfig(temperature=0)))
    return {"batch": batch, "prompt_lengths": lengths, "new_tokens": n, "seconds": secs,
            "tok_s": batch * n / secs}


def int8_kernel_check(n: int, k: int, reps: int = 20) -> dict:
    """One batch-1 product with an (n, k) weight (the lm_head's shape) three ways: the int8
    kernel of :class:`Int8Linear`, fp32 ``F.linear``, and dequantize-then-matmul (what a
    fallback without an int8 kernel does every step). Best time of the repeats, in ms."""
    import torch
    import torch.nn.functional as F

    from scratchgpt.models import int8_kernel
    from scratchgpt.models.fast_decode import Int8Linear

    linear = torch.nn.Linear(k, n, bias=False)
    q, w, x = Int8Linear(linear), linear.weight.detach(), torch.randn(1, k)

    def best(fn, r: int) -> float:
        fn()
        return min(_timed(fn) for _ in range(r)) * 1e3

    with torch.inference_mode():
        return {"shape": [n, k], "kernel": int8_kernel.describe(),
                "int8_kernel_ms": best(lambda: q(x), reps),
                "fp32_ms": best(lambda: F.linear(x, w), reps),
                "dequantize_then_matmul_ms": best(lambda: F.linear(x, q.dequantized()),
                                                  max(2, reps // 10))}


# ---- the run


def parse_dtypes(text: str) -> list[str]:
    from scratchgpt.errors import ConfigError

    names = [d.strip() for d in text.split(",") if d.strip()]
    bad = [d for d in names if d not in DTYPES]
    if bad or not names:
        raise ConfigError(f"--dtypes: unknown {', '.join(bad) or '(none given)'}; choose from "
                          f"{', '.join(DTYPES)}")
    refuse_repeats("--dtypes", names)  # each was timed again, a row of the table each time
    return names


def check_context(args: argparse.Namespace) -> None:
    """The prompt and the tokens generated after it fit the model's context (transformers and
    the full-recompute timing cannot go past it); --recompute-tokens not given becomes its
    default, cut to what the context leaves."""
    from scratchgpt.errors import ConfigError

    if args.recompute_tokens is None:
        args.recompute_tokens = max(0, min(RECOMPUTE_TOKENS, args.block_size - args.prompt_len))

    for flag, n in (("--new-tokens", args.new_tokens), ("--recompute-tokens",
                                                        args.recompute_tokens)):
        if args.prompt_len + n > args.block_size:
            raise ConfigError(f"--prompt-len {args.prompt_len} + {flag} {n} exceed the "
                              f"context, --block-size {args.block_size}")


def check_llama_cpp(vocab_size: int) -> None:
    from scratchgpt.errors import ConfigError

    try:
        import gguf  # noqa: F401
        import llama_cpp  # noqa: F401
    except ImportError:
        raise ConfigError("--llama-cpp needs llama-cpp-python and gguf (pip install "
                          "'scratchgpt[gguf]'; llama-cpp-python compiles llama.cpp)") from None
    if vocab_size < 256:
        raise ConfigError("--llama-cpp needs --vocab-size >= 256 (the GGUF holds a byte-level "
                          "vocabulary)")


def hf_reference(base) -> Any:
    """``base`` exported with our ``save_hf`` and loaded by transformers (fp32)."""
    import transformers

    from scratchgpt.checkpoints.hf import save_hf

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as d:
        save_hf(base, d)
        return transformers.GPT2LMHeadModel.from_pretrained(d).eval()


def ours_for(base, cfg, name: str, plain: bool):
    """A copy of ``base`` in precision ``name``, prepared as ``sample --dtype`` prepares it."""
    from scratchgpt.models.fast_decode import prepare_for_decode, to_inference_dtype
    from scratchgpt.models.gpt import GPT

    model = GPT(cfg).eval()
    model.load_state_dict(base.state_dict())
    return to_inference_dtype(model, name) if plain else prepare_for_decode(model, name)


def _summary(runs: list[dict]) -> dict:
    rates = [r["decode_tok_s"] for r in runs]
    return {"decode_tok_s_median": statistics.median(rates), "decode_tok_s_best": max(rates),
            "prefill_s_median": statistics.median(r["prefill_s"] for r in runs),
            "prefill_tok_s_median": statistics.median(r["prefill_tok_s"] for r in runs)}


def _first_divergence(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)


def measure(model, hf, llm, prompt, args) -> tuple[dict, list[int]]:
    """Alternate ours / transformers / llama.cpp ``args.repeats`` times; their summaries and
    our greedy tokens."""
    runs: dict[str, list[dict]] = {who: [] for who in WHO}
    theirs: dict[str, list[int]] = {}
    ids = prompt[0].tolist()
    for _ in range(args.repeats):  # alternate, so drifting machine load hits all alike
        r, greedy = time_ours(model, prompt, args.new_tokens)
        runs["ours"].append(r)
        if hf is not None:
            r, theirs["transformers"] = time_hf(hf, prompt, args.new_tokens)
            runs["transformers"].append(r)
        if llm is not None:
            r, theirs["llama.cpp"] = time_llama_cpp(llm, ids, args.new_tokens)
            runs["llama.cpp"].append(r)
    v: dict[str, Any] = {who: _summary(rs) for who, rs in runs.items() if rs}
    for who, tokens in theirs.items():
        v[who]["greedy_first_divergence"] = _first_divergence(greedy, tokens)
        v[who]["speedup_of_ours"] = (v["ours"]["decode_tok_s_median"]
                                     / v[who]["decode_tok_s_median"])
    return v, greedy


def run(args: argparse.Namespace) -> int:
    import torch

    from scratchgpt.models import native
    from scratchgpt.models.fast_decode import packing_available
    from scratchgpt.models.gpt import GPT, GPTConfig

    dtypes = parse_dtypes(args.dtypes)
    check_context(args)
    if args.llama_cpp:
        check_llama_cpp(args.vocab_size)
    out = JsonOutput(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=args.vocab_size, block_size=args.block_size, n_layer=args.n_layer,
                    n_head=args.n_head, n_embd=args.n_embd)
    base = GPT(cfg).eval()
    prompt = torch.randint(0, cfg.vocab_size, (1, args.prompt_len))
    hf_base = None if args.no_hf else hf_reference(base)
    bandwidth = read_bandwidth()
    report: dict = {"threads": torch.get_num_threads(),
                    "shape": f"{cfg.n_layer}L/{cfg.n_head}H/{cfg.n_embd}d vocab {cfg.vocab_size}",
                    "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
                    "weights": "plain" if args.plain else "optimize_for_decode",
                    "bf16_hardware": packing_available(torch.bfloat16), "variants": {}}
    greedy: dict[str, list[int]] = {}
    models = {}
    n_ctx = args.prompt_len + args.new_tokens
    def show(measured: dict) -> None:  # on Ctrl-C: the table of the dtypes measured
        add_ceilings(measured, bandwidth)
        print(format_report({**measured, "read_bandwidth_gb_s": bandwidth / 1e9,
                             "decode_step": {name: native.describe(models[name])
                                             for name in measured["variants"]}}))

    with out.kept_on_interrupt(lambda: report if report["variants"] else None, show):
        for name in dtypes:  # on Ctrl-C, the dtypes measured are kept
            models[name] = ours_for(base, cfg, name, args.plain)
            hf = None
            if hf_base is not None and name != "int8":  # transformers has no int8 of this kind
                hf = hf_base.to(torch.float32 if name == "fp32" else torch.bfloat16)  # in place
            with (llama_cpp_model(base, GGUF_TYPE[name], n_ctx, torch.get_num_threads())
                  if args.llama_cpp else _nothing()) as (llm, llm_bytes):
                v, greedy[name] = measure(models[name], hf, llm, prompt, args)
            v["bytes_per_token"] = {"ours": step_bytes(models[name])}
            if llm_bytes:
                v["bytes_per_token"]["llama.cpp"] = llm_bytes
                v["llama.cpp"]["gguf_type"] = GGUF_TYPE[name]
            report["variants"][name] = v
            bandwidth = max(bandwidth, read_bandwidth())  # best seen: load on a shared box varies
    report["read_bandwidth_gb_s"] = bandwidth / 1e9
    report["decode_step"] = {name: native.describe(m) for name, m in models.items()}
    add_ceilings(report, bandwidth)
    report["accuracy_vs_fp32"] = accuracy(models, greedy, prompt)
    if "int8" in models:
        report["int8_kernel"] = int8_kernel_check(cfg.vocab_size, cfg.n_embd)
    fast = models.get("fp32") or next(iter(models.values()))
    if args.recompute_tokens:
        report["cache_vs_recompute"] = recompute_vs_cache(fast, prompt, args.recompute_tokens)
    if args.batch:
        one = report["variants"][next(iter(models))]
        report["batched"] = batched(fast, cfg.vocab_size, args.prompt_len, args.new_tokens,
                                    args.batch)
        report["batched"]["vs_batch1_decode"] = (report["batched"]["tok_s"]
                                                 / one["ours"]["decode_tok_s_median"])
    with out.printing():
        print(format_report(report))
    out.emit(report)
    return 0


@contextmanager
def _nothing() -> Iterator[tuple[None, None]]:
    yield None, None


def add_ceilings(report: dict, bandwidth: float) -> None:
    """Each runner's decode ceiling: the best read bandwidth / the bytes it reads per token."""
    for v in report["variants"].values():
        for who, n_bytes in v["bytes_per_token"].items():
            v[who]["ceiling_tok_s"] = bandwidth / n_bytes
            v[who]["of_ceiling"] = v[who]["decode_tok_s_median"] / v[who]["ceiling_tok_s"]


def accuracy(models: dict, greedy: dict[str, list[int]], prompt) -> dict:
    """What each precision costs against our fp32: logits on the prompt, greedy tokens."""
    import torch

    if "fp32" not in models:
        return {}
    out = {}
    with torch.inference_mode():
        ref = models["fp32"](prompt).float()
        for name, model in models.items():
            if name == "fp32":
                continue
            logits = model(prompt).float()
            out[name] = {"max_abs_logit_diff": (logits - ref).abs().max().item(),
                         "logit_std": ref.std().item(),
                         "argmax_agreement_on_prompt":
                             (logits.argmax(-1) == ref.argmax(-1)).float().mean().item(),
                         "greedy_first_divergence": _first_divergence(greedy["fp32"],
                                                                      greedy[name])}
    return out


def format_report(r: dict) -> str:
    lines = [f"model {r['shape']}, prompt {r['prompt_len']}, {r['new_tokens']} new tokens, "
             f"greedy, batch 1, {plural(r['threads'], 'thread')}, weights {r['weights']}",
             "our decode step: " + ", ".join(f"{name} {how}"
                                             for name, how in r["decode_step"].items()),
             f"read bandwidth (sum of 512 MiB, best of 5 at start and after each variant): "
             f"{r['read_bandwidth_gb_s']:.1f} GB/s",
             f"{'variant':8s} {'who':18s} {'decode tok/s':>12s} {'best':>7s} "
             f"{'prefill tok/s':>13s} {'ceiling':>8s} {'of ceil':>7s} {'ours/it':>7s} "
             f"{'greedy differs at':>17s}"]
    for name, v in r["variants"].items():
        for who in WHO:
            if who not in v:
                continue
            w = v[who]
            label = who + (f" {w['gguf_type']}" if "gguf_type" in w else "")
            ceiling = (f"{w['ceiling_tok_s']:8.1f} {w['of_ceiling']:7.1%}" if "ceiling_tok_s" in w
                       else f"{'':8s} {'':7s}")
            ratio = f"{w['speedup_of_ours']:6.2f}x" if "speedup_of_ours" in w else ""
            diverge = "" if who == "ours" else str(w["greedy_first_divergence"])
            lines.append(f"{name:8s} {label:18s} {w['decode_tok_s_median']:12.2f} "
                         f"{w['decode_tok_s_best']:7.2f} {w['prefill_tok_s_median']:13.1f} "
                         f"{ceiling} {ratio:>7s} {diverge:>17s}")
    lines += _notes(r)
    return "\n".join(lines)


def _notes(r: dict) -> list[str]:
    lines = ["(greedy differs at: the first of the new tokens where its greedy choice differs "
             "from ours; None = all equal)"]
    if "bf16" in r["variants"] and not r["bf16_hardware"]:
        lines.append("note: this CPU has no bf16 instructions: PyTorch emulates bf16 matmuls, so "
                     "our bf16 is slow here (llama.cpp's f16 converts in hardware)")
    for name, a in r.get("accuracy_vs_fp32", {}).items():  # (none for a run stopped part-way)
        lines.append(f"{name} vs fp32: max |logit diff| {a['max_abs_logit_diff']:.4f} (logit std "
                     f"{a['logit_std']:.3f}), prompt argmax agreement "
                     f"{a['argmax_agreement_on_prompt']:.1%}, greedy first diverges at token "
                     f"{a['greedy_first_divergence']}")
    if "int8_kernel" in r:
        k = r["int8_kernel"]
        lines.append(f"int8 kernel ({k['kernel']}), one token times a "
                     f"{k['shape'][0]}x{k['shape'][1]} weight: "
                     f"{k['int8_kernel_ms']:.2f} ms (fp32 {k['fp32_ms']:.2f} ms, dequantize "
                     f"then matmul {k['dequantize_then_matmul_ms']:.2f} ms)")
    if "cache_vs_recompute" in r:
        c = r["cache_vs_recompute"]
        lines.append(f"{c['new_tokens']} new tokens: KV cache {c['cached_s']:.1f} s, full "
                     f"recompute ~{c['full_recompute_s_est']:.0f} s (estimated from lengths "
                     f"{c['timed_lengths']}): {c['speedup']:.1f}x")
    if "batched" in r:
        b = r["batched"]
        lines.append(f"batch {b['batch']} (prompt lengths {b['prompt_lengths'][-1]}..."
                     f"{b['prompt_lengths'][0]}, left-padded): {b['tok_s']:.1f} tok/s including "
                     f"prefill, {b['vs_batch1_decode']:.1f}x batch-1 decode")
    return lines
