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
import time
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
    m.add_argument("--lr", type=float, default=3e-3)
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


# ---------------------------------------------------------------------------------------------
# memory
# ---------------------------------------------------------------------------------------------


def run_memory(args: argparse.Namespace) -> int:
    import torch
    import torch.nn.functional as F
    from torch import nn

    from scratchgpt.models.rnn import Recurrent

    if args.min_len > args.max_len:
        raise ConfigError(f"--min-len {args.min_len} is larger than --max-len {args.max_len}")
    if args.symbols < 2:
        raise ConfigError("--symbols must be at least 2")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    steps, n_eval = (20, 100) if args.quick else (args.steps, args.eval_samples)
    lengths = list(range(args.min_len, args.max_len + 1))

    class FirstSymbol(nn.Module):
        """Embed each symbol, run the recurrence, classify the first symbol from the last state."""

        def __init__(self, cell: str):
            super().__init__()
            self.embed = nn.Embedding(args.symbols, 16)
            self.rnn = Recurrent(cell, 16, args.hidden, fast=args.impl == "torch")
            if cell == "lstm" and args.forget_bias is not None:
                self.rnn.init_forget_bias(args.forget_bias)
            self.head = nn.Linear(args.hidden, args.symbols)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out, _ = self.rnn(self.embed(x))  # [B, T, hidden]
            return self.head(out[:, -1])  # [B, symbols]

    def train_and_test(cell: str, train_lengths: list[int], seed: int) -> list[float]:
        """Train one model on sequences of ``train_lengths``; accuracy at each of them."""
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed)
        model = FirstSymbol(cell)
        opt = torch.optim.Adam(model.parameters(), lr=args.lr)
        for _ in range(steps):
            t = train_lengths[int(torch.randint(len(train_lengths), (1,), generator=gen))]
            x = torch.randint(args.symbols, (args.batch_size, t), generator=gen)
            loss = F.cross_entropy(model(x), x[:, 0])
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        model.eval()
        with torch.no_grad():
            accs = []
            for t in train_lengths:
                x = torch.randint(args.symbols, (n_eval, t), generator=gen)
                accs.append(float((model(x).argmax(-1) == x[:, 0]).float().mean()))
        return accs

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    accuracy: dict[str, list[float]] = {}
    for cell in args.cells:
        t0 = time.perf_counter()
        if args.mixed:
            accuracy[cell] = train_and_test(cell, lengths, args.seed)
        else:  # a fresh model per length: nothing short to learn from first
            accuracy[cell] = [train_and_test(cell, [t], args.seed + t)[0] for t in lengths]
        print(f"{cell} ({args.impl} cells): {time.perf_counter() - t0:.1f}s; accuracy by length "
              + " ".join(f"{t}:{a:.2f}" for t, a in zip(lengths, accuracy[cell], strict=True)),
              flush=True)

    with open(out_dir / "memory.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["length", *args.cells])
        for i, t in enumerate(lengths):
            w.writerow([t, *(f"{accuracy[c][i]:.4f}" for c in args.cells)])
    _plot_memory(out_dir / "memory.png", lengths, accuracy, args.symbols)
    print(f"wrote {out_dir / 'memory.csv'} and {out_dir / 'memory.png'}")
    return 0


def _plot_memory(path: Path, lengths: list[int], accuracy: dict[str, list[float]],
                 symbols: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for cell, accs in accuracy.items():
        ax.plot(lengths, accs, marker="o", label=cell.upper())
    ax.axhline(1 / symbols, color="gray", linestyle="--", label="chance")
    ax.set_xlabel("sequence length (steps between the symbol and the answer)")
    ax.set_ylabel("accuracy recalling the first symbol")
    ax.set_ylim(0, 1.05)
    ax.legend()
    ax.set_title("Memory over time: RNN vs LSTM")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# count
# ---------------------------------------------------------------------------------------------


def run_count(args: argparse.Namespace) -> int:
    import torch
    import torch.nn.functional as F

    from scratchgpt.models.rnn import RecurrentConfig, RecurrentLM

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
    torch.manual_seed(args.seed)

    # Each number is one token; a training row is k, k+1, ..., k+15 (mod n).
    model = RecurrentLM(RecurrentConfig(vocab_size=n, cell=args.cell, n_layer=1,
                                        hidden=args.hidden))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(args.steps):
        start = torch.randint(n, (32, 1))
        seq = (start + torch.arange(17)) % n  # [32, 17]
        logits = model(seq[:, :-1])  # [32, 16, n]
        loss = F.cross_entropy(logits.reshape(-1, n), seq[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()

    with torch.no_grad():
        # Next-number accuracy from every start, given one number of context and then more.
        seq = (torch.arange(n)[:, None] + torch.arange(17)) % n
        acc = float((model(seq[:, :-1]).argmax(-1) == seq[:, 1:]).float().mean())
        # Generation: read the prompt once, then feed back one token at a time (the state holds
        # everything the model remembers, so the prompt is never re-read).
        state = model.new_cache(1)
        logits = model(torch.tensor([prompt]), state)
        generated = []
        for _ in range(args.generate):
            nxt = int(logits[0, -1].argmax())
            generated.append(nxt)
            logits = model(torch.tensor([[nxt]]), state)

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {"cell": args.cell, "modulus": n, "steps": args.steps, "final_loss": losses[-1],
              "next_number_accuracy": acc, "prompt": prompt, "generated": generated}
    (out_dir / "count.json").write_text(json.dumps(result, indent=1))
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}; next-number accuracy {acc:.2%}")
    print(f"{' '.join(map(str, prompt))} -> {' '.join(map(str, generated))}")
    return 0
