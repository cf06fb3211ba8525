"""``scratchgpt seq2seq``: train, run and inspect encoder-decoder models (translation-style tasks).

  train      train a Transformer / attention LSTM / plain LSTM on a generated task or a TSV file
  translate  decode sources with a trained checkpoint (greedy or beam search)
  eval       exact match on the held-out pairs, by source length
  attention  plot the cross-attention of one translation as a heatmap (source x target)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from scratchgpt.commands.argtypes import duration, positive_int
from scratchgpt.errors import CheckpointError, ConfigError

ARCHS = ("transformer", "lstm-attention", "lstm")
TASK_NAMES = ("dates", "numbers", "reverse")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "seq2seq", help="encoder-decoder models: train, translate, eval, attention plots",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    t = actions.add_parser(
        "train", help="train a model and save a checkpoint directory",
        description="Train an encoder-decoder on (source, target) pairs, report held-out exact "
                    "match and save the model, its config and both tokenizers into --out.")
    src = t.add_mutually_exclusive_group()
    src.add_argument("--task", choices=TASK_NAMES,
                     help="generated task: 'dates' (dates written many ways -> ISO, default) or "
                          "'numbers' (number words -> digits) or 'reverse' (10-60 letters -> "
                          "reversed, where the no-attention bottleneck shows)")
    src.add_argument("--data", metavar="FILE.tsv",
                     help="your own pairs, one 'source<TAB>target' per line (UTF-8)")
    t.add_argument("--arch", choices=ARCHS, default="transformer",
                   help="transformer (default), lstm-attention (Bahdanau), or lstm (no "
                        "attention: the fixed-size bottleneck)")
    t.add_argument("--out", required=True, metavar="DIR", help="checkpoint directory")
    t.add_argument("--time-budget", type=duration, metavar="T",
                   help="stop training after T (e.g. 90s, 10m; default 10m unless --steps)")
    t.add_argument("--steps", type=positive_int, help="stop after this many optimizer steps")
    t.add_argument("--batch-size", type=positive_int, default=64)
    t.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (default 2e-3)")
    t.add_argument("--warmup", type=int, default=200, help="warmup steps (default 200)")
    t.add_argument("--d-model", type=positive_int, help="model width (default per arch)")
    t.add_argument("--layers", type=positive_int, help="encoder and decoder layers")
    t.add_argument("--heads", type=positive_int, help="attention heads (transformer)")
    t.add_argument("--dropout", type=float, help="dropout (default 0)")
    t.add_argument("--unidirectional", action="store_true",
                   help="LSTM encoder reads left to right only")
    t.add_argument("--n-train", type=positive_int, default=200_000,
                   help="generated training pairs (tasks only)")
    t.add_argument("--n-test", type=positive_int, default=2_000,
                   help="generated held-out pairs (tasks only)")
    t.add_argument("--valid-fraction", type=float, default=0.1,
                   help="share of a TSV file's sources held out for evaluation (default 0.1)")
    t.add_argument("--seed", type=int, default=0)
    _add_threads(t)
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.set_defaults(func=run_train)

    tr = actions.add_parser("translate", help="decode sources with a checkpoint",
                            description="Translate one or more sources with a trained model.")
    _add_checkpoint(tr)
    tr.add_argument("--source", action="append", required=True, metavar="TEXT",
                    help="text to translate (repeat for several)")
    _add_decoding(tr)
    tr.set_defaults(func=run_translate)

    e = actions.add_parser(
        "eval", help="held-out exact match by source length",
        description="Exact match on the held-out pairs the checkpoint was trained beside "
                    "(rebuilt from its data description), or on --data FILE.tsv.")
    _add_checkpoint(e)
    e.add_argument("--data", metavar="FILE.tsv", help="evaluate on all pairs of this file instead")
    e.add_argument("--limit", type=positive_int, help="only the first N pairs")
    e.add_argument("--show-errors", type=int, default=5, metavar="N",
                   help="print up to N mistakes (default 5)")
    _add_decoding(e)
    e.set_defaults(func=run_eval)

    a = actions.add_parser(
        "attention", help="plot the cross-attention of one translation",
        description="Heatmap of the attention weights while translating --source: one row per "
                    "generated token, one column per source token (as in Bahdanau et al., 2015). "
                    "Transformer: last layer, mean over heads, unless --layer/--head.")
    _add_checkpoint(a)
    a.add_argument("--source", required=True, metavar="TEXT")
    a.add_argument("--out", required=True, metavar="FILE.png")
    a.add_argument("--layer", type=int, help="transformer decoder layer (default: last)")
    a.add_argument("--head", type=int, help="transformer head (default: mean of heads)")
    _add_decoding(a)
    a.set_defaults(func=run_attention)


def _add_checkpoint(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, metavar="DIR",
                   help="directory written by 'seq2seq train'")
    _add_threads(p)


def _add_threads(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads (default 0 = torch's choice; 1 is often faster on a "
                        "busy machine)")


def _add_decoding(p: argparse.ArgumentParser) -> None:
    p.add_argument("--beam", type=positive_int, default=1, help="beam size (1 = greedy)")
    p.add_argument("--length-penalty", type=float, default=1.0,
                   help="beam score = log p / length**penalty (default 1)")
    p.add_argument("--max-len", type=positive_int, default=64,
                   help="longest output in tokens (default 64)")


def _setup(args: argparse.Namespace):
    import torch

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    return torch


def run_train(args: argparse.Namespace) -> int:
    _setup(args)
    from scratchgpt.checkpoints.seq2seq import save_seq2seq
    from scratchgpt.data.translation import DataSpec
    from scratchgpt.training.seq2seq import TrainConfig, fit, format_eval

    if args.dropout is not None and not 0.0 <= args.dropout < 1.0:
        raise ConfigError(f"--dropout must be in [0, 1), got {args.dropout}")
    if args.lr <= 0:
        raise ConfigError(f"--lr must be > 0, got {args.lr}")
    task = None if args.data else (args.task or "dates")
    data = DataSpec(task=task, path=args.data, n_train=args.n_train, n_test=args.n_test,
                    seed=args.seed, valid_fraction=args.valid_fraction)
    budget = args.time_budget if args.time_budget or args.steps else 600.0
    cfg = TrainConfig(batch_size=args.batch_size, lr=args.lr, warmup_steps=args.warmup,
                      max_steps=args.steps, time_budget=budget, seed=args.seed,
                      progress=not args.no_progress)
    overrides = {"d_model": args.d_model, "n_layer": args.layers, "n_head": args.heads,
                 "dropout": args.dropout}
    if args.unidirectional:
        overrides["bidirectional"] = False
    try:
        res = fit(data, args.arch, cfg, overrides)
    except ValueError as e:  # invalid model shape from the flags
        raise ConfigError(str(e)) from None
    print(format_eval(res.eval))
    meta = {
        "data": {k: v for k, v in vars(data).items()},
        "train": {"steps": res.train.steps, "seconds": round(res.train.seconds, 1),
                  "final_loss": res.train.final_loss, "losses": res.train.losses,
                  "batch_size": cfg.batch_size, "lr": cfg.lr},
        "eval": {"exact_match": res.eval.exact_match, "total": res.eval.total,
                 "by_length": res.eval.by_length},
    }
    path = save_seq2seq(args.out, res.model, res.src_tok, res.tgt_tok, meta)
    print(f"saved {path}")
    return 0


def _load(args: argparse.Namespace):
    _setup(args)
    from scratchgpt.checkpoints.seq2seq import load_seq2seq

    return load_seq2seq(args.checkpoint)


def run_translate(args: argparse.Namespace) -> int:
    from scratchgpt.training.seq2seq import translate

    model, src_tok, tgt_tok, _ = _load(args)
    texts, _, _ = translate(model, args.source, src_tok, tgt_tok, args.beam, args.max_len,
                            length_penalty=args.length_penalty)
    for text in texts:
        print(text)
    return 0


def run_eval(args: argparse.Namespace) -> int:
    from scratchgpt.data.translation import DataSpec, read_tsv
    from scratchgpt.training.seq2seq import evaluate, format_eval

    model, src_tok, tgt_tok, meta = _load(args)
    if args.data:
        pairs = read_tsv(args.data)
    else:
        if "data" not in meta:
            raise CheckpointError(
                f"{args.checkpoint}: checkpoint does not say what it was trained on; "
                            "pass --data FILE.tsv")
        _, pairs = DataSpec(**meta["data"]).load()
    pairs = pairs[: args.limit] if args.limit else pairs
    ev = evaluate(model, pairs, src_tok, tgt_tok, beam=args.beam, max_len=args.max_len)
    print(format_eval(ev))
    errors = [(s, t, p) for (s, t), p in zip(pairs, ev.predictions, strict=True) if p != t]
    for s, t, p in errors[: args.show_errors]:
        print(f"  {s!r} -> {p!r} (expected {t!r})")
    return 0


def run_attention(args: argparse.Namespace) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from scratchgpt.data.translation import EOS_ID
    from scratchgpt.models.seq2seq import TransformerSeq2Seq
    from scratchgpt.training.seq2seq import translate

    model, src_tok, tgt_tok, _ = _load(args)
    if isinstance(model, TransformerSeq2Seq):
        n_layer, n_head = model.config.n_layer, model.config.n_head
        if args.layer is not None:
            if not -n_layer <= args.layer < n_layer:
                raise ConfigError(f"--layer must be in [0, {n_layer - 1}], got {args.layer}")
            model.attn_layer = args.layer
        if args.head is not None:
            if not 0 <= args.head < n_head:
                raise ConfigError(f"--head must be in [0, {n_head - 1}], got {args.head}")
            model.attn_head = args.head
    elif args.layer is not None or args.head is not None:
        raise ConfigError("--layer/--head only apply to transformer checkpoints")

    texts, ids, attn = translate(model, [args.source], src_tok, tgt_tok, args.beam, args.max_len,
                                 length_penalty=args.length_penalty)
    weights = attn[0].numpy()  # [target tokens, source tokens]
    src_labels = list(args.source) + ["<eos>"]
    src_labels = [c if src_tok.stoi.get(c) is not None or c == "<eos>" else "<unk>"
                  for c in src_labels]
    tgt_labels = tgt_tok.token_strings(ids[0])
    fig, ax = plt.subplots(figsize=(max(4, 0.35 * len(src_labels) + 1.5),
                                    max(3, 0.35 * len(tgt_labels) + 1.2)))
    ax.imshow(weights, cmap="gray", vmin=0, vmax=max(float(weights.max()), 1e-9), aspect="auto")
    ax.set_xticks(range(len(src_labels)), [_show(c) for c in src_labels])
    for label in ax.get_xticklabels():  # characters upright, "<eos>"/"<unk>" vertical
        label.set_rotation(90 if len(label.get_text()) > 1 else 0)
    ax.set_yticks(range(len(tgt_labels)), [_show(c) for c in tgt_labels])
    ax.set_xlabel("source")
    ax.set_ylabel("output")
    title = f"{model.config.arch}: {args.source!r} -> {texts[0]!r}"
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    ended = bool(ids[0]) and ids[0][-1] == EOS_ID
    print(json.dumps({"translation": texts[0], "out": str(out), "finished": ended}))
    return 0


def _show(c: str) -> str:
    return "␣" if c == " " else c
