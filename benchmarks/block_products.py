"""How close a fused block's bf16 products run to this CPU's bf16 matmul peak, on one thread
and on several: the question to ask before trying to make the training step's products faster.

    python benchmarks/block_products.py                      # nanoGPT's CPU recipe shape
    python benchmarks/block_products.py --n-embd 192 --rows 2048 --threads 1,2

A block makes twelve products a training step, three for each of its four projections (qkv,
attention output, MLP in, MLP out): the forward ``x W^T``, the input gradient ``dy W`` and the
weight gradient ``dy^T x``, each on ``--rows`` rows (batch x context: 12 x 64 = 768 in the
recipe). Each is timed as the training step calls it (``models/tile_matmul.py``: on AMX tiles or
by AVX512-BF16 dot products, whichever the CPU has; the weights laid out beforehand, as the
step does once per step), ``--calls`` calls in a row, best of ``--repeats``; beside them, the
peak this CPU reaches on one large bf16 product (2048^3, PyTorch's) on the same threads. Printed
per thread count: each product's microseconds and TFLOP/s, their sum (a block's products; times
the layers for a step) and what share of the peak that sum runs at.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from scratchgpt.bench import bench_threads_positive
from scratchgpt.bench.train import matmul_peak
from scratchgpt.commands.argtypes import positive_int
from scratchgpt.models import tile_matmul


def thread_counts(text: str) -> list[int]:
    """``--threads``: thread counts, comma-separated, each as a benchmark's ``--threads``
    takes it (1 up to the cores)."""
    try:
        return [bench_threads_positive(t) for t in text.split(",")]
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(
            f"{e} in {text!r} (thread counts, comma-separated)") from None


def best_us(call: Callable[[], object], calls: int, repeats: int) -> float:
    """Microseconds per call: the best of ``repeats`` runs of ``calls`` calls (after a few
    calls to warm up)."""
    for _ in range(5):
        call()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def products(n_embd: int) -> dict[str, tuple[int, int]]:
    """The four projections' weight shapes (out, in) of a block of width ``n_embd``."""
    c = n_embd
    return {"qkv": (3 * c, c), "attn out": (c, c), "mlp in": (4 * c, c), "mlp out": (c, 4 * c)}


def projection_calls(rows: int, n_out: int, n_in: int,
                     gen: torch.Generator) -> list[tuple[str, Callable[[], object]]]:
    """The three products of one projection (out, in) on ``rows`` rows, as calls."""
    w = torch.randn(n_out, n_in, generator=gen) * 0.02
    (fwd,), (bwd,) = tile_matmul.pack([w])  # laid out once, as a training step does
    x = torch.randn(rows, n_in, generator=gen).bfloat16()
    dy = torch.randn(rows, n_out, generator=gen).bfloat16()
    return [("forward", lambda: tile_matmul.linear(x, fwd, None)),
            ("input grad", lambda: tile_matmul.input_grad(dy, bwd)),
            ("weight grad", lambda: tile_matmul.weight_grad(dy, x))]


def time_block(rows: int, n_embd: int, calls: int, repeats: int) -> list[tuple[str, float, int]]:
    """(name, microseconds, FLOPs) of each of a block's twelve products on the current
    threads."""
    gen = torch.Generator().manual_seed(0)
    timed = []
    for name, (n_out, n_in) in products(n_embd).items():
        for kind, call in projection_calls(rows, n_out, n_in, gen):
            timed.append((f"{name} {kind}", best_us(call, calls, repeats),
                          2 * rows * n_out * n_in))
    return timed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=positive_int, default=768,
                    help="rows of every product: batch x context (768: nanoGPT's CPU recipe)")
    ap.add_argument("--n-embd", type=positive_int, default=128, help="the block's width (128)")
    ap.add_argument("--threads", type=thread_counts, default=[1, torch.get_num_threads()],
                    help="comma-separated thread counts to time on (default: 1 and torch's)")
    ap.add_argument("--calls", type=positive_int, default=200, help="calls per run (200)")
    ap.add_argument("--repeats", type=positive_int, default=5, help="runs, best kept (5)")
    args = ap.parse_args()
    if tile_matmul.kind() is None:
        ap.error("this CPU has neither AMX tiles nor AVX512-BF16 dot products (or no C "
                 "compiler was found): a fused block's products here are PyTorch's")
    if args.rows % tile_matmul.BLOCK or args.n_embd % tile_matmul.BLOCK:
        ap.error(f"--rows and --n-embd must be multiples of {tile_matmul.BLOCK}, as the "
                 "block's products need (otherwise the step takes PyTorch's)")
    print(f"{args.rows} rows, width {args.n_embd}; products on "
          f"{'AMX tiles' if tile_matmul.kind() == 'tiles' else 'AVX512-BF16 dot products'}")
    for threads in dict.fromkeys(args.threads):
        torch.set_num_threads(threads)
        peak = matmul_peak("bf16")
        timed = time_block(args.rows, args.n_embd, args.calls, args.repeats)
        print(f"\n{threads} thread(s): bf16 matmul peak {peak / 1e12:.3f} TFLOP/s (2048^3)")
        for name, us, flops in timed:
            print(f"  {name:24s} {us:8.1f} us  {flops / us / 1e6:6.3f} TFLOP/s")
        total_us = sum(us for _, us, _ in timed)
        rate = sum(flops for _, _, flops in timed) / total_us * 1e6  # FLOP/s
        print(f"  {'a block, all twelve':24s} {total_us:8.1f} us  {rate / 1e12:6.3f} TFLOP/s, "
              f"{rate / peak:.0%} of the peak")


if __name__ == "__main__":
    main()
