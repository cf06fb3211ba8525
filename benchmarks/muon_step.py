"""The cost of one Muon update: torch's own ``torch.optim.Muon`` (one matrix at a time) against
scratchgpt's (the matrices of one shape orthogonalized as one batch), on a preset's model.

    python benchmarks/muon_step.py --preset cpu-small --n-layer 2
    python benchmarks/muon_step.py --preset cpu-medium

Both optimizers own the same hidden matrices (those ``--optimizer muon`` gives Muon) with the
same gradients, and compute the Newton-Schulz iteration in bfloat16 (torch's precision; ours
gives the same numbers, bit for bit, which is checked here too). Each round times ``--steps``
updates of each, alternating, so a change of machine load hits both; reported: the median
milliseconds per update over the rounds, and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from scratchgpt.commands.argtypes import positive_int
from scratchgpt.models import build_model, config_fields, model_config
from scratchgpt.training.config import PRESETS
from scratchgpt.training.muon import Muon
from scratchgpt.training.optim import hidden_matrices


def matrices(preset: str, n_layer: int | None) -> list[torch.nn.Parameter]:
    """The hidden matrices of ``preset``'s GPT (65-symbol vocabulary), each with a gradient."""
    p = dict(PRESETS[preset])
    if n_layer:
        p["n_layer"] = n_layer
    fields = config_fields(p["model"]) - {"vocab_size"}
    model = build_model(model_config(p["model"], vocab_size=65,
                                     **{k: v for k, v in p.items() if k in fields}))
    params = hidden_matrices(model)
    gen = torch.Generator().manual_seed(0)
    for w in params:
        w.grad = torch.randn(w.shape, generator=gen) * 1e-3
    return params


def time_steps(opt: torch.optim.Optimizer | Muon, steps: int) -> float:
    t = time.perf_counter()
    for _ in range(steps):
        opt.step()
    return (time.perf_counter() - t) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="cpu-small", choices=sorted(PRESETS))
    ap.add_argument("--n-layer", type=positive_int, default=None,
                    help="override the preset's depth")
    ap.add_argument("--steps", type=positive_int, default=50, help="updates per round (50)")
    ap.add_argument("--rounds", type=positive_int, default=7, help="alternating rounds (7)")
    args = ap.parse_args()
    torch.manual_seed(0)
    ours_params = matrices(args.preset, args.n_layer)
    ref_params = [torch.nn.Parameter(w.detach().clone()) for w in ours_params]
    for a, b in zip(ref_params, ours_params, strict=True):
        a.grad = b.grad.clone()
    kw = dict(lr=1e-3, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    ref = torch.optim.Muon(ref_params, **kw)
    ours = Muon(ours_params, ns_dtype=torch.bfloat16, **kw)
    times: dict[str, list[float]] = {"torch.optim.Muon": [], "scratchgpt Muon": []}
    for _ in range(args.rounds + 1):  # the first round warms up
        times["torch.optim.Muon"].append(time_steps(ref, args.steps))
        times["scratchgpt Muon"].append(time_steps(ours, args.steps))
    same = all(torch.equal(a, b) for a, b in zip(ref_params, ours_params, strict=True))
    shapes = sorted({tuple(sorted(w.shape)) for w in ours_params})
    print(f"{args.preset}{f' --n-layer {args.n_layer}' if args.n_layer else ''}: "
          f"{len(ours_params)} matrices in {len(shapes)} shapes {shapes}, "
          f"{torch.get_num_threads()} threads; weights equal after every update: {same}")
    med = {k: statistics.median(v[1:]) * 1e3 for k, v in times.items()}
    for k, v in med.items():
        print(f"{k:18s} {v:7.2f} ms per update")
    print(f"ratio: {med['torch.optim.Muon'] / med['scratchgpt Muon']:.2f}x")


if __name__ == "__main__":
    main()
