"""Small pieces of the GPT's architecture options: rotary positions, activations, and which
layer reads which value embedding.

Rotary position embedding (RoPE, Su et al. 2021) encodes a token's position by rotating its
query and key inside each head instead of adding a position vector to the input. Feature ``i``
and feature ``i + D/2`` of a head (width ``D``) form a 2-D pair that is turned by the angle
``pos * base ** (-2i / D)``. A dot product of two rotated vectors depends only on the difference
of their positions, so attention sees relative positions::

    >>> import torch
    >>> cos, sin = rope_tables(n_pos=8, head_dim=4)
    >>> q, k = torch.randn(4), torch.randn(4)
    >>> at = lambda x, p: apply_rope(x, cos[p], sin[p])
    >>> torch.allclose(at(q, 5) @ at(k, 3), at(q, 2) @ at(k, 0), atol=1e-6)
    True
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ROPE_BASE = 10000.0  # the original RoPE's base: the slowest pair turns once per ~60k tokens


def rope_tables(n_pos: int, head_dim: int, base: float = ROPE_BASE) -> tuple[Tensor, Tensor]:
    """cos and sin of every position's rotation angles: two float32 tables (n_pos, head_dim // 2).

    The angles are computed in float64: in float32, those of position 4000 would be off by up
    to ~1e-4 radians."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (D/2,)
    angles = torch.arange(n_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]  # (n_pos, D/2)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate each pair (x[..., i], x[..., i + D/2]) by its angle.

    x: (..., T, D); cos, sin: (..., T, D/2), broadcastable to x's leading dimensions
    (e.g. (T, D/2) for every row alike, or (B, 1, T, D/2) for per-row positions)."""
    x1, x2 = x.chunk(2, dim=-1)  # 2 x (..., T, D/2)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)  # (..., T, D)


class ReLUSquared(nn.Module):
    """relu(x)^2 (So et al. 2021, "Primer"): as cheap as ReLU, often better than GELU."""

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(x).square()


def make_activation(name: str) -> nn.Module:
    """The MLP's nonlinearity by its config name: gelu_tanh, gelu, relu or relu2."""
    if name in ("gelu_tanh", "gelu"):
        return nn.GELU(approximate="tanh" if name == "gelu_tanh" else "none")
    return {"relu": nn.ReLU, "relu2": ReLUSquared}[name]()


def value_embed_table(layer: int, n_layer: int, n_tables: int) -> int | None:
    """Which value-embedding table layer ``layer`` mixes into its values (None: none).

    The first ``n_tables`` layers read tables 0, 1, ... and the last ``n_tables`` layers read
    them again in the same order (modded-nanogpt's "012 ... 012" pattern); a layer that is
    both (more tables than half the layers) reads the first.

    >>> [value_embed_table(i, 6, 2) for i in range(6)]
    [0, 1, None, None, 0, 1]
    """
    if layer < n_tables:
        return layer
    if layer >= n_layer - n_tables:
        return layer - (n_layer - n_tables)
    return None
