"""How many rows a C decode step should take: ms a step of B rows, the C step against PyTorch's.

Each row of a C step is summed exactly as it would be alone, so a step of B rows costs B times
one row's arithmetic, while PyTorch's batched products (oneDNN) share it better once a step is
bound by arithmetic. This measures where the two cross, per model size, to set
``models/native.py``'s SMALL_MODEL_ROWS and LARGE_MODEL_ROWS. Random weights; each step is one
new token per row after an 8-token prompt; the two variants alternate round by round in one
process, and each cell is the median of the rounds' means.

    python benchmarks/c_step_rows.py --shape cpu-small --rows 1,4,8,16,32
    python benchmarks/c_step_rows.py --shape gpt2 --rows 1,2,4,8 --dtype int8
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from scratchgpt.bench import bench_threads_positive
from scratchgpt.commands.argtypes import positive_int
from scratchgpt.models.fast_decode import prepare_for_decode
from scratchgpt.models.gpt import GPT, GPTConfig
from scratchgpt.models.native import NativeGPT

PROMPT = 8  # tokens before the timed steps

SHAPES = {  # (layers, heads, width, vocabulary, context)
    "cpu-small": (4, 4, 128, 65, 64),
    "6L-384d": (6, 6, 384, 65, 256),
    "gpt2": (12, 12, 768, 50257, 1024),
}


def step_ms(model: torch.nn.Module, rows: int, steps: int) -> float:
    """Mean ms of one-token steps of ``rows`` rows after an 8-token prompt."""
    with torch.inference_mode():
        cache = model.new_cache(rows)
        model(torch.randint(0, 65, (rows, PROMPT)), cache)
        start = time.perf_counter()
        for _ in range(steps):
            model(torch.randint(0, 65, (rows, 1)), cache)
        return (time.perf_counter() - start) / steps * 1e3


def row_counts(text: str) -> list[int]:
    """``--rows``: batch sizes, each a positive integer, comma-separated."""
    try:
        return [positive_int(r) for r in text.split(",")]
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(
            f"{e} in {text!r} (batch sizes, comma-separated)") from None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=SHAPES, default="cpu-small",
                   help="the random model's shape (default cpu-small)")
    p.add_argument("--rows", type=row_counts, default="1,4,8,16,32",
                   help="batch sizes, comma-separated (default 1,4,8,16,32)")
    p.add_argument("--dtype", choices=("fp32", "bf16", "int8"), default="fp32",
                   help="the weights' precision, as sample --dtype (default fp32)")
    p.add_argument("--threads", type=bench_threads_positive, default=2,
                   help="torch threads (2)")
    p.add_argument("--rounds", type=positive_int, default=3,
                   help="rounds, the two steps taking turns; a cell is their median (3)")
    p.add_argument("--steps", type=positive_int, default=32, help="timed steps a round (32)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    n_layer, n_head, n_embd, vocab, context = SHAPES[args.shape]
    if args.steps > context - PROMPT:  # every step is one more position of the cache
        p.error(f"argument --steps: at most {context - PROMPT} for --shape {args.shape} (a "
                f"{PROMPT}-token prompt, then a step a position, in a context of {context}), "
                f"got {args.steps}")
    base = GPT(GPTConfig(vocab_size=vocab, n_layer=n_layer, n_head=n_head, n_embd=n_embd,
                         block_size=context, dropout=0.0)).eval()
    print(f"{args.shape} ({n_layer}L/{n_embd}d), {args.dtype}, {args.threads} threads: "
          "ms a step, C / PyTorch")
    for rows in args.rows:
        c_step = prepare_for_decode(copy.deepcopy(base), args.dtype, pack=False,
                                    native_rows=rows)
        assert isinstance(c_step, NativeGPT), "the C step cannot run here"
        c_step.max_rows = rows  # (a large model's default would send these rows to PyTorch)
        eager = prepare_for_decode(copy.deepcopy(base), args.dtype, native=False)
        times: dict[str, list[float]] = {"C": [], "PyTorch": []}
        for _ in range(args.rounds):
            times["C"].append(step_ms(c_step, rows, args.steps))
            times["PyTorch"].append(step_ms(eager, rows, args.steps))
        c, t = (statistics.median(times[k]) for k in ("C", "PyTorch"))
        print(f"B = {rows:3d}: {c:8.2f} / {t:8.2f}   C {'faster' if c < t else 'slower'} "
              f"({t / c:.2f}x)")


if __name__ == "__main__":
    main()
