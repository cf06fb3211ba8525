"""Greedy decode of the Transformer seq2seq model through its KV cache against re-running the
decoder over the whole output so far at every step (``kv_cache=False``).

    python benchmarks/seq2seq_decode.py
    python benchmarks/seq2seq_decode.py --batch 64 --tokens 60 --rounds 7 --threads 1

The model has the ``transformer`` architecture's default sizes (those ``seq2seq train`` and
``bench seq2seq`` use) and random weights, with ``<eos>`` ruled out so that every row decodes
all ``--tokens`` tokens; the sources are ``--batch`` random rows of ``--src-len`` tokens. The
two ways are first checked to give the same tokens, then timed alternately, one decode each a
round (so a change of machine load hits both alike); reported: median and best seconds and
the median's ratio, as a markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from scratchgpt.bench import bench_threads_positive
from scratchgpt.commands.argtypes import positive_int
from scratchgpt.models.seq2seq import TransformerSeq2Seq, default_config
from scratchgpt.tokenizers.seq2seq import EOS_ID

SRC_VOCAB, TGT_VOCAB = 64, 32  # about the dates task's character vocabularies


def build(seed: int) -> TransformerSeq2Seq:
    """A random-weight model that never ends a row early."""
    torch.manual_seed(seed)
    model = TransformerSeq2Seq(default_config("transformer", SRC_VOCAB, TGT_VOCAB)).eval()
    with torch.no_grad():
        model.head.bias[EOS_ID] = float("-inf")
    return model


def decode_seconds(model: TransformerSeq2Seq, cached: bool, src: torch.Tensor,
                   lengths: torch.Tensor, tokens: int) -> tuple[float, list[list[int]]]:
    """(seconds, tokens) of one greedy decode of the batch."""
    model.kv_cache = cached
    start = time.perf_counter()
    out, _ = model.greedy_decode(src, lengths, max_len=tokens)
    return time.perf_counter() - start, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=positive_int, default=64)
    ap.add_argument("--src-len", type=positive_int, default=30)
    ap.add_argument("--tokens", type=positive_int, default=60)
    ap.add_argument("--rounds", type=positive_int, default=7)
    ap.add_argument("--threads", type=bench_threads_positive, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = build(seed=0)
    src = torch.randint(4, SRC_VOCAB, (args.batch, args.src_len))
    lengths = torch.full((args.batch,), args.src_len)
    times: dict[bool, list[float]] = {True: [], False: []}
    outputs = {c: decode_seconds(model, c, src, lengths, args.tokens)[1] for c in times}  # warm
    if outputs[True] != outputs[False]:
        raise SystemExit("seq2seq_decode.py: cached and uncached decodes differ")
    for _ in range(args.rounds):
        for cached in (False, True):
            times[cached].append(decode_seconds(model, cached, src, lengths, args.tokens)[0])
    print(f"greedy decode: {args.batch} sources of {args.src_len} tokens to {args.tokens} "
          f"tokens, {args.threads} thread(s), {args.rounds} rounds\n")
    print("| decode | median s | best s | ratio |\n|---|---:|---:|---:|")
    base = statistics.median(times[False])
    for cached, name in ((False, "whole prefix each step"), (True, "KV cache")):
        med = statistics.median(times[cached])
        print(f"| {name} | {med:.3f} | {min(times[cached]):.3f} | {base / med:.2f}x |")


if __name__ == "__main__":
    main()
