"""What every scratchgpt optimizer shares: parameter groups, per-parameter state, and saving
both in ``torch.optim``'s own format.

:class:`Optimizer` is the part of ``torch.optim.Optimizer`` that training uses, and no more.
The reason to have it: every ``torch.optim`` optimizer imports ``torch._dynamo`` (the compiler)
the first time it is built or stepped, 1.3-1.7 s of start-up on a 2-core CPU, paid by every
``scratchgpt train`` even when nothing is compiled. A subclass says what one update does
(:meth:`Optimizer.step`); the books are kept here.

The saved form is ``torch.optim``'s, so a checkpoint written by ``torch.optim.AdamW`` or
``torch.optim.Muon`` loads into :class:`~scratchgpt.training.adamw.AdamW` /
:class:`~scratchgpt.training.muon.Muon` and the other way round:

    {"state": {index: {"step": ..., "exp_avg": ...}, ...},
     "param_groups": [{"lr": ..., ..., "params": [index, ...]}, ...]}

where ``index`` numbers the parameters across the groups in order.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor


class Optimizer:
    """Parameter groups (``param_groups``: dicts of settings, each with its ``params``) and
    per-parameter state (``state[p]``: a dict of tensors), as ``torch.optim.Optimizer``.

    ``params``: tensors, or dicts with ``params`` and any settings of their own; the settings a
    group leaves out are taken from ``defaults``. Subclasses implement :meth:`step`.
    """

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]],
                 defaults: dict[str, Any]):
        self.defaults = defaults
        self.state: dict[Tensor, dict[str, Any]] = {}
        self.param_groups: list[dict[str, Any]] = []
        groups = list(params)
        if not groups:
            raise ValueError("the optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    def add_param_group(self, group: dict[str, Any]) -> None:
        """Add a group: its own settings over :attr:`defaults`. A parameter may be in one group
        only (it would otherwise be updated twice a step)."""
        params = group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        owned = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in owned for p in params) or len({id(p) for p in params}) < len(params):
            raise ValueError("a parameter appears in more than one optimizer group")
        self.param_groups.append({**self.defaults, **group, "params": params})

    def step(self) -> None:
        raise NotImplementedError

    @staticmethod
    def with_grad(group: dict[str, Any]) -> list[Tensor]:
        """The group's parameters that have a gradient this step (the others are not updated,
        as in ``torch.optim``: a frozen or unused weight keeps its value and state)."""
        return [p for p in group["params"] if p.grad is not None]

    def __repr__(self) -> str:
        """One line per group: its size and settings (what ``print(opt)`` shows)."""
        lines = [f"  group {i}: {sum(p.numel() for p in g['params']):,} weights in "
                 f"{len(g['params'])} tensors, "
                 + ", ".join(f"{k}={v}" for k, v in g.items() if k != "params")
                 for i, g in enumerate(self.param_groups)]
        return "\n".join([f"{type(self).__name__}(", *lines, ")"])

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the gradients (``None``: their memory is freed until the next backward)."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_().zero_()

    def state_dict(self) -> dict[str, Any]:
        """The state and the groups' settings, parameters named by their index (torch's
        format). The tensors are the optimizer's own, not copies, as in torch."""
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            ids = [index.setdefault(id(p), len(index)) for p in group["params"]]
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": ids})
        state = {index[id(p)]: s for p, s in self.state.items() if id(p) in index}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Take the state and settings of :meth:`state_dict` (or of a ``torch.optim``
        optimizer's): the groups must hold as many parameters as this optimizer's. The
        tensors are copied, moved to their parameter's device and, except the step counts,
        cast to its dtype (torch's rule)."""
        saved = state_dict["param_groups"]
        if len(saved) != len(self.param_groups) or any(
                len(s["params"]) != len(g["params"])
                for s, g in zip(saved, self.param_groups, strict=True)):
            raise ValueError("the saved optimizer state has other parameter groups (their "
                             "number or sizes differ) than this optimizer")
        params = {i: p for s, g in zip(saved, self.param_groups, strict=True)
                  for i, p in zip(s["params"], g["params"], strict=True)}
        self.state = {params[i]: {k: _placed(v, params[i], k) for k, v in s.items()}
                      for i, s in state_dict["state"].items() if i in params}
        self.param_groups = [{**s, "params": g["params"]}
                             for s, g in zip(saved, self.param_groups, strict=True)]


def _placed(value: Any, param: Tensor, key: str) -> Any:
    """A saved state value made ready for ``param``: a copy on its device, in its dtype (the
    step count stays fp32)."""
    if not isinstance(value, Tensor):
        return value
    if key == "step":
        return value.to(device=param.device, dtype=torch.float32, copy=True)
    dtype = param.dtype if param.is_floating_point() and value.is_floating_point() else None
    return value.to(device=param.device, dtype=dtype, copy=True)
