"""AdamW (Loshchilov & Hutter), the optimizer of every scratchgpt model's vectors and
embeddings, and of whole models under ``--optimizer adamw``.

For each parameter ``p`` with gradient ``g``, at update ``t`` (from 1)::

    m = beta1 m + (1 - beta1) g                     # momentum: an average of gradients
    v = beta2 v + (1 - beta2) g^2                   # an average of their squares
    p = p (1 - lr wd)                               # decoupled weight decay
    p = p - lr (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)

The update runs as PyTorch's fused kernel (``torch._fused_adamw_``, one call for all the
parameters of a group: what ``torch.optim.AdamW(fused=True)`` runs, bit for bit), or, where
this PyTorch has no fused kernel for the device, as the lines above on lists of tensors
(``torch._foreach_*``, as ``torch.optim.AdamW(foreach=True)``).

>>> w = torch.nn.Parameter(torch.ones(3))
>>> opt = AdamW([w], lr=0.1, weight_decay=0.0)
>>> w.grad = torch.tensor([1.0, -2.0, 0.0])
>>> opt.step()  # the first step moves each weight by lr times the sign of its gradient
>>> w.detach()
tensor([0.9000, 1.1000, 1.0000])
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from scratchgpt.training.optimizer import Optimizer

# (device type, dtype) pairs this PyTorch has no fused AdamW kernel for: the lines of the
# module docstring run there instead
_NO_FUSED_KERNEL: set[tuple[str, torch.dtype]] = set()


class AdamW(Optimizer):
    """AdamW over ``params`` (tensors or groups), with ``torch.optim.AdamW``'s defaults and
    state (``step``, ``exp_avg``, ``exp_avg_sq`` per parameter)."""

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps,
                                  "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            params = self.with_grad(group)
            # the fused kernel takes one device and dtype per call
            by_kind: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
            for p in params:
                by_kind.setdefault((p.device, p.dtype), []).append(p)
            for same in by_kind.values():
                self._update(same, group)

    def _update(self, params: list[Tensor], group: dict[str, Any]) -> None:
        states = [self._state(p) for p in params]
        grads = [p.grad for p in params]
        m, v, steps = ([s[k] for s in states] for k in ("exp_avg", "exp_avg_sq", "step"))
        torch._foreach_add_(steps, 1)
        beta1, beta2 = group["betas"]
        kind = (params[0].device.type, params[0].dtype)
        if kind not in _NO_FUSED_KERNEL:
            try:
                torch._fused_adamw_(params, grads, m, v, [], steps, amsgrad=False,
                                    lr=group["lr"], beta1=beta1, beta2=beta2,
                                    weight_decay=group["weight_decay"], eps=group["eps"],
                                    maximize=False)
                return
            except (RuntimeError, NotImplementedError):
                _NO_FUSED_KERNEL.add(kind)  # asked once: every later step goes straight on
        _written_out(params, grads, m, v, steps, group["lr"], beta1, beta2,
                     group["weight_decay"], group["eps"])

    def _state(self, p: Tensor) -> dict[str, Tensor]:
        state = self.state.get(p)
        if state is None:  # the first update: zero averages, no steps taken
            state = self.state[p] = {
                "step": torch.zeros((), dtype=torch.float32, device=p.device),
                "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
        return state


def _written_out(params: list[Tensor], grads: list[Tensor], m: list[Tensor], v: list[Tensor],
                 steps: list[Tensor], lr: float, beta1: float, beta2: float,
                 weight_decay: float, eps: float) -> None:
    """The update of the module docstring, one ``_foreach`` call per line."""
    torch._foreach_lerp_(m, grads, 1 - beta1)
    torch._foreach_mul_(v, beta2)
    torch._foreach_addcmul_(v, grads, grads, 1 - beta2)
    torch._foreach_mul_(params, 1 - lr * weight_decay)
    for p, m_, v_, t in zip(params, m, v, steps, strict=True):
        step = t.item()
        denom = (v_ / (1 - beta2 ** step)).sqrt_().add_(eps)
        p.addcdiv_(m_, denom, value=-lr / (1 - beta1 ** step))
