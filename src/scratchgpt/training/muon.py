"""Muon (Keller Jordan et al.): momentum, then each update matrix orthogonalized, for the
hidden matrices of a network (``--optimizer muon``; the other parameters stay with AdamW).

For a weight matrix ``W`` with gradient ``G``::

    B = momentum B + (1 - momentum) G               # the momentum buffer
    U = momentum B + (1 - momentum) G               # Nesterov's look-ahead (or U = B)
    O = newton_schulz(U)                            # ~ the orthogonal factor of U's SVD
    W = W (1 - lr wd) - lr ratio(W) O               # decoupled weight decay, then the step

``ratio`` rescales the step to a matrix's shape (``adjust_lr_fn``, as ``torch.optim.Muon``).
The state, one ``momentum_buffer`` per matrix, is ``torch.optim.Muon``'s.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from scratchgpt.training.optimizer import Optimizer

# torch.optim.Muon's defaults: the quintic iteration's coefficients, its steps, its epsilon
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
EPS = 1e-7


def newton_schulz(g: Tensor, coefficients: tuple[float, float, float], steps: int,
                  eps: float, dtype: torch.dtype) -> Tensor:
    """Muon's orthogonalization: the quintic Newton-Schulz iteration that maps a matrix G (m, n)
    to about U V^T (its SVD's singular values pushed towards 1), computed in ``dtype``.

    ``g`` may be a batch (B, m, n) of matrices of one shape: one batched product per line below
    instead of one per matrix, which is what a small model's many small matrices need. The same
    iteration as ``torch.optim.Muon``'s, which always computes in bfloat16 (and, in bfloat16,
    the same numbers: a batched product rounds as a single one does).
    """
    a, b, c = coefficients
    x = g.to(dtype).reshape(-1, *g.shape[-2:])  # (B, m, n); one matrix is a batch of one
    tall = g.size(-2) > g.size(-1)
    if tall:
        x = x.mT  # (B, n, m): the Gram matrices below are the smaller side's
    norm = torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True)  # (B, 1, 1)
    x = x / norm.clamp(min=eps)  # spectral norm <= Frobenius norm <= 1
    for _ in range(steps):
        gram = x @ x.mT  # (B, k, k), k = min(m, n)
        update = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)  # b A + c A^2
        x = torch.baddbmm(x, update, x, beta=a)  # a X + (b A + c A^2) X
    return (x.mT if tall else x).reshape(g.shape)


def orthogonalize(updates: list[Tensor], coefficients: tuple[float, float, float], steps: int,
                  eps: float, dtype: torch.dtype) -> list[Tensor]:
    """:func:`newton_schulz` of every matrix in ``updates``, those of one shape (up to a
    transpose) as one batch; returned in ``updates``' order, in ``dtype``.

    A GPT's blocks repeat the same few shapes, so a model of L layers needs ~4 batched
    iterations instead of 4 L small ones (at cpu-small's size each product is tens of
    microseconds, and the calls, not the arithmetic, were most of Muon's step).
    """
    groups: dict[tuple[int, int], list[int]] = {}
    for i, u in enumerate(updates):
        groups.setdefault((min(u.shape), max(u.shape)), []).append(i)
    out: list[Tensor] = [updates[0]] * len(updates)
    for members in groups.values():
        wide = [updates[i].mT if updates[i].size(0) > updates[i].size(1) else updates[i]
                for i in members]  # each (k, n), k <= n
        batch = newton_schulz(torch.stack(wide), coefficients, steps, eps, dtype)  # (B, k, n)
        for i, x in zip(members, batch.unbind(0), strict=True):
            out[i] = x.mT if updates[i].size(0) > updates[i].size(1) else x
    return out


class Muon(Optimizer):
    """``torch.optim.Muon``'s update and defaults, with the Newton-Schulz iteration in
    ``ns_dtype`` and batched.

    torch's Muon always orthogonalizes in bfloat16, which a CPU without bf16 instructions (AVX2)
    emulates: there it costs far more than the training step itself (16 matrices of the
    cpu-small model: ~800 ms in bf16 against ~43 ms in fp32, one thread). With
    ``ns_dtype=torch.float32`` the update is the same up to rounding (closer to the exact
    iteration); with bfloat16 it is torch's own step, bit for bit. torch updates one matrix at
    a time; here the matrices of one shape share each product (:func:`orthogonalize`), and the
    momentum and weight decay are one call for all (``_foreach``). The state (one momentum
    buffer per matrix) is torch's, so a run may resume in either precision.
    """

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]], lr: float = 1e-3,
                 weight_decay: float = 0.1, momentum: float = 0.95, nesterov: bool = True,
                 ns_coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
                 eps: float = EPS, ns_steps: int = NS_STEPS, adjust_lr_fn: str | None = None,
                 ns_dtype: torch.dtype = torch.bfloat16):
        if adjust_lr_fn not in (None, "original", "match_rms_adamw"):
            raise ValueError(f"adjust_lr_fn must be None, original or match_rms_adamw, got "
                             f"{adjust_lr_fn!r}")
        super().__init__(params, {
            "lr": lr, "weight_decay": weight_decay, "momentum": momentum, "nesterov": nesterov,
            "ns_coefficients": ns_coefficients, "eps": eps, "ns_steps": ns_steps,
            "adjust_lr_fn": adjust_lr_fn})
        shapes = [tuple(p.shape) for g in self.param_groups for p in g["params"] if p.ndim != 2]
        if shapes:
            raise ValueError(f"Muon updates matrices only, got parameters of shape {shapes}")
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            params = self.with_grad(group)
            if params:
                self._update(params, group)

    def _update(self, params: list[Tensor], group: dict[str, Any]) -> None:
        """torch's Muon step for a group's matrices, as one batch per shape."""
        momentum, lr = group["momentum"], group["lr"]
        grads = [p.grad for p in params]
        for p in params:  # the first update: a zero buffer
            if p not in self.state:
                self.state[p] = {"momentum_buffer": torch.zeros_like(p.grad)}
        bufs = [self.state[p]["momentum_buffer"] for p in params]
        torch._foreach_lerp_(bufs, grads, 1 - momentum)  # momentum: an average of gradients
        updates = torch._foreach_lerp(grads, bufs, momentum) if group["nesterov"] else bufs
        updates = orthogonalize(updates, group["ns_coefficients"], group["ns_steps"],
                                group["eps"], self.ns_dtype)
        torch._foreach_mul_(params, 1 - lr * group["weight_decay"])  # decoupled weight decay
        for p, update in zip(params, updates, strict=True):
            p.add_(update.to(p.dtype), alpha=-lr * _muon_lr_ratio(group["adjust_lr_fn"], p.shape))


def _muon_lr_ratio(adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """Muon's rate multiplier for a matrix of ``shape`` (as ``torch.optim.Muon``):
    ``match_rms_adamw`` gives its update the RMS of an AdamW update (0.2 sqrt(max side))."""
    rows, cols = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return math.sqrt(max(1, rows / cols))
    return 0.2 * math.sqrt(max(rows, cols)) if adjust_lr_fn == "match_rms_adamw" else 1.0
