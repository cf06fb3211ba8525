"""Making a trained GPT decode fast on CPU, without changing what it computes.

Decoding one token at a time is bound by memory bandwidth: every step reads every weight once.
Two preparations, chosen by the model's dtype:

* fp32: :meth:`GPT.decode_layout_` stores each weight in the memory order that the one-row
  matrix product streams fastest (a pure layout change).
* bf16 on a CPU whose oneDNN supports it: every ``nn.Linear`` becomes a :class:`PackedLinear`
  holding its weight pre-packed (blocked) for oneDNN's bf16 kernels, which read bf16 weights
  at up to ~1.5x the rate of the generic bf16 matmul. Packed models are for inference only: a
  packed weight cannot be trained or saved (keep the original for that).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def packing_available() -> bool:
    """True when oneDNN can pack bf16 Linear weights on this CPU."""
    try:
        return (torch.backends.mkldnn.is_available()
                and torch.ops.mkldnn._is_mkldnn_bf16_supported()
                and hasattr(torch.ops.mkldnn, "_linear_pointwise"))
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
    it. bf16 -> packed Linear layers (when available); otherwise the decode weight layout.
    Other models are returned unchanged."""
    from scratchgpt.models.gpt import GPT

    if not isinstance(model, GPT):
        return model
    weight = model.lm_head.weight
    if weight.dtype == torch.bfloat16 and weight.device.type == "cpu" and packing_available():
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, PackedLinear(child))
        return model
    return model.decode_layout_()
