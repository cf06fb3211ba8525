"""Dropout whose random mask is cheap on a CPU.

Dropout zeroes each element with probability ``p`` and scales the rest by ``1 / (1 - p)``, so
the expected output is the input. PyTorch's CPU dropout draws one random number per element
(``bernoulli_``), which on a 2-core CPU costs more than the matrix product it follows (~6 ns an
element: 2.4 ms for a 16 x 128 x 192 activation). Here one 64-bit draw from torch's generator
gives four 16-bit numbers, and an element is dropped when its number is among the lowest
``round(p * 65536)`` of the 65,536 values: 4x fewer draws and one comparison
(docs/BENCHMARKS.md, "Dropout made cheap on a CPU").

``p`` is thus taken to the nearest multiple of 1/65536 (0.1 drops with probability
0.100006), and the scale is the exact ``1 / (1 - p)`` of that probability, so the output's
expectation is still the input. The draws come from torch's generator, so a seed (and a
resumed run's saved RNG state) gives the same masks every time. On other devices
:func:`dropout` is ``F.dropout``, whose kernels draw their masks on the device.

    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> x = torch.ones(1000, 100)
    >>> y = dropout(x, 0.25)
    >>> round((y == 0).float().mean().item(), 2), round(y.mean().item(), 1)
    (0.25, 1.0)
    >>> sorted(set(y.flatten().tolist()))  # dropped, or kept and scaled by 1 / (1 - 0.25)
    [0.0, 1.3333333730697632]
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

LEVELS = 1 << 16  # each element's random number is one of 65,536 values


def dropped_levels(p: float) -> int:
    """How many of the 65,536 values drop an element: ``p * 65536``, rounded (below 65,536)."""
    return min(round(p * LEVELS), LEVELS - 1)


def quantized_p(p: float) -> float:
    """The probability :func:`drop_mask` really drops with: ``p`` to the nearest 1/65536."""
    return dropped_levels(p) / LEVELS


def drop_mask(shape: torch.Size | tuple[int, ...], p: float,
              generator: torch.Generator | None = None) -> Tensor:
    """A CPU bool tensor of ``shape``, True where an element is dropped (probability
    :func:`quantized_p` of ``p``, independently)."""
    n = math.prod(shape)
    # (n + 3) // 4 full-range 64-bit draws, read as n 16-bit numbers in [-32768, 32767]
    words = torch.empty((n + 3) // 4, dtype=torch.int64).random_(
        -(1 << 63), None, generator=generator)
    numbers = words.view(torch.int16)[:n].view(shape)
    return numbers < dropped_levels(p) - LEVELS // 2  # the lowest dropped_levels(p) values


class _Dropout(torch.autograd.Function):
    """y = x * scale where kept, 0 where dropped; the gradient goes through the same mask.

    Only the bool mask is saved for the backward (1 byte an element)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, drop: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(drop)
        ctx.scale = scale
        return x.masked_fill(drop, 0).mul_(scale)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        (drop,) = ctx.saved_tensors
        return grad.masked_fill(drop, 0).mul_(ctx.scale), None, None


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """``F.dropout(x, p, training)``, with the mask of :func:`drop_mask` on a CPU."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:  # (p = 1 drops everything: F.dropout's zeros)
        return F.dropout(x, p, training)
    drop = drop_mask(x.shape, p)
    return _Dropout.apply(x, drop, 1.0 / (1.0 - quantized_p(p)))


class Dropout(nn.Module):
    """A drop-in for ``nn.Dropout`` (same ``p``, no state) that uses :func:`dropout`."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
