"""Making a trained GPT decode fast on CPU, without changing what it computes.

Decoding one token at a time is bound by memory bandwidth: every step reads every weight once.
Two preparations, chosen by the model's dtype:

* With oneDNN (bf16 where the CPU supports it, and fp32): every ``nn.Linear`` becomes a
  :class:`PackedLinear` holding its weight pre-packed (blocked) for oneDNN's kernels. At batch
  1 they stream weights faster than the generic matmul: bf16 up to ~1.5x; fp32 lm_head 34.5 vs
  20.4 GB/s (the best plain layout), and GPT-2 124M decodes at 43.0 vs 38.6 tok/s with all
  Linears packed vs only the wide ones (docs/BENCHMARKS.md).
* otherwise: :meth:`GPT.decode_layout_` stores each weight in the memory order that the
  one-row matrix product streams fastest (a pure layout change).

Packed models are for inference only: a packed weight cannot be trained or saved (keep the
original for that).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def packing_available(dtype: torch.dtype = torch.bfloat16) -> bool:
    """True when oneDNN can pack Linear weights of ``dtype`` on this CPU."""
    try:
        if not (torch.backends.mkldnn.is_available()
                and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
            return False
        return dtype == torch.float32 or (dtype == torch.bfloat16
                                          and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


class PackedLinear(nn.Module):
    """``nn.Linear`` with its weight pre-packed by oneDNN for batch-1 bf16 products."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach().contiguous()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w, 1)  # opaque blocked layout
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.dtype = w.dtype

    def forward(self, x: Tensor) -> Tensor:
        """x: (..., in_features) -> (..., out_features)."""
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def optimize_for_decode(model: nn.Module) -> nn.Module:
    """Prepare a GPT (already cast to its inference dtype, on CPU) for fast decoding; returns
    it. With oneDNN (fp32, or bf16 where supported): every Linear packed; otherwise the decode
    weight layout. Other models are returned unchanged."""
    from scratchgpt.models.gpt import GPT

    if not isinstance(model, GPT):
        return model
    weight = model.lm_head.weight
    if weight.device.type == "cpu" and packing_available(weight.dtype):
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, PackedLinear(child))
        return model
    return model.decode_layout_()
