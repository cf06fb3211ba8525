"""Speculative sampling speed and acceptance against target-only decoding, for several K.

For each K the benchmark alternates, ``--repeats`` times and with the same seeds, a target-only
run (``generate.stream``: prefill, then one-token decode steps with the KV cache; the honest
baseline) and a speculative run with ``--draft``, both generating ``--tokens`` tokens with the
same sampling settings in the same process. It reports:

* r, the acceptance rate: tokens decoded per round / (K + 1), as in Chen et al. (2023);
* the mean number of draft tokens accepted per round;
* per-call times: a draft decode step, a target scoring call (K + 1 positions), and a target
  one-token decode step (baseline time per token);
* the theoretical speedup r(K+1) t_target / (K t_draft + t_target) with t_target = the one-token
  decode time (the paper's cost model, which assumes scoring K+1 positions costs one decode
  step), and the same with the measured scoring time in the denominator;
* the measured speedup: baseline wall time / speculative wall time, summed over the repeats;
* quality: the target's own mean NLL per token (perplexity) on the speculative samples and on
  the target-only samples, which must agree within noise (the output distribution is the same).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="target model: run directory or .pt")
    p.add_argument("--draft", required=True, help="draft model (same tokenizer)")
    p.add_argument("--which", choices=("best", "last"), default="best")
    p.add_argument("--k", default="1,2,3,4,5,6,7,8", help="comma list of K (1..8)")
    p.add_argument("--tokens", type=int, default=200, help="tokens generated per run (200)")
    p.add_argument("--repeats", type=int, default=3, help="runs per K and method (3)")
    p.add_argument("--prompt", default="\n", help="prompt text (default: a newline)")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0,
                   help="first seed; every (K, repeat) pair gets its own, shared by both methods")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: torch's choice); both methods use the same")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def target_nll(model, prompt, tokens: list[int]) -> float:
    """Mean negative log-likelihood (nats/token) of ``tokens`` after ``prompt`` under the model's
    raw distribution (temperature 1). Only the last context's worth of tokens is scored."""
    import torch

    seq = torch.tensor([prompt[0].tolist() + tokens])
    seq = seq[:, -model.config.block_size - 1:]
    n = min(len(tokens), seq.size(1) - 1)
    with torch.no_grad():
        logp = torch.log_softmax(model(seq[:, :-1]).float(), dim=-1)[0, -n:]  # (n, V)
    return -logp.gather(1, seq[0, -n:, None]).mean().item()


def _mean_se(xs: list[float]) -> tuple[float, float]:
    se = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else float("nan")
    return statistics.fmean(xs), se


def run(args: argparse.Namespace) -> int:
    import torch

    from scratchgpt.checkpoints import checkpoint_tokenizer, load_model
    from scratchgpt.errors import ConfigError
    from scratchgpt.generation.generate import stream
    from scratchgpt.generation.sampling import SamplingConfig
    from scratchgpt.generation.speculative import SpeculativeStats, check_pair, speculative_stream

    ks = [int(k) for k in args.k.split(",") if k.strip()]
    if not ks or min(ks) < 1:
        raise ConfigError(f"--k must list integers >= 1, got {args.k!r}")
    if args.tokens < 1 or args.repeats < 1:
        raise ConfigError("--tokens and --repeats must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = SamplingConfig(args.temperature, args.top_k, args.top_p)
    target, tstate = load_model(args.checkpoint, args.which)
    draft, dstate = load_model(args.draft, args.which)
    tok = checkpoint_tokenizer(tstate)
    check_pair(target, draft, tok, checkpoint_tokenizer(dstate))
    prompt = torch.tensor([tok.encode(args.prompt)], dtype=torch.long)

    def baseline(seed: int) -> tuple[list[int], float]:
        gen = torch.Generator().manual_seed(seed)
        t0 = time.perf_counter()
        out = [int(t) for t in stream(target, prompt, args.tokens, cfg, gen)]
        return out, time.perf_counter() - t0

    def speculative(seed: int, k: int) -> tuple[list[int], float, SpeculativeStats]:
        gen = torch.Generator().manual_seed(seed)
        stats = SpeculativeStats(k)
        t0 = time.perf_counter()
        out = [int(t) for t in speculative_stream(target, draft, prompt, args.tokens, k, cfg,
                                                  gen, stats)]
        return out, time.perf_counter() - t0, stats

    baseline(args.seed)  # warm-up: first calls allocate and pick kernels
    speculative(args.seed, ks[0])
    rows = []
    all_base_nll, all_spec_nll = [], []
    for ki, k in enumerate(ks):
        base_s = spec_s = 0.0
        base_nll, spec_nll, runs = [], [], []
        for i in range(args.repeats):
            seed = args.seed + ki * args.repeats + i  # fresh samples for every run
            order = ("base", "spec") if i % 2 == 0 else ("spec", "base")  # cancel slow drift
            for which in order:
                if which == "base":
                    out, dt = baseline(seed)
                    base_s += dt
                    base_nll.append(target_nll(target, prompt, out))
                else:
                    out, dt, st = speculative(seed, k)
                    spec_s += dt
                    runs.append(st)
                    spec_nll.append(target_nll(target, prompt, out))
        rounds = sum(s.rounds for s in runs)
        emitted = sum(s.emitted for s in runs)
        t_draft = sum(s.draft_time_s for s in runs) / sum(s.draft_forwards for s in runs)
        t_score = sum(s.target_time_s for s in runs) / sum(s.target_forwards for s in runs)
        t_decode = base_s / (args.tokens * args.repeats)  # per token, prefill included
        r = emitted / rounds / (k + 1)
        all_base_nll += base_nll
        all_spec_nll += spec_nll
        rows.append({
            "k": k, "acceptance_rate": r,
            "mean_accepted": sum(sum(s.accepted) for s in runs) / rounds,
            "t_draft_ms": t_draft * 1e3, "t_target_score_ms": t_score * 1e3,
            "t_target_decode_ms": t_decode * 1e3,
            "speedup_theory_paper": r * (k + 1) * t_decode / (k * t_draft + t_decode),
            "speedup_theory_measured_costs": r * (k + 1) * t_decode / (k * t_draft + t_score),
            "baseline_s": base_s, "speculative_s": spec_s, "speedup_measured": base_s / spec_s,
            "nll_target_only": _mean_se(base_nll), "nll_speculative": _mean_se(spec_nll),
        })
    report = {"threads": torch.get_num_threads(), "tokens": args.tokens,
              "repeats": args.repeats, "sampling": vars(cfg) if hasattr(cfg, "__dict__") else {},
              "target": str(tstate.path), "draft": str(dstate.path),
              "target_params": target.num_params(), "draft_params": draft.num_params(),
              "nll_target_only": _mean_se(all_base_nll),
              "nll_speculative": _mean_se(all_spec_nll), "results": rows}
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"target {tstate.path} ({target.num_params() / 1e6:.2f}M params), draft "
          f"{dstate.path} ({draft.num_params() / 1e6:.2f}M); {args.tokens} tokens x "
          f"{args.repeats} runs per K and method; temperature {cfg.temperature}, top-k "
          f"{cfg.top_k}, top-p {cfg.top_p}; {report['threads']} threads")
    print(f"{'K':>2s} {'r':>5s} {'acc/rnd':>7s} {'draft ms':>8s} {'score ms':>8s} "
          f"{'decode ms':>9s} {'theory':>6s} {'theory*':>7s} {'measured':>8s} "
          f"{'NLL spec':>13s} {'NLL target':>13s}")
    for row in rows:
        (ns, ns_se), (nb, nb_se) = row["nll_speculative"], row["nll_target_only"]
        print(f"{row['k']:2d} {row['acceptance_rate']:5.2f} {row['mean_accepted']:7.2f} "
              f"{row['t_draft_ms']:8.2f} {row['t_target_score_ms']:8.2f} "
              f"{row['t_target_decode_ms']:9.2f} {row['speedup_theory_paper']:5.2f}x "
              f"{row['speedup_theory_measured_costs']:6.2f}x {row['speedup_measured']:7.2f}x "
              f"{ns:6.3f}+-{ns_se:5.3f} {nb:6.3f}+-{nb_se:5.3f}")
    (ns, ns_se), (nb, nb_se) = report["nll_speculative"], report["nll_target_only"]
    print(f"target NLL (nats/token) over all runs: speculative {ns:.3f} +- {ns_se:.3f} "
          f"(ppl {math.exp(ns):.2f}), target-only {nb:.3f} +- {nb_se:.3f} (ppl {math.exp(nb):.2f})")
    print("r = tokens per round / (K+1); theory = r(K+1) t_decode / (K t_draft + t_decode); "
          "theory* uses the measured scoring time in the denominator; measured = target-only "
          "wall time / speculative wall time")
    return 0
