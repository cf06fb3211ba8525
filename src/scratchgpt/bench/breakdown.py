"""Where a training step's time goes: its operators' own time, by kind.

Runs a step function a few times under ``torch.profiler`` and sums each PyTorch operator's
*self* time (the time in that operator, not in the operators it calls) into kinds:

- products: matrix multiplications (``mm``, ``addmm``, ``bmm``, ..., and a fused block's on AMX
  tiles), the work FLOP/s counts;
- attention: the fused attention kernel, PyTorch's or scratchgpt's (forward and backward);
- casts: precision changes and copies (``_to_copy``, ``copy_``; the weights laid out for AMX
  tiles): autocast's price;
- activation, normalization, loss: the elementwise layers between the products (a fused
  block's C kernels, ``block_ops.*``, by what they do; its residual adds are other ops);
- block kernel: a fused block's forward or backward as one C call (``block_kernel.*``: its
  products, attention and elementwise work together; the ``-calls`` variant shows them apart);
- clip + optimizer: the gradient norm and the update;
- autograd: the backward engine's own bookkeeping (``...Backward0`` nodes; a block that trains
  as one function, ``_BlockBackward``, counts its backward's Python here);
- other ops: every remaining operator (views, adds, embeddings, allocations; the Python of a
  fused block's forward, ``_Block``);
- outside ops: the wall time in no operator at all, Python's share (the loop, the modules'
  ``forward`` calls).

The profiler adds a few microseconds to every operator, so a profiled step is slower than a
timed one: read the shares, not the milliseconds, and time with ``scratchgpt bench train``.

>>> import torch
>>> w = torch.randn(64, 64, requires_grad=True)
>>> parts = step_breakdown(lambda: (torch.randn(32, 64) @ w).square().sum().backward(), 3)
>>> parts["products"] > 0 and abs(sum(parts[k] for k in ORDER) - parts["total"]) < 1e-9
True
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator

# (kind, names): an operator is of the first kind with its exact name (``aten::...``) or with
# one of the other words in its name
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("attention", ("scaled_dot_product", "flash_attention", "_Attention", "attention_kernel")),
    ("autograd", ("autograd::", "Backward")),
    ("products", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul",
                  "aten::linear", "aten::_addmm_activation", "tile_matmul.linear",
                  "tile_matmul.input_grad", "tile_matmul.weight_grad")),
    ("casts", ("aten::_to_copy", "aten::copy_", "aten::to", "block_ops.to_", "tile_matmul.pack")),
    ("activation", ("gelu", "relu", "silu", "tanh", "sigmoid", "block_ops.activat")),
    ("normalization", ("layer_norm", "rms_norm")),
    ("loss", ("log_softmax", "nll_loss", "cross_entropy")),
    ("clip + optimizer", ("adam", "_foreach", "vector_norm", "newton", "muon")),
    ("block kernel", ("block_kernel.",)),
)
ORDER = ("block kernel", "products", "attention", "casts", "activation", "normalization", "loss",
         "clip + optimizer", "autograd", "other ops", "outside ops")


def kind_of(name: str) -> str:
    """The kind of an operator, by its profiler name (``aten::mm`` -> products)."""
    for kind, words in KINDS:
        if any(name == w if w.startswith("aten::") else w in name for w in words):
            return kind
    return "other ops"


def step_breakdown(step: Callable[[], object], steps: int = 20) -> dict[str, float]:
    """Milliseconds per step of each kind (:data:`ORDER`) over ``steps`` profiled calls of
    ``step``, and ``total``: the profiled wall time per step (the kinds sum to it)."""
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU])
    with _quiet_stderr():  # the profiler's C++ side logs a line as it starts, and as it stops
        prof.start()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    wall_ms = (time.perf_counter() - start) * 1e3
    with _quiet_stderr():
        prof.stop()
    parts = dict.fromkeys(ORDER, 0.0)
    for event in prof.key_averages():
        parts[kind_of(event.key)] += event.self_cpu_time_total / 1e3  # us -> ms
    parts["outside ops"] = max(wall_ms - sum(parts.values()), 0.0)
    per_step = {k: v / steps for k, v in parts.items()}
    per_step["total"] = sum(per_step.values())
    return per_step


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 sent to /dev/null inside the block (C++ writes there directly)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def format_breakdown(name: str, parts: dict[str, float], what: str = "time") -> list[str]:
    """Table lines: each kind's ms per profiled step and share, largest first; ``what`` the
    step's time, or a part of it (each kind's share is then of that part)."""
    total = parts["total"]
    lines = [f"where a {name} step's {what} goes (profiled: {total:.2f} ms/step with the "
             "profiler's own cost)"]
    for kind in sorted(ORDER, key=lambda k: -parts[k]):
        lines.append(f"  {kind:18s} {parts[kind]:7.2f} ms {parts[kind] / total:6.1%}")
    return lines
