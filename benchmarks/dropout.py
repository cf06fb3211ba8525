"""Dropout on a CPU: PyTorch's kernels against scratchgpt's (models/dropout.py), forward and
backward, at cpu-medium's shape (batch 16, context 128, 192 dims, 6 heads).

    python benchmarks/dropout.py [--rounds 7] [--threads 2]

Rows: dropout of an activation (16, 128, 192) in fp32 and bf16, then attention with dropout on
its weights (q, k, v: (16, 6, 128, 32), fp32 as the GPT runs it on a CPU): PyTorch's fused
``scaled_dot_product_attention(dropout_p=p)``, the written-out form with PyTorch's dropout, and
the written-out form with scratchgpt's (the GPT's training path), beside the fused kernel without
dropout. Each figure is the median over rounds of the mean of 20 calls; in every round each
variant runs once, in turn, so a change of machine load hits them alike.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from scratchgpt.bench import bench_threads_positive
from scratchgpt.commands.argtypes import finite_float, positive_int
from scratchgpt.models.dropout import dropout
from scratchgpt.models.gpt import attention_math


def mean_ms(fn: Callable[[], None], calls: int = 20) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e3


def activation_variants(p: float) -> dict[str, Callable[[], None]]:
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(16, 128, 192, dtype=dtype, requires_grad=True)
        name = str(dtype).removeprefix("torch.")
        out[f"activation {name}: torch F.dropout"] = lambda x=x: F.dropout(x, p).sum().backward()
        out[f"activation {name}: scratchgpt dropout"] = lambda x=x: dropout(x, p).sum().backward()
    return out


def attention_variants(p: float) -> dict[str, Callable[[], None]]:
    q, k, v = (torch.randn(16, 6, 128, 32, requires_grad=True) for _ in range(3))
    causal = torch.ones(128, 128, dtype=torch.bool).tril()

    def written_out(drop: Callable[[torch.Tensor, float], torch.Tensor]) -> None:
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(32)
        weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        (drop(weights, p) @ v).sum().backward()

    sdpa = F.scaled_dot_product_attention
    return {
        "attention: fused, no dropout": lambda: sdpa(q, k, v, is_causal=True).sum().backward(),
        "attention: fused, dropout": lambda: sdpa(q, k, v, is_causal=True,
                                                  dropout_p=p).sum().backward(),
        "attention: written out, torch F.dropout": lambda: written_out(F.dropout),
        "attention: written out, scratchgpt dropout (the GPT's path)":
            lambda: attention_math(q, k, v, causal[None, None], p)[0].sum().backward(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=positive_int, default=7,
                    help="rounds, each variant once a round; a figure is their median (7)")
    ap.add_argument("--threads", type=bench_threads_positive, default=2, help="torch threads (2)")
    ap.add_argument("--p", type=finite_float, default=0.1,
                    help="dropout probability, in [0, 1) (0.1)")
    args = ap.parse_args()
    if not 0 <= args.p < 1:  # (torch's ValueError came as a traceback)
        ap.error(f"argument --p: expected a dropout probability in [0, 1), got {args.p:g}")
    torch.set_num_threads(args.threads)
    variants = {**activation_variants(args.p), **attention_variants(args.p)}
    for fn in variants.values():  # warm up
        fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            times[name].append(mean_ms(fn))
    print(f"p = {args.p}, {args.threads} threads, median of {args.rounds} rounds, "
          "forward + backward")
    print("| variant | ms |\n|---|---:|")
    for name, ts in times.items():
        print(f"| {name} | {statistics.median(ts):.2f} |")


if __name__ == "__main__":
    main()
