"""``scratchgpt experiment``: small, self-contained experiments with the recurrent models.

  memory  can the network recall the FIRST symbol of a sequence, by sequence length?
          A tanh RNN loses it as sequences grow (vanishing gradients); an LSTM keeps it.
  count   learn to count (predict the next number): the smallest end-to-end language model,
          then generation that carries the hidden state forward one token at a time.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from scratchgpt.commands.argtypes import positive_int
from scratchgpt.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("experiment", help="small experiments: RNN vs LSTM memory, counting",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    kinds = p.add_subparsers(dest="experiment", metavar="NAME", required=True)

    m = kinds.add_parser(
        "memory", help="recall the first symbol: RNN vs LSTM accuracy by sequence length",
        description="Train a tanh RNN and an LSTM to output the first symbol of a random "
                    "sequence after reading all of it (lengths --min-len..--max-len), then write "
                    "accuracy by length as memory.csv and memory.png into --out.")
    m.add_argument("--out", required=True, metavar="DIR")
    m.add_argument("--cells", nargs="+", choices=("rnn", "lstm", "gru"), default=["rnn", "lstm"],
                   help="which recurrent networks to compare (default: rnn lstm)")
    m.add_argument("--impl", choices=("torch", "scratch"), default="torch",
                   help="how the recurrence runs: 'torch' (its fused kernels, default) or "
                        "'scratch' (the cells of models/rnn.py written from their equations; "
                        "the same accuracies to float tolerance, several times slower)")
    m.add_argument("--min-len", type=positive_int, default=4)
    m.add_argument("--max-len", type=positive_int, default=20)
    m.add_argument("--symbols", type=positive_int, default=8, help="alphabet size (default 8)")
    m.add_argument("--hidden", type=positive_int, default=64)
    m.add_argument("--steps", type=positive_int, default=600,
                   help="training steps per model (default 600)")
    m.add_argument("--forget-bias", type=float, default=1.0,
                   help="initial LSTM forget-gate bias (default 1.0; torch's init is ~0)")
    m.add_argument("--mixed", action="store_true",
                   help="train one model on all lengths at once instead of one model per length "
                        "(the short sequences then teach the RNN what to keep, and it copes)")
    m.add_argument("--batch-size", type=positive_int, default=64)
    m.add_argument("--learning-rate", "--lr", type=float, default=3e-3,
                   help="Adam learning rate (default 3e-3)")
    m.add_argument("--eval-samples", type=positive_int, default=1000,
                   help="test sequences per length")
    m.add_argument("--quick", action="store_true",
                   help="a few seconds: 20 steps, 100 test sequences (for smoke tests)")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    m.set_defaults(func=run_memory)

    c = kinds.add_parser(
        "count", help="learn to count: next-number prediction with a recurrent LM",
        description="Train a small recurrent language model on sequences 'k k+1 k+2 ...' "
                    "(mod --modulus) and continue a prompt one token at a time.")
    c.add_argument("--out", required=True, metavar="DIR")
    c.add_argument("--cell", choices=("rnn", "lstm", "gru"), default="gru")
    c.add_argument("--modulus", type=positive_int, default=20, help="numbers 0..N-1, then wrap")
    c.add_argument("--steps", type=positive_int, default=300)
    c.add_argument("--hidden", type=positive_int, default=32)
    c.add_argument("--prompt", default="3 4 5", help="numbers to continue (default '3 4 5')")
    c.add_argument("--generate", type=positive_int, default=10, help="numbers to generate")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    c.set_defaults(func=run_count)


def run_memory(args: argparse.Namespace) -> int:

    import torch

    from scratchgpt.experiments import memory

    if args.min_len > args.max_len:
        raise ConfigError(f"--min-len {args.min_len} is larger than --max-len {args.max_len}")
    if args.symbols < 2:
        raise ConfigError("--symbols must be at least 2")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    steps, n_eval = (20, 100) if args.quick else (args.steps, args.eval_samples)
    setup = memory.MemorySetup(args.symbols, args.hidden, steps, args.batch_size,
                               args.learning_rate, args.forget_bias, n_eval, args.seed,
                               args.impl)
    lengths = list(range(args.min_len, args.max_len + 1))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    accuracy = memory.run(setup, args.cells, lengths, args.mixed,
                          log=lambda line: print(line, flush=True))
    with open(out_dir / "memory.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["length", *args.cells])
        for i, t in enumerate(lengths):
            w.writerow([t, *(f"{accuracy[c][i]:.4f}" for c in args.cells)])
    memory.plot(out_dir / "memory.png", lengths, accuracy, args.symbols)
    print(f"wrote {out_dir / 'memory.csv'} and {out_dir / 'memory.png'}")
    return 0


def run_count(args: argparse.Namespace) -> int:
    import torch

    from scratchgpt.experiments.count import continue_counting, train_counter

    n = args.modulus
    try:
        prompt = [int(tok) for tok in args.prompt.split()]
    except ValueError:
        raise ConfigError(f"--prompt must be numbers separated by spaces, got {args.prompt!r}"
                          ) from None
    if not prompt or any(not 0 <= k < n for k in prompt):
        raise ConfigError(f"--prompt needs numbers in [0, {n - 1}]")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    model, metrics, first = train_counter(args.cell, n, args.hidden, args.steps, args.seed)
    generated = continue_counting(model, prompt, args.generate)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {"cell": args.cell, "modulus": n, "steps": args.steps,
              "final_loss": metrics["val_loss"],
              "next_number_accuracy": metrics["next_number_accuracy"], "prompt": prompt,
              "generated": generated}
    (out_dir / "count.json").write_text(json.dumps(result, indent=1))
    print(f"loss {first:.3f} -> {metrics['val_loss']:.3f}; next-number accuracy "
          f"{metrics['next_number_accuracy']:.2%}")
    print(f"{' '.join(map(str, prompt))} -> {' '.join(map(str, generated))}")
    return 0
