"""Recurrent cells from scratch vs torch's fused kernels: training and sampling speed.

For each cell type, one recurrent language model (random weights, a 65-character vocabulary)
runs both ways on the same weights: torch (``train --cells torch``: torch.nn.RNN/LSTM/GRU, a
fused C++ loop over time) and scratch (``train --cells scratch``: the cells of models/rnn.py,
one Python step per token); this benchmark's --cells (rnn, lstm, gru) picks the cells. It
times a training step (forward + backward over --batch-size x --seq-len tokens) and one-token
sampling steps that carry the hidden state, reports tokens/s for both and how many times faster
torch is, and checks that both give the same logits (the largest difference is printed).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

from scratchgpt.bench import JsonOutput, add_json_argument, bench_threads, refuse_repeats
from scratchgpt.commands.argtypes import new_tokens, positive_int
from scratchgpt.wording import plural

VOCAB = 65


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cells", nargs="+", choices=("rnn", "lstm", "gru"),
                   default=["rnn", "lstm", "gru"], help="cell types to time (default: all three)")
    p.add_argument("--hidden", type=positive_int, default=256, help="state width (default 256)")
    p.add_argument("--n-layer", type=positive_int, default=2, help="stacked layers (default 2)")
    p.add_argument("--batch-size", type=positive_int, default=32,
                   help="sequences per training step (default 32)")
    p.add_argument("--seq-len", type=positive_int, default=128,
                   help="time steps per training sequence (default 128)")
    p.add_argument("--decode-tokens", type=new_tokens, default=200,
                   help="one-token sampling steps timed per repeat (default 200)")
    p.add_argument("--repeats", type=positive_int, default=5,
                   help="timed repeats after one warm-up; the median is reported (default 5)")
    p.add_argument("--threads", type=bench_threads, default=1,
                   help="torch CPU threads (default 1; 0 = torch's default)")
    add_json_argument(p)


def _median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up: allocator, kernels
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _time_model(model: Any, args: argparse.Namespace) -> dict[str, float]:
    """tokens/s of a training step and of one-token sampling steps."""
    import torch

    idx = torch.randint(VOCAB, (args.batch_size, args.seq_len),
                        generator=torch.Generator().manual_seed(0))

    def train_step() -> None:
        model.zero_grad(set_to_none=True)
        model(idx).float().logsumexp(-1).mean().backward()

    @torch.inference_mode()
    def decode() -> None:
        state = model.new_cache(1)
        token = idx[:1, :1]  # [1, 1]
        for _ in range(args.decode_tokens):
            token = model(token, state)[:, -1].argmax(-1, keepdim=True)

    train_s = _median_seconds(train_step, args.repeats)
    decode_s = _median_seconds(decode, args.repeats)
    return {"train_tokens_per_s": idx.numel() / train_s,
            "decode_tokens_per_s": args.decode_tokens / decode_s}


def _config(cell: str, args: argparse.Namespace, impl: str = "torch") -> Any:
    from scratchgpt.models.rnn import RecurrentConfig

    return RecurrentConfig(vocab_size=VOCAB, cell=cell, n_layer=args.n_layer,
                           hidden=args.hidden, cells=impl)


def check_fits(args: argparse.Namespace) -> None:
    """Each cell's model, training a batch, fits in memory: checked before any is
    built (a huge --hidden or --seq-len is refused, not an allocation failure)."""
    from scratchgpt import memory

    for cell in args.cells:  # rows of --seq-len tokens: the config's context, as training's
        config = dataclasses.replace(_config(cell, args), block_size=args.seq_len)
        estimate = memory.training_estimate(config, args.batch_size)
        memory.check_fits(estimate, f"timing the {cell}")


def measure(cell: str, args: argparse.Namespace) -> dict[str, Any]:
    """Both implementations of one cell type on the same weights: speed and agreement."""
    import torch

    from scratchgpt.models.rnn import RecurrentLM

    torch.manual_seed(0)
    models = {impl: RecurrentLM(_config(cell, args, impl)) for impl in ("torch", "scratch")}
    models["scratch"].load_state_dict(models["torch"].state_dict())
    probe = torch.randint(VOCAB, (2, min(args.seq_len, 64)))
    with torch.no_grad():
        diff = (models["torch"](probe) - models["scratch"](probe)).abs().max().item()
    row: dict[str, Any] = {"cell": cell, "params": models["torch"].num_params(),
                           "max_abs_logit_diff": diff}
    for impl, model in models.items():
        for key, value in _time_model(model, args).items():
            row[f"{impl}_{key}"] = value
    for key in ("train_tokens_per_s", "decode_tokens_per_s"):
        row[f"torch_speedup_{key.split('_')[0]}"] = row[f"torch_{key}"] / row[f"scratch_{key}"]
    return row


def run(args: argparse.Namespace) -> int:
    refuse_repeats("--cells", args.cells)
    out = JsonOutput(args)
    check_fits(args)
    with out.printing():
        return _run(args, out)


def _run(args: argparse.Namespace, out: JsonOutput) -> int:
    import torch

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    print(f"hidden {args.hidden}, {args.n_layer} layer(s); training {args.batch_size} x "
          f"{args.seq_len} tokens; sampling {args.decode_tokens} tokens; "
          f"{plural(torch.get_num_threads(), 'thread')}, torch {torch.__version__}", flush=True)
    print(f"{'cell':<5} {'train tok/s torch':>18} {'scratch':>9} {'x':>6}   "
          f"{'sample tok/s torch':>18} {'scratch':>9} {'x':>6}   max |dlogit|")
    rows: list[dict[str, Any]] = []
    with out.kept_on_interrupt(lambda: _figures(args, rows) if rows else None):
        for cell in args.cells:
            rows.append(measure(cell, args))
            _print_row(rows[-1])
    out.emit(_figures(args, rows))
    return 0


def _print_row(r: dict[str, Any]) -> None:
    print(f"{r['cell']:<5} {r['torch_train_tokens_per_s']:>18,.0f} "
          f"{r['scratch_train_tokens_per_s']:>9,.0f} {r['torch_speedup_train']:>6.1f}   "
          f"{r['torch_decode_tokens_per_s']:>18,.0f} {r['scratch_decode_tokens_per_s']:>9,.0f} "
          f"{r['torch_speedup_decode']:>6.1f}   {r['max_abs_logit_diff']:.1e}", flush=True)


def _figures(args: argparse.Namespace, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The --json figures: the settings and the rows measured (every cell of --cells, unless
    Ctrl-C or SIGTERM stopped the run)."""
    import torch

    return {"threads": torch.get_num_threads(), "hidden": args.hidden,
            "n_layer": args.n_layer, "batch_size": args.batch_size, "seq_len": args.seq_len,
            "decode_tokens": args.decode_tokens, "repeats": args.repeats, "results": rows}
