"""Speculative sampling speed and acceptance against target-only decoding, for several K.

For each K (a number, or ``auto``: chosen every round by ``policy.AutoK``) the benchmark
alternates, ``--repeats`` times and with the same seeds, a target-only run (``generate.stream``:
prefill, then one-token decode steps with the KV cache; the honest baseline) and a speculative
run, both generating ``--tokens`` tokens with the same sampling settings in the same process.
The drafter is a small model (``--draft DIR``) or prompt lookup (``--draft ngram``, which pays
off where the output repeats the input: ``--copy-task``). Instead of checkpoints,
``--random-target L,H,D`` and ``--random-draft L,H,D`` time randomly initialised GPTs of those
shapes (e.g. GPT-2 124M: 12,12,768 with the default vocabulary 50257 and context 1024).
Both models are prepared as ``sample`` prepares them: ``--dtype`` (the target) and
``--draft-dtype``, and with ``--compile`` the one-token steps of whichever can be compiled
(typically the small draft; the target's baseline too when it can be).

Reported per K:

* r, the acceptance rate: tokens decoded / positions scored (= tokens per round / (K + 1) when
  every round drafts K), as in Chen et al. (2023); the mean draft tokens accepted per round;
  for ``auto``, the K it picked (mean, most common);
* per-call times, measured from outside the decoder through its phase hook
  (``policy.PhaseTimer``): one draft token, one target scoring call (K + 1 positions, with the
  sampling and the accept/reject rule), and a target one-token decode step (the baseline's
  time per token after the first); and score / decode, the scoring call's cost in decode steps;
* the speedup in theory, r(K+1) t_decode / (K t_draft + t_decode) (the paper's cost model, which
  assumes scoring K+1 positions costs one decode step), the same with the measured scoring time
  in the denominator, both at the observed acceptance rate, and measured: baseline wall time /
  speculative wall time, summed over the repeats;
* quality: the target's own mean NLL per token on the speculative and on the target-only
  samples, which must agree within noise (the output distribution is the same).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from scratchgpt.bench import JsonOutput, add_json_argument, bench_threads, refuse_repeats
from scratchgpt.commands.argtypes import add_which_flag, new_tokens, positive_int, seed_int
from scratchgpt.errors import naming
from scratchgpt.validation import flag_of
from scratchgpt.wording import plural

# the shape and prompt of --random-target's models (GPT-2's vocabulary and context)
RANDOM_DEFAULTS = {"vocab_size": 50257, "block_size": 1024, "prompt_len": 64}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", default=None, help="target model: run directory or .pt")
    p.add_argument("--draft", default=None,
                   help="draft model (same tokenizer), or 'ngram' for prompt lookup")
    add_which_flag(p)
    p.add_argument("--random-target", default=None, metavar="L,H,D",
                   help="time a random GPT of n_layer,n_head,n_embd instead of --checkpoint "
                        "(GPT-2 124M: 12,12,768)")
    p.add_argument("--random-draft", default=None, metavar="L,H,D",
                   help="a random draft GPT of this shape (same vocabulary as the target)")
    p.add_argument("--vocab-size", type=positive_int, default=None,
                   help=f"random models' vocabulary (default {RANDOM_DEFAULTS['vocab_size']})")
    p.add_argument("--block-size", type=positive_int, default=None,
                   help=f"random models' context (default {RANDOM_DEFAULTS['block_size']})")
    p.add_argument("--prompt-len", type=positive_int, default=None,
                   help=f"random models' prompt tokens (default {RANDOM_DEFAULTS['prompt_len']}, "
                        "or --block-size where it is shorter)")
    p.add_argument("--k", default="1,2,3,4,5,6,7,8",
                   help="comma list of K (>= 1) and/or 'auto' (default 1,2,3,4,5,6,7,8)")
    p.add_argument("--tokens", type=new_tokens, default=200,
                   help="tokens generated per run (200)")
    p.add_argument("--repeats", type=positive_int, default=3, help="runs per K and method (3)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", default=None,
                     help="prompt text of checkpoints (default: as sample starts without one: "
                          "the end-of-text token, or for character models a newline, a space "
                          "if the vocabulary has no newline)")
    src.add_argument("--prompt-file", default=None,
                     help="read the prompt text of checkpoints from this file")
    p.add_argument("--copy-task", action="store_true",
                   help="the prompt is the text (of --prompt or --prompt-file), a blank line "
                        "(a space where the vocabulary has no newline), then its first third "
                        "again, so the continuation can copy the rest (where prompt lookup "
                        "shines)")
    p.add_argument("--temperature", type=float, default=0.8,
                   help="softmax temperature of target and draft (0.8; 0 = greedy)")
    p.add_argument("--top-k", type=int, default=None,
                   help="keep the k most likely tokens (0 or not given: all)")
    p.add_argument("--top-p", type=float, default=None,
                   help="nucleus mass in (0, 1] (default: no cut)")
    p.add_argument("--seed", type=seed_int, default=0,
                   help="first seed (default 0); every (K, repeat) pair gets its own, shared by "
                        "both methods")
    p.add_argument("--dtype", choices=("fp32", "bf16", "int8"), default="fp32",
                   help="the target's precision, prepared as sample prepares it (default fp32)")
    p.add_argument("--draft-dtype", choices=("fp32", "bf16", "int8"), default=None,
                   help="the draft model's precision (default: --dtype)")
    p.add_argument("--compile", action="store_true",
                   help="as sample --compile: compile the one-token steps of each model that "
                        "can be (a small fp32 GPT; the target's baseline too, when it can)")
    p.add_argument("--threads", type=bench_threads, default=None,
                   help="torch threads (default: torch's choice); both methods use the same")
    add_json_argument(p)


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


def _mean_se(xs: list[float]) -> tuple[float, float | None]:
    """The mean and its standard error (None from one run: no spread to measure)."""
    se = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else None
    return statistics.fmean(xs), se


def _pm(mean: float, se: float | None) -> str:
    """'2.415+-0.012', or the mean alone (as wide) when there is no standard error."""
    return f"{mean:6.3f}" + (f"+-{se:5.3f}" if se is not None else " " * 7)


def check_sources(args: argparse.Namespace) -> None:
    """Random models or checkpoints, not some of each: a flag of the other kind would be
    ignored."""
    from scratchgpt.errors import ConfigError

    if args.random_target and (args.checkpoint or args.prompt_file or args.prompt is not None
                               or args.draft not in (None, "ngram")):
        raise ConfigError("--random-target times random models: give it --random-draft (or "
                          "--draft ngram) and --prompt-len, not --checkpoint, a --draft model, "
                          "--prompt or --prompt-file")
    if args.random_draft and not args.random_target:
        raise ConfigError("--random-draft goes with --random-target")
    if args.random_draft and args.draft == "ngram":
        raise ConfigError("--random-draft and --draft ngram are two drafters; give one")
    shaped = [flag_of(k) for k in RANDOM_DEFAULTS if getattr(args, k) is not None]
    if shaped and not args.random_target:
        raise ConfigError(f"{', '.join(shaped)} shape random models (--random-target); a "
                          "checkpoint has its own, and its prompt is --prompt or --prompt-file")
    for k, value in RANDOM_DEFAULTS.items():
        if getattr(args, k) is None:  # a prompt as long as a short --block-size at most
            setattr(args, k, min(value, args.block_size) if k == "prompt_len" else value)


def parse_ks(text: str) -> list[int | str]:
    from scratchgpt.errors import ConfigError

    ks: list[int | str] = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        if item == "auto":
            ks.append(item)
        elif item.isdigit() and int(item) >= 1:
            ks.append(int(item))
        else:
            raise ConfigError(f"--k lists integers >= 1 and 'auto', got {item!r}")
    if not ks:
        raise ConfigError("--k is empty")
    refuse_repeats("--k", [str(k) for k in ks])  # each K was run again, a row each time
    return ks


def _shape(text: str) -> tuple[int, int, int]:
    from scratchgpt.errors import ConfigError

    try:
        n_layer, n_head, n_embd = (int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"a model shape is n_layer,n_head,n_embd, got {text!r}") from None
    return n_layer, n_head, n_embd


def prepare(model, dtype: str, args: argparse.Namespace):
    """``model`` as ``sample`` decodes it: ``dtype``, the decode layout, and with
    ``--compile`` its one-token steps compiled where it can be (warmed up now, so no run
    pays the compile)."""
    from scratchgpt.models.compiled import CompiledGPT, prepare_compiled
    from scratchgpt.models.fast_decode import prepare_for_decode

    if not args.compile:
        return prepare_for_decode(model, dtype)
    model = prepare_compiled(model, dtype, required=False)
    if isinstance(model, CompiledGPT):
        model.warm_up()
    return model


def prepare_pair(target, draft, args: argparse.Namespace) -> tuple[Any, Any]:
    """The target in ``--dtype`` and the draft model (if any) in ``--draft-dtype``."""
    if draft != "ngram":
        draft = prepare(draft, args.draft_dtype or args.dtype, args)
    return prepare(target, args.dtype, args), draft


def count_params(target, draft) -> dict[str, int]:
    """Parameters of the pair as trained (a packed or quantized model holds fewer)."""
    return {"target": target.num_params(), "draft": 0 if draft == "ngram" else draft.num_params()}


def _compiled(model) -> bool:
    from scratchgpt.models.compiled import CompiledGPT

    return isinstance(model, CompiledGPT)


@dataclass
class Setup:
    """The models, the prompt and a description of each, ready to time."""

    target: Any
    draft: Any  # a model, or "ngram"
    prompt: Any  # (1, T) token ids
    describe: dict[str, str] = field(default_factory=dict)
    params: dict[str, int] = field(default_factory=dict)  # counted before packing


def random_setup(args: argparse.Namespace) -> Setup:
    """Randomly initialised GPTs of the requested shapes and a random prompt."""
    import torch

    from scratchgpt import memory
    from scratchgpt.models.gpt import GPT, GPTConfig
    from scratchgpt.validation import check_range

    def gpt(shape: str, seed: int) -> GPT:
        n_layer, n_head, n_embd = _shape(shape)
        config = GPTConfig(vocab_size=args.vocab_size, block_size=args.block_size,
                           n_layer=n_layer, n_head=n_head, n_embd=n_embd)
        memory.check_fits(memory.inference_estimate(config, 1), f"a random GPT {shape}")
        torch.manual_seed(seed)
        return GPT(config).eval()

    check_range("--prompt-len", args.prompt_len, 1, args.block_size)

    target = gpt(args.random_target, 0)
    draft = "ngram" if args.draft == "ngram" else gpt(args.random_draft or "2,4,128", 1)
    params = count_params(target, draft)
    target, draft = prepare_pair(target, draft, args)
    g = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, args.vocab_size, (args.prompt_len,), generator=g).tolist()
    if args.copy_task:
        ids = ids + ids[: max(1, len(ids) // 3)]
    return Setup(target, draft, torch.tensor([ids]),
                 {"target": f"random GPT {args.random_target}",
                  "draft": "ngram" if draft == "ngram" else f"random GPT "
                                                             f"{args.random_draft or '2,4,128'}"},
                 params)


def checkpoint_setup(args: argparse.Namespace) -> Setup:
    """The target (and draft) checkpoints, the prompt text encoded with their tokenizer."""
    import torch

    from scratchgpt.checkpoints import checkpoint_tokenizer
    from scratchgpt.checkpoints.io import load_language_model
    from scratchgpt.commands.prompts import read_prompt
    from scratchgpt.errors import ConfigError
    from scratchgpt.generation.speculative import check_pair

    if args.checkpoint is None or args.draft is None:
        raise ConfigError("give --checkpoint and --draft (a model or 'ngram'), or "
                          "--random-target")
    text = read_prompt(args)  # one-line errors for a file that is missing or not UTF-8
    if text is None and args.copy_task:  # a copy of the default start is nothing to look up
        raise ConfigError("--copy-task repeats the prompt's text: give --prompt or --prompt-file")
    target, tstate = load_language_model(args.checkpoint, args.which, "bench speculative")
    tok = checkpoint_tokenizer(tstate)
    draft = "ngram"
    if args.draft != "ngram":
        with naming("--draft"):  # (two checkpoints on the line: say which is refused)
            draft, dstate = load_language_model(args.draft, args.which, "bench speculative")
        check_pair(target, draft, tok, checkpoint_tokenizer(dstate))
    params = count_params(target, draft)
    target, draft = prepare_pair(target, draft, args)
    return Setup(target, draft, torch.tensor([prompt_ids(tok, text, args.copy_task)]),
                 {"target": str(tstate.path), "draft": "ngram" if draft == "ngram"
                  else str(dstate.path)}, params)


def prompt_ids(tok: Any, text: str | None, copy_task: bool) -> list[int]:
    """The prompt's tokens: ``text`` (with ``copy_task``: a blank line and its first third
    after it; a vocabulary without newlines: a space, else nothing, between them), or without
    one where ``sample`` starts (``prompt.start_of_text``), which every vocabulary encodes."""
    from scratchgpt.generation.prompt import start_of_text

    if text is None:
        return start_of_text(tok)[0]
    if copy_task:
        gap = next(g for g in ("\n\n", " ", "") if not tok.unknown_count(g))
        text = text + gap + text[: max(1, len(text) // 3)]
    return tok.encode(text)


class Runner:
    """Times target-only and speculative runs of one setup."""

    def __init__(self, setup: Setup, args: argparse.Namespace):
        from scratchgpt.generation.sampling import SamplingConfig

        self.s, self.args = setup, args
        self.cfg = SamplingConfig(args.temperature, args.top_k, args.top_p)

    def baseline(self, seed: int) -> tuple[list[int], float, float]:
        """(tokens, wall seconds, seconds per decode step after the first token)."""
        import torch

        from scratchgpt.generation.generate import stream

        gen = torch.Generator().manual_seed(seed)
        stamps, out = [], []
        t0 = time.perf_counter()
        for tok in stream(self.s.target, self.s.prompt, self.args.tokens, self.cfg, gen):
            stamps.append(time.perf_counter())
            out.append(int(tok[0]))
        step = (stamps[-1] - stamps[0]) / max(len(stamps) - 1, 1)
        return out, stamps[-1] - t0, step

    def speculative(self, seed: int, k: int | str):
        """(tokens, wall seconds, decoder, timer) of one speculative run."""
        import torch

        from scratchgpt.generation.drafters import NgramDrafter
        from scratchgpt.generation.policy import AutoK, PhaseTimer
        from scratchgpt.generation.speculative import SpeculativeDecoder

        gen = torch.Generator().manual_seed(seed)
        timer = PhaseTimer()
        draft = NgramDrafter() if self.s.draft == "ngram" else self.s.draft
        policy = AutoK() if k == "auto" else k
        t0 = time.perf_counter()
        dec = SpeculativeDecoder(self.s.target, draft, self.s.prompt, policy, self.cfg, gen,
                                 timer=timer)
        out = list(dec.stream(self.args.tokens))
        return out, time.perf_counter() - t0, dec, timer

    def measure(self, ki: int, k: int | str) -> dict[str, Any]:
        """One row of the report: ``--repeats`` alternating runs of both methods."""
        base_s = spec_s = 0.0
        steps, base_nll, spec_nll, decs, timers = [], [], [], [], []
        for i in range(self.args.repeats):
            seed = self.args.seed + ki * self.args.repeats + i  # fresh samples for every run
            order = ("base", "spec") if i % 2 == 0 else ("spec", "base")  # cancel slow drift
            for which in order:
                if which == "base":
                    out, dt, step = self.baseline(seed)
                    base_s, steps = base_s + dt, steps + [step]
                    base_nll.append(target_nll(self.s.target, self.s.prompt, out))
                else:
                    out, dt, dec, timer = self.speculative(seed, k)
                    spec_s += dt
                    decs.append(dec)
                    timers.append(timer)
                    spec_nll.append(target_nll(self.s.target, self.s.prompt, out))
        return summarize(k, decs, timers, statistics.median(steps), base_s, spec_s, base_nll,
                         spec_nll)


def summarize(k, decs, timers, t_decode: float, base_s: float, spec_s: float,
              base_nll: list[float], spec_nll: list[float]) -> dict[str, Any]:
    """The figures of one K from its runs (see the module doc)."""
    rounds = sum(d.stats.rounds for d in decs)
    emitted = sum(d.stats.emitted for d in decs)
    drafted = sum(sum(d.stats.drafted) for d in decs)
    total = {name: sum(t.total[name] for t in timers) for name in ("draft", "score")}
    t_draft = total["draft"] / max(drafted, 1)
    t_score = total["score"] / max(rounds, 1)
    k_mean = drafted / max(rounds, 1)  # drafts per round actually proposed
    per_round = emitted / max(rounds, 1)
    row = {"k": k, "acceptance_rate": emitted / max(rounds + drafted, 1),
           "mean_accepted": sum(sum(d.stats.accepted) for d in decs) / max(rounds, 1),
           "mean_drafted": k_mean, "tokens_per_round": per_round,
           "t_draft_ms": t_draft * 1e3, "t_target_score_ms": t_score * 1e3,
           "t_target_decode_ms": t_decode * 1e3, "score_over_decode": t_score / t_decode,
           "speedup_theory_paper": per_round * t_decode / (k_mean * t_draft + t_decode),
           "speedup_theory_measured_costs": per_round * t_decode / (k_mean * t_draft + t_score),
           "baseline_s": base_s, "speculative_s": spec_s, "speedup_measured": base_s / spec_s,
           "nll_target_only": _mean_se(base_nll), "nll_speculative": _mean_se(spec_nll)}
    if k == "auto":
        picked = Counter(j for d in decs for j in d.policy.history)
        row["k_picked"] = {"mean": sum(j * c for j, c in picked.items()) / picked.total(),
                           "most_common": picked.most_common(1)[0][0],
                           "counts": dict(sorted(picked.items()))}
    return row


def run(args: argparse.Namespace) -> int:
    import torch


    ks = parse_ks(args.k)
    check_sources(args)
    out = JsonOutput(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    setup = random_setup(args) if args.random_target else checkpoint_setup(args)
    runner = Runner(setup, args)
    runner.baseline(args.seed)  # warm-up: first calls allocate and pick kernels
    runner.speculative(args.seed, ks[0])
    rows: list[dict[str, Any]] = []
    report = {"threads": torch.get_num_threads(), "tokens": args.tokens,
              "repeats": args.repeats, "prompt_tokens": setup.prompt.size(1),
              "sampling": {"temperature": args.temperature, "top_k": args.top_k,
                           "top_p": args.top_p},
              **setup.describe, "target_params": setup.params["target"],
              "draft_params": setup.params["draft"],
              "dtype": args.dtype, "draft_dtype": args.draft_dtype or args.dtype,
              "compiled": [name for name, m in (("target", setup.target),
                                                ("draft", setup.draft)) if _compiled(m)],
              "results": rows}
    with out.kept_on_interrupt(lambda: report if rows else None, print_report):
        for ki, k in enumerate(ks):  # on Ctrl-C, the rows of the K measured are kept
            rows.append(runner.measure(ki, k))
    with out.printing():
        print_report(report)
    out.emit(report)
    return 0


def _off(setting: str, value: float | None) -> bool:
    """Whether a sampling setting is off: not given, or the value that means off to
    ``SamplingConfig`` (top-k 0 keeps every token, top-p 1 the whole mass)."""
    return value is None or {"top_k": value == 0, "top_p": value == 1.0}.get(setting, False)


def print_report(r: dict[str, Any]) -> None:
    draft_size = f"{r['draft_params'] / 1e6:.2f}M" if r["draft_params"] else "no weights"
    sampling = ", ".join(f"{k.replace('_', '-')} {'off' if _off(k, v) else v}"
                         for k, v in r["sampling"].items())
    print(f"target {r['target']} ({r['target_params'] / 1e6:.2f}M params), draft {r['draft']} "
          f"({draft_size}); prompt {r['prompt_tokens']} tokens, "
          f"{r['tokens']} tokens x {plural(r['repeats'], 'run')} per K and method; sampling: "
          f"{sampling}; {plural(r['threads'], 'thread')}; target {r['dtype']}, draft "
          f"{r['draft_dtype']}; compiled steps: {', '.join(r['compiled']) or 'none'}")
    print(f"{'K':>4s} {'r':>5s} {'acc/rnd':>7s} {'draft ms':>8s} {'score ms':>8s} "
          f"{'decode ms':>9s} {'scr/dec':>7s} {'theory':>6s} {'theory*':>7s} {'measured':>8s} "
          f"{'NLL spec':>13s} {'NLL target':>13s}")
    for row in r["results"]:
        (ns, ns_se), (nb, nb_se) = row["nll_speculative"], row["nll_target_only"]
        print(f"{row['k']!s:>4s} {row['acceptance_rate']:5.2f} {row['mean_accepted']:7.2f} "
              f"{row['t_draft_ms']:8.3f} {row['t_target_score_ms']:8.3f} "
              f"{row['t_target_decode_ms']:9.3f} {row['score_over_decode']:6.2f}x "
              f"{row['speedup_theory_paper']:5.2f}x {row['speedup_theory_measured_costs']:6.2f}x "
              f"{row['speedup_measured']:7.2f}x {_pm(ns, ns_se)} {_pm(nb, nb_se)}")
        if "k_picked" in row:
            p = row["k_picked"]
            print(f"     auto picked K: mean {p['mean']:.2f}, most often {p['most_common']} "
                  f"(rounds per K: {p['counts']})")
    print("r = tokens decoded / positions scored; theory = r(K+1) t_decode / (K t_draft + "
          "t_decode); theory* uses the measured scoring time in the denominator (K = drafts "
          "per round actually proposed); measured = target-only wall time / speculative wall "
          "time; scr/dec = one scoring call in one-token decode steps")
