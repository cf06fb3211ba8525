"""Batched generation past the context: ``generate_batch`` on prompts near the context, each
row's window sliding on its own step, timed against another version of the decode loop.

Rows of different lengths fill the context on different steps, and each then slides and is
prefilled again (``generation/decode.py``), so a long batched generation pays for a slide every
few steps. This times that: ``--batch`` random prompts whose lengths are spread over the last
quarter of the context (so the rows slide on different steps), ``--new-tokens`` greedy tokens
each, on a GPT prepared as ``scratchgpt sample`` prepares one (its one-token steps in C). With
``--against FILE`` (a ``decode.py`` of another commit, e.g. ``git show REV:src/scratchgpt/
generation/decode.py > /tmp/decode_rev.py``) the two loops alternate round by round in one
process, and
their tokens are compared: the median seconds of each, and whether every token is the same
(the digest printed last compares the tokens of two checkouts run one after the other).

    python benchmarks/batch_slide.py --batch 8 --new-tokens 256 --repeats 3
    python benchmarks/batch_slide.py --against /tmp/decode_rev.py --threads 2
    PYTHONPATH=/tmp/rev/src python benchmarks/batch_slide.py   # all of another checkout's code

(``git archive REV src | tar -x -C /tmp/rev`` makes that last one.) The weights are random
and tripled, so that the greedy texts read their context and vary.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

from scratchgpt.bench import bench_threads_positive
from scratchgpt.commands.argtypes import positive_int
from scratchgpt.generation import decode as this_decode
from scratchgpt.generation.sampling import SamplingConfig
from scratchgpt.models.fast_decode import prepare_for_decode
from scratchgpt.models.gpt import GPT, GPTConfig

SHAPES = {  # (layers, heads, width, vocabulary, context)
    "cpu-small": (4, 4, 128, 65, 64),
    "6L-384d": (6, 6, 384, 65, 256),
}
GREEDY = SamplingConfig(temperature=0)


def load_decode(path: Path) -> ModuleType:
    """A ``decode.py`` of another version, imported beside this checkout's as its own module."""
    spec = importlib.util.spec_from_file_location("decode_against", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def decode_file(text: str) -> Path:
    """``--against``: a file that exists."""
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text!r}")
    return Path(text)


def batch_runner(decode_module: ModuleType, model, prompts: list[list[int]],
                 n: int) -> Callable[[], list[list[int]]]:
    """``generate_batch`` through ``decode_module.decode``: each prompt's new tokens."""
    def run() -> list[list[int]]:
        out: list[list[int]] = [[] for _ in prompts]
        for rows, tokens in decode_module.decode(model, prompts, n, GREEDY):
            for b, t in zip(rows, tokens.tolist(), strict=True):
                out[b].append(t)
        return out
    return run


def make_prompts(batch: int, context: int, vocab: int) -> list[list[int]]:
    """``batch`` random prompts, lengths spread over the last quarter of the context."""
    g = torch.Generator().manual_seed(1)
    lengths = [context - 1 - (i * (context // 4)) // batch for i in range(batch)]
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=SHAPES, default="cpu-small",
                   help="the random GPT: cpu-small (4 layers, 128 dims, context 64; default) "
                        "or 6L-384d (6 layers, 384 dims, context 256)")
    p.add_argument("--batch", type=positive_int, default=8, help="prompts generated together (8)")
    p.add_argument("--new-tokens", type=positive_int, default=256,
                   help="greedy tokens a row (256)")
    p.add_argument("--repeats", type=positive_int, default=7,
                   help="timed generations of each decode loop; the median is shown (7)")
    p.add_argument("--threads", type=bench_threads_positive, default=1,
                   help="torch threads (1: steadier on a shared machine)")
    p.add_argument("--against", type=decode_file, action="append", default=[],
                   help="a decode.py of another version, timed alternately with this one "
                        "(may be given several times)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    layers, heads, width, vocab, context = SHAPES[args.shape]
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=vocab, block_size=context, n_layer=layers, n_head=heads,
                          n_embd=width))
    with torch.no_grad():  # sharper weights: greedy texts that vary, not one repeated token
        for param in model.parameters():
            param.mul_(3)
    model = prepare_for_decode(model.eval(), "fp32")
    prompts = make_prompts(args.batch, context, vocab)
    variants = {"this checkout": batch_runner(this_decode, model, prompts, args.new_tokens)}
    for path in args.against:
        variants[f"against {path.name}"] = batch_runner(load_decode(path), model, prompts,
                                                        args.new_tokens)
    texts = {name: run() for name, run in variants.items()}  # (also a warm-up)
    secs: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, run in variants.items():
            start = time.perf_counter()
            run()
            secs[name].append(time.perf_counter() - start)
    print(f"{args.shape}, context {context}, batch {args.batch} (prompt lengths "
          f"{len(prompts[-1])}..{len(prompts[0])}), {args.new_tokens} new tokens, greedy, "
          f"{torch.get_num_threads()} threads, median of {args.repeats}")
    mine = texts["this checkout"]
    for name, s in secs.items():
        med = statistics.median(s)
        same = "" if name == "this checkout" else (
            "  same tokens" if texts[name] == mine else "  OTHER TOKENS")
        print(f"{name:28s} {med * 1e3:9.1f} ms  {args.batch * args.new_tokens / med:8.0f} tok/s"
              f"  (min {min(s) * 1e3:.1f}, max {max(s) * 1e3:.1f}){same}")
    print("tokens of this checkout: sha1 " + hashlib.sha1(str(mine).encode()).hexdigest()[:12])


if __name__ == "__main__":
    main()
