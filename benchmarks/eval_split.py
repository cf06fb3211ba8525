"""How long the exact whole-split evaluation takes: batch sizes, and the fused block against
the modules.

The final val loss of every run is an fp32 pass over every non-overlapping window of the
validation split (``training/task.py``'s ``full_split_loss``). This times that pass on a
model of nanoGPT's CPU recipe shape (4 layers, 4 heads, 128 dims, context 64, exact GELU, no
biases; random weights, the same work as trained ones) over a prepared dataset's validation
split, each variant in turn, round after round in one process; each cell is the median of the
rounds. Variants: ``wN`` batches of N windows through the default path, ``modules`` the
default batches with every block on its modules (``SCRATCHGPT_FUSED_BLOCK=torch``).

    python benchmarks/eval_split.py DATASET_DIR --variants w8,w16,w32,w64 --rounds 6
    python benchmarks/eval_split.py DATASET_DIR --variants w32,modules --rounds 6

DATASET_DIR: a prepared dataset, e.g. ``~/.cache/scratchgpt/datasets/shakespeare-char`` once
``scratchgpt train --dataset shakespeare`` has run.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time

import torch

from scratchgpt.bench import refuse_repeats
from scratchgpt.bench.train import switched_off
from scratchgpt.commands.argtypes import positive_int
from scratchgpt.data.dataset import TokenDataset
from scratchgpt.errors import ConfigError, DataError
from scratchgpt.models import fused_block
from scratchgpt.models.gpt import GPT, GPTConfig
from scratchgpt.training.task import full_split_loss


def run_variant(model: GPT, data: TokenDataset, variant: str) -> float:
    """Seconds of one whole-split pass of ``variant``."""
    batch = int(variant[1:]) if variant.startswith("w") else None

    def one_pass() -> float:
        start = time.perf_counter()
        full_split_loss(model, data, "val", model.config.block_size, torch.device("cpu"),
                        batch_size=batch)
        return time.perf_counter() - start

    return (switched_off(one_pass, fused_block.SWITCH) if variant == "modules" else one_pass)()


def variant_list(text: str) -> list[str]:
    """``--variants``: ``wN`` (N windows a batch, N >= 1) or ``modules``, comma-separated;
    ``wN`` as N reads (``w032`` is ``w32``), so that a variant named twice is seen."""
    variants = [v.strip() for v in text.split(",")]
    for v in variants:
        if v != "modules" and not re.fullmatch(r"w0*[1-9][0-9]*", v):
            raise argparse.ArgumentTypeError(
                f"expected wN (N windows a batch, N >= 1) or modules, comma-separated, "
                f"got {v!r} in {text!r}")
    return [v if v == "modules" else f"w{int(v[1:])}" for v in variants]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dataset", help="a prepared dataset directory")
    p.add_argument("--variants", type=variant_list, default="w32,w64,modules",
                   help="comma list: wN (N windows a batch) or modules (every block on its "
                        "modules) (default w32,w64,modules)")
    p.add_argument("--rounds", type=positive_int, default=6,
                   help="passes over the split of each variant, in turn; a cell is their "
                        "median (6)")
    args = p.parse_args()
    try:  # a variant named twice was timed twice, a row each, as the bench commands refuse
        refuse_repeats("--variants", args.variants)
        data = TokenDataset(args.dataset)
    except (ConfigError, DataError) as e:  # (not a prepared dataset): one line, as a bad flag
        p.error(str(e))
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=data.vocab_size, block_size=64, n_layer=4, n_head=4,
                          n_embd=128, dropout=0.0, bias=False, activation="gelu"))
    variants = args.variants
    times: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for v in variants if r % 2 == 0 else variants[::-1]:  # each variant first in turn
            times[v].append(run_variant(model, data, v))
    print(f"{torch.get_num_threads()} threads, {args.rounds} rounds, validation split of "
          f"{len(data.splits['val']):,} tokens")
    for v in variants:
        print(f"{v:8s} median {statistics.median(times[v]):.3f} s   "
              + " ".join(f"{t:.2f}" for t in times[v]))


if __name__ == "__main__":
    main()
