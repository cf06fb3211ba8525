"""Generation speed: decode tokens/s against transformers and the memory-bandwidth ceiling.

Default shape = GPT-2 124M (12 layers, 12 heads, 768 dims, vocabulary 50257, context 1024) with
random weights, a 64-token prompt, 256 new tokens, greedy, batch 1. The same weights go to
``transformers.GPT2LMHeadModel`` through our exporter, and both run in this process, alternating,
in fp32 and bf16. Both are timed the same way: the wall-clock time of each new token as it is
emitted (our ``stream``; a ``streamer`` on transformers' ``generate``, KV cache on), so prefill
(prompt -> first token) and decode (every later token) are separated.

Also reported: the decode ceiling (weight bytes per token / measured read bandwidth), cached vs
full-recompute time for 512 new tokens, batched throughput, and bf16's accuracy cost (max logit
difference on the prompt, and where greedy output first diverges from fp32).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n-layer", type=int, default=12)
    p.add_argument("--n-head", type=int, default=12)
    p.add_argument("--n-embd", type=int, default=768)
    p.add_argument("--vocab-size", type=int, default=50257)
    p.add_argument("--block-size", type=int, default=1024)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3,
                   help="runs per variant; the median and best decode rate are reported (3)")
    p.add_argument("--dtypes", default="fp32,bf16", help="comma list of fp32, bf16")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: torch's choice; 1 is steadier on a busy machine)")
    p.add_argument("--no-hf", action="store_true", help="skip the transformers reference")
    p.add_argument("--plain", action="store_true",
                   help="skip optimize_for_decode (weight layout / bf16 packing)")
    p.add_argument("--recompute-tokens", type=int, default=512,
                   help="new tokens for the cached vs full-recompute comparison (0 = skip)")
    p.add_argument("--batch", type=int, default=8, help="batch for batched throughput (0 = skip)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


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


def _rates(stamps: list[float], t0: float) -> dict:
    """Prefill seconds (start -> first token) and decode tokens/s (first -> last token)."""
    return {"prefill_s": stamps[0] - t0,
            "decode_tok_s": (len(stamps) - 1) / (stamps[-1] - stamps[0])}


def time_ours(model, prompt, n: int) -> tuple[dict, list[int]]:
    from scratchgpt.generation.generate import stream
    from scratchgpt.generation.sampling import SamplingConfig

    stamps, tokens = [], []
    t0 = time.perf_counter()
    for tok in stream(model, prompt, n, SamplingConfig(temperature=0)):
        stamps.append(time.perf_counter())
        tokens.append(int(tok[0]))
    return _rates(stamps, t0), tokens


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
    return _rates(stamps[1:], t0), out[0, prompt.size(1):].tolist()


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


def load_hf_copy(base):
    """The same weights as ``transformers.GPT2LMHeadModel``, through our exporter."""
    import transformers

    from scratchgpt.checkpoints.hf import save_hf

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as d:
        save_hf(base, d)
        return transformers.GPT2LMHeadModel.from_pretrained(d).eval()


def time_variant(model, hf, prompt, args: argparse.Namespace) -> tuple[dict, list[int]]:
    """Decode rates of ours (and transformers') over ``--repeats`` alternating runs; returns the
    figures and our greedy tokens."""
    runs: dict[str, list] = {"ours": [], "transformers": [], "same_tokens": []}
    for _ in range(args.repeats):  # alternate, so drifting machine load hits both alike
        r, greedy = time_ours(model, prompt, args.new_tokens)
        runs["ours"].append(r)
        if hf is not None:
            r, theirs = time_hf(hf, prompt, args.new_tokens)
            runs["transformers"].append(r)
            runs["same_tokens"].append(theirs == greedy)
    v: dict = {}
    for who in ("ours", "transformers"):
        if runs[who]:
            rates = [r["decode_tok_s"] for r in runs[who]]
            v[who] = {"decode_tok_s_median": statistics.median(rates),
                      "decode_tok_s_best": max(rates),
                      "prefill_s_median": statistics.median(r["prefill_s"] for r in runs[who])}
    if runs["transformers"]:
        v["speedup_median"] = (v["ours"]["decode_tok_s_median"]
                               / v["transformers"]["decode_tok_s_median"])
        v["same_greedy_tokens_as_transformers"] = all(runs["same_tokens"])
    return v, greedy


def bf16_accuracy(models: dict, prompt, greedy: dict[str, list[int]]) -> dict:
    """How far bf16's logits move from fp32's, and where greedy output first diverges."""
    import torch

    with torch.inference_mode():
        a = models["fp32"](prompt).float()
        b = models["bf16"](prompt).float()
    diverge = next((i for i, (x, y) in enumerate(zip(greedy["fp32"], greedy["bf16"],
                                                         strict=True)) if x != y), None)
    return {"max_abs_logit_diff": (a - b).abs().max().item(), "logit_std": a.std().item(),
            "argmax_agreement_on_prompt": (a.argmax(-1) == b.argmax(-1)).float().mean().item(),
            "greedy_first_divergence": diverge}


def run(args: argparse.Namespace) -> int:
    import torch

    from scratchgpt.models.fast_decode import optimize_for_decode
    from scratchgpt.models.gpt import GPT, GPTConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=args.vocab_size, block_size=args.block_size, n_layer=args.n_layer,
                    n_head=args.n_head, n_embd=args.n_embd)
    base = GPT(cfg).eval()
    prompt = torch.randint(0, cfg.vocab_size, (1, args.prompt_len))
    hf_base = None if args.no_hf else load_hf_copy(base)
    bandwidth = read_bandwidth()
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}
    report: dict = {"threads": torch.get_num_threads(),
                    "shape": f"{cfg.n_layer}L/{cfg.n_head}H/{cfg.n_embd}d vocab {cfg.vocab_size}",
                    "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
                    "weights": "plain" if args.plain else "optimize_for_decode",
                    "variants": {}}
    greedy: dict[str, list[int]] = {}
    models = {}
    for name in (d.strip() for d in args.dtypes.split(",")):
        model = GPT(cfg).eval()
        model.load_state_dict(base.state_dict())
        model.to(torch_dtype[name])
        models[name] = model if args.plain else optimize_for_decode(model)
        hf = hf_base.to(torch_dtype[name]) if hf_base is not None else None  # in place
        v, greedy[name] = time_variant(models[name], hf, prompt, args)
        # bytes each decode step must read: every weight once (wte as the tied lm_head; of the
        # position table only one row, so it is left out, as num_params does)
        v["weight_bytes"] = base.num_params(non_embedding=True) * torch_dtype[name].itemsize
        bandwidth = max(bandwidth, read_bandwidth())  # best seen: load on a shared box varies
        report["variants"][name] = v
    report["read_bandwidth_gb_s"] = bandwidth / 1e9
    for v in report["variants"].values():  # ceilings against the best bandwidth measured
        v["ceiling_tok_s"] = bandwidth / v["weight_bytes"]
        v["ours"]["of_ceiling"] = v["ours"]["decode_tok_s_median"] / v["ceiling_tok_s"]
    if "fp32" in models and "bf16" in models:
        report["bf16_accuracy"] = bf16_accuracy(models, prompt, greedy)
    fast = models.get("fp32") or next(iter(models.values()))
    if args.recompute_tokens:
        report["cache_vs_recompute"] = recompute_vs_cache(fast, prompt, args.recompute_tokens)
    if args.batch:
        one = report["variants"].get("fp32", next(iter(report["variants"].values())))
        report["batched"] = batched(fast, cfg.vocab_size, args.prompt_len, args.new_tokens,
                                    args.batch)
        report["batched"]["vs_batch1_decode"] = (report["batched"]["tok_s"]
                                                 / one["ours"]["decode_tok_s_median"])
    if args.json:
        print(json.dumps(report))
        return 0
    print_report(report)
    return 0


def print_report(r: dict) -> None:
    print(f"model {r['shape']}, prompt {r['prompt_len']}, {r['new_tokens']} new tokens, greedy, "
          f"batch 1, {r['threads']} threads, weights {r['weights']}")
    print(f"read bandwidth (sum of 512 MiB, best of 5 at start and after each variant): "
          f"{r['read_bandwidth_gb_s']:.1f} GB/s")
    print(f"{'variant':8s} {'who':13s} {'decode tok/s':>12s} {'best':>6s} {'prefill s':>9s} "
          f"{'ceiling':>8s} {'of ceil':>7s} {'vs HF':>6s}")
    for name, v in r["variants"].items():
        for who in ("ours", "transformers"):
            if who not in v:
                continue
            w = v[who]
            mine = who == "ours" and "speedup_median" in v
            ratio = f"{v['speedup_median']:5.2f}x" if mine else ""
            print(f"{name:8s} {who:13s} {w['decode_tok_s_median']:12.2f} "
                  f"{w['decode_tok_s_best']:6.2f} {w['prefill_s_median']:9.3f} "
                  f"{v['ceiling_tok_s']:8.1f} "
                  f"{w['decode_tok_s_median'] / v['ceiling_tok_s']:7.1%} {ratio:>6s}")
        if "same_greedy_tokens_as_transformers" in v:
            print(f"{'':8s} greedy tokens identical to transformers: "
                  f"{v['same_greedy_tokens_as_transformers']}")
    if "bf16_accuracy" in r:
        a = r["bf16_accuracy"]
        print(f"bf16 vs fp32: max |logit diff| {a['max_abs_logit_diff']:.4f} (logit std "
              f"{a['logit_std']:.3f}), prompt argmax agreement "
              f"{a['argmax_agreement_on_prompt']:.1%}, greedy first diverges at token "
              f"{a['greedy_first_divergence']}")
    if "cache_vs_recompute" in r:
        c = r["cache_vs_recompute"]
        print(f"{c['new_tokens']} new tokens: KV cache {c['cached_s']:.1f} s, full recompute "
              f"~{c['full_recompute_s_est']:.0f} s (estimated from lengths "
              f"{c['timed_lengths']}): {c['speedup']:.1f}x")
    if "batched" in r:
        b = r["batched"]
        print(f"batch {b['batch']} (prompt lengths {b['prompt_lengths'][-1]}..."
              f"{b['prompt_lengths'][0]}, left-padded): {b['tok_s']:.1f} tok/s including "
              f"prefill, {b['vs_batch1_decode']:.1f}x batch-1 decode")
