"""Position encodings shared by the models."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def sinusoidal_positions(n_pos: int, dim: int) -> Tensor:
    """The fixed sin/cos position table of "Attention Is All You Need": (n_pos, dim).

    ``PE[p, 2i] = sin(p / 10000^(2i/dim))`` and ``PE[p, 2i+1] = cos(p / 10000^(2i/dim))``.

    >>> sinusoidal_positions(3, 4)[0].tolist()
    [0.0, 1.0, 0.0, 1.0]
    """
    pos = torch.arange(n_pos, dtype=torch.float32)[:, None]  # (n_pos, 1)
    inv_freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(n_pos, dim)
    table[:, 0::2] = torch.sin(pos * inv_freq)
    table[:, 1::2] = torch.cos(pos * inv_freq[: dim // 2])
    return table
