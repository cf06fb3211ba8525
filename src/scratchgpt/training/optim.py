"""Optimizer, learning-rate schedule and loss: plain functions."""

from __future__ import annotations

import inspect
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean next-token cross-entropy (nats). logits (B, T, V), targets (B, T)."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))


def make_optimizer(model: nn.Module, lr: float, weight_decay: float,
                   betas: tuple[float, float]) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices (>= 2 dims) only, never on biases or LayerNorms.

    Uses the fused (single-kernel) implementation where this PyTorch offers it: it saves one
    Python-level loop over parameters per step, which matters for small models.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    extra = {}
    if "fused" in inspect.signature(torch.optim.AdamW).parameters:
        extra["fused"] = True
    try:
        return torch.optim.AdamW(groups, lr=lr, betas=betas, **extra)
    except (RuntimeError, TypeError):  # fused unsupported for this device/dtype
        return torch.optim.AdamW(groups, lr=lr, betas=betas)


def lr_at(progress_iters: int, warmup: int, lr: float, min_lr: float,
          decay_fraction: float) -> float:
    """Linear warmup for ``warmup`` updates, then cosine from ``lr`` to ``min_lr``.

    ``decay_fraction`` in [0, 1] is how far through the decay we are (by updates, or by wall
    time under a time budget).
    """
    if progress_iters < warmup:
        return lr * (progress_iters + 1) / (warmup + 1)
    d = min(max(decay_fraction, 0.0), 1.0)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * d)) * (lr - min_lr)
