"""The cost of top-p (nucleus) filtering one row of GPT-2-sized logits: ranking the whole
vocabulary (a full sort, as top-p is usually written) against scratchgpt's ``top_p_mask``
(the most likely 256 first, the whole vocabulary only when their mass falls short of p).

    python benchmarks/top_p.py
    python benchmarks/top_p.py --vocab 50257 --p 0.95 --threads 1

Logits are random normal numbers times a scale: a small scale gives a flat distribution (a
nucleus of tens of thousands of tokens, as from an untrained model), a large one a peaked
distribution (a nucleus of a few to a few hundred, as from a trained one). Both versions are
checked to keep the same tokens, then timed alternately; reported: the median milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from scratchgpt.bench import bench_threads_positive
from scratchgpt.commands.argtypes import finite_float, positive_int
from scratchgpt.generation.sampling import top_p_mask


def full_sort_mask(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Top-p by sorting the whole vocabulary: the reference."""
    probs = torch.softmax(logits.float(), dim=-1)
    ranked, order = torch.sort(probs, dim=-1, descending=True)
    keep = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order,
                                                             ranked.cumsum(-1) - ranked < p)
    return logits.masked_fill(~keep, float("-inf"))


def median_ms(fn, logits: torch.Tensor, p: float, repeats: int) -> float:
    fn(logits, p)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(logits, p)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=positive_int, default=50257,
                    help="logits a row (50257, GPT-2's vocabulary)")
    ap.add_argument("--p", type=finite_float, default=0.95,
                    help="nucleus mass kept, in (0, 1] (0.95)")
    ap.add_argument("--threads", type=bench_threads_positive, default=1, help="torch threads (1)")
    ap.add_argument("--repeats", type=positive_int, default=50,
                    help="timed calls of each; the median is shown (50)")
    args = ap.parse_args()
    if not 0 < args.p <= 1:  # (0 ended in an AssertionError: the two masks differ)
        ap.error(f"argument --p: expected a nucleus mass in (0, 1], got {args.p:g}")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"vocab {args.vocab}, p {args.p}, {args.threads} thread(s), median of {args.repeats}")
    print(f"{'scale':>6} {'nucleus':>8} {'full sort ms':>13} {'top_p_mask ms':>14} {'ratio':>6}")
    for scale in (0.5, 2.0, 5.0, 10.0):
        logits = torch.randn(1, args.vocab) * scale
        kept = torch.isfinite(top_p_mask(logits, args.p))
        assert torch.equal(kept, torch.isfinite(full_sort_mask(logits, args.p)))
        ref = median_ms(full_sort_mask, logits, args.p, args.repeats)
        ours = median_ms(top_p_mask, logits, args.p, args.repeats)
        print(f"{scale:6.1f} {int(kept.sum()):8d} {ref:13.2f} {ours:14.2f} {ref / ours:5.1f}x")


if __name__ == "__main__":
    main()
