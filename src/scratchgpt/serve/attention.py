"""Attention maps for the playground: which earlier tokens each token attends to.

    weights = attention_map(model, ids, layer=3, head=None)   # (T, T): layer 3, mean of heads

Row ``i`` is token ``i``'s attention over tokens ``0..i`` (each row sums to 1; a GPT cannot
look ahead, so everything above the diagonal is 0). ``layer`` / ``head`` None average over all
layers / heads. The weights are the GPT's own (``GPT.forward_with_attention``), as the
``attention`` command plots them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from scratchgpt.errors import GenerationError


def out_of_range(layer: int | None, head: int | None, n_layer: int,
                 n_head: int) -> tuple[str, str] | None:
    """(the field, why) for a layer or head the model does not have; None when both are
    there (or None: the mean)."""
    for name, value, count in (("layer", layer, n_layer), ("head", head, n_head)):
        if value is not None and not 0 <= value < count:
            return name, f"{name} must be in [0, {count - 1}], got {value}"
    return None


def attention_map(model: torch.nn.Module, ids: Sequence[int], layer: int | None,
                  head: int | None) -> Tensor:
    """The (T, T) attention weights of one layer and head (None: the mean over them)."""
    wrong = out_of_range(layer, head, model.config.n_layer, model.config.n_head)
    if wrong is not None:
        raise GenerationError(wrong[1])
    with torch.inference_mode():
        _, weights = model.forward_with_attention(torch.tensor([list(ids)]))
    w = torch.stack(weights)[:, 0].float()  # (n_layer, n_head, T, T)
    w = w.mean(0) if layer is None else w[layer]  # (n_head, T, T)
    return w.mean(0) if head is None else w[head]  # (T, T)
