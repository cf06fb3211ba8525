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

``--against FILE`` compares two versions of the cache instead: ``FILE`` is an earlier
``models/seq2seq.py`` (taken with ``git show``), loaded beside this one in the same process;
both models get the same weights, are checked to give the same tokens, and their KV-cache
decodes are timed alternately (the whole-prefix decode, minutes a run at a few hundred
tokens, is left out)::

    git show 4b8ea15:src/scratchgpt/models/seq2seq.py > /tmp/seq2seq_before.py
    python benchmarks/seq2seq_decode.py --against /tmp/seq2seq_before.py --tokens 240
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from batch_slide import decode_file  # the --against argtype: a file that exists

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


def earlier(path: Path, model: TransformerSeq2Seq) -> TransformerSeq2Seq:
    """The ``TransformerSeq2Seq`` of the ``seq2seq.py`` at ``path``, with ``model``'s weights.
    The file runs against this checkout's other modules (a version from 4b8ea15 on: earlier
    ones call attention code that is gone)."""
    spec = importlib.util.spec_from_file_location("seq2seq_before", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"argument --against: not a Python file: {str(path)!r}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except (SyntaxError, ImportError) as e:
        raise ValueError(f"argument --against: cannot import {str(path)!r}: {e}") from e
    if not hasattr(module, "TransformerSeq2Seq"):
        raise ValueError(f"argument --against: no TransformerSeq2Seq in {str(path)!r} (give a "
                         "models/seq2seq.py)")
    before = module.TransformerSeq2Seq(model.config).eval()
    before.load_state_dict(model.state_dict())
    return before


def decode_seconds(model: TransformerSeq2Seq, cached: bool, src: torch.Tensor,
                   lengths: torch.Tensor, tokens: int) -> tuple[float, list[list[int]]]:
    """(seconds, tokens) of one greedy decode of the batch."""
    model.kv_cache = cached
    start = time.perf_counter()
    out, _ = model.greedy_decode(src, lengths, max_len=tokens)
    return time.perf_counter() - start, out


def contenders(model: TransformerSeq2Seq, against: Path | None
               ) -> dict[str, tuple[TransformerSeq2Seq, bool]]:
    """Name -> (model, through the KV cache?) of the decodes to time, the baseline first."""
    if against is None:
        return {"whole prefix each step": (model, False), "KV cache": (model, True)}
    return {f"KV cache, {against.name}": (earlier(against, model), True),
            "KV cache, this version": (model, True)}


def timed(ways: dict[str, tuple[TransformerSeq2Seq, bool]], rounds: int,
          decode: Callable[[TransformerSeq2Seq, bool], tuple[float, list[list[int]]]]
          ) -> dict[str, list[float]]:
    """Seconds of each way's decodes, one each a round, alternating, after a checked warm-up."""
    outputs = [decode(m, cached)[1] for m, cached in ways.values()]
    if any(out != outputs[0] for out in outputs):
        raise SystemExit(f"seq2seq_decode.py: the decodes differ: {', '.join(ways)}")
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, (m, cached) in ways.items():
            times[name].append(decode(m, cached)[0])
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=positive_int, default=64, help="sources decoded together (64)")
    ap.add_argument("--src-len", type=positive_int, default=30, help="tokens a source (30)")
    ap.add_argument("--tokens", type=positive_int, default=60,
                    help="tokens decoded a row (60; <eos> is ruled out)")
    ap.add_argument("--rounds", type=positive_int, default=7,
                    help="decodes of each way, taking turns; the median is shown (7)")
    ap.add_argument("--threads", type=bench_threads_positive, default=1, help="torch threads (1)")
    ap.add_argument("--against", type=decode_file, metavar="FILE",
                    help="an earlier models/seq2seq.py: time its KV cache against this one's")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    src = torch.randint(4, SRC_VOCAB, (args.batch, args.src_len))
    lengths = torch.full((args.batch,), args.src_len)
    try:
        ways = contenders(build(seed=0), args.against)
    except ValueError as e:
        ap.error(str(e))
    times = timed(ways, args.rounds,
                  lambda m, cached: decode_seconds(m, cached, src, lengths, args.tokens))
    print(f"greedy decode: {args.batch} sources of {args.src_len} tokens to {args.tokens} "
          f"tokens, {args.threads} thread(s), {args.rounds} rounds\n")
    print("| decode | median s | best s | ratio |\n|---|---:|---:|---:|")
    base = statistics.median(next(iter(times.values())))
    for name, seconds in times.items():
        med = statistics.median(seconds)
        print(f"| {name} | {med:.3f} | {min(seconds):.3f} | {base / med:.2f}x |")

if __name__ == "__main__":
    main()
