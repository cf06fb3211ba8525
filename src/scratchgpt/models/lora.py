"""LoRA: low-rank adapters on a frozen model's linear layers (Hu et al., 2021), from the equations.

A frozen linear layer ``y = x W^T + b`` (W: (out, in)) gets a trainable low-rank update::

    y = x W^T + b + (alpha / r) * dropout(x) A^T B^T        A: (r, in), B: (out, r)

``B`` starts at zero, so the adapted model starts as the base model exactly; ``A`` starts
kaiming-uniform (as the paper's reference code and peft do). Only ``A`` and ``B`` train:
``r * (in + out)`` numbers instead of ``in * out``. ``alpha / r`` keeps the update's size about
the same when the rank changes. Merging folds the update into the weight,
``W' = W + (alpha / r) B A``: the merged layer computes the same function (without dropout) at
no extra cost.

:class:`LoRALinear` *is* an ``nn.Linear`` (its ``weight``/``bias`` keep their names, so a base
model's state dict loads into an adapted one), plus ``lora_A``, ``lora_B``. Targets name the
GPT's layers: ``qkv`` (``attn.c_attn``), ``attn`` (``attn.c_attn``, ``attn.c_proj``), ``mlp``
(``mlp.c_fc``, ``mlp.c_proj``).

>>> layer = LoRALinear.wrap(nn.Linear(16, 8), rank=2, alpha=4.0)
>>> x = torch.randn(3, 16)
>>> bool(torch.equal(layer(x), F.linear(x, layer.weight, layer.bias)))  # B = 0: the base layer
True
>>> [n for n, p in layer.named_parameters() if p.requires_grad]
['lora_A', 'lora_B']
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from scratchgpt.errors import ConfigError
from scratchgpt.models.configs.lora import GPTLoRAConfig, LoRAConfig
from scratchgpt.models.dropout import Dropout
from scratchgpt.models.gpt import GPT


class LoRALinear(nn.Linear):
    """A frozen ``nn.Linear`` plus a trainable low-rank update (see the module docstring)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, rank: int = 8,
                 alpha: float = 16.0, dropout: float = 0.0):
        super().__init__(in_features, out_features, bias)
        self._add_adapter(rank, alpha, dropout)

    @classmethod
    def wrap(cls, linear: nn.Linear, rank: int, alpha: float,
             dropout: float = 0.0) -> LoRALinear:
        """An adapted layer that shares ``linear``'s weight and bias (no copy)."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.in_features, layer.out_features = linear.in_features, linear.out_features
        layer.weight, layer.bias = linear.weight, linear.bias
        layer._add_adapter(rank, alpha, dropout)
        return layer

    def _add_adapter(self, rank: int, alpha: float, dropout: float) -> None:
        w = self.weight
        self.rank, self.scaling = rank, alpha / rank
        self.lora_A = nn.Parameter(torch.empty(rank, self.in_features, dtype=w.dtype,
                                               device=w.device))
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, rank, dtype=w.dtype,
                                               device=w.device))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # B = 0: starts as the base
        self.lora_dropout = Dropout(dropout)
        self.weight.requires_grad_(False)
        if self.bias is not None:
            self.bias.requires_grad_(False)

    def forward(self, x: Tensor) -> Tensor:
        """x: (..., in) -> (..., out)."""
        y = F.linear(x, self.weight, self.bias)  # the frozen layer, (..., out)
        h = self.lora_dropout(x) @ self.lora_A.t()  # down to rank r, (..., r)
        return y + (h @ self.lora_B.t()) * self.scaling  # up again, scaled, (..., out)

    def delta(self) -> Tensor:
        """The update the adapter adds to the weight: (alpha / r) B A, (out, in)."""
        return (self.lora_B @ self.lora_A) * self.scaling

    def merged(self) -> nn.Linear:
        """A plain ``nn.Linear`` computing the same function (dropout aside)."""
        out = nn.Linear(self.in_features, self.out_features, self.bias is not None,
                        device=self.weight.device, dtype=self.weight.dtype)
        with torch.no_grad():
            out.weight.copy_(self.weight + self.delta().to(self.weight.dtype))
            if self.bias is not None:
                out.bias.copy_(self.bias)
        return out

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.rank}, scaling={self.scaling:g}"


def add_lora(model: nn.Module, cfg: LoRAConfig) -> list[str]:
    """Replace the target ``nn.Linear`` layers of ``model`` by :class:`LoRALinear`s (in place);
    returns their names. Their weights and biases are frozen; nothing else is touched."""
    suffixes = cfg.target_layers()
    names = [name for name, m in model.named_modules()
             if type(m) is nn.Linear and name.endswith(suffixes)]
    if not names:
        raise ConfigError(f"targets must name layers the model has, got {cfg.targets!r} (it "
                          f"has no {', '.join(suffixes)})")
    cfg.check_width(min(min(m.in_features, m.out_features)
                        for m in map(model.get_submodule, names)))
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, LoRALinear.wrap(getattr(parent, child), cfg.rank, cfg.alpha,
                                               cfg.dropout))
    return names


def merge_lora(model: nn.Module) -> int:
    """Fold every adapter of ``model`` into its weight (in place): each :class:`LoRALinear`
    becomes a plain ``nn.Linear`` with ``W + (alpha / r) B A``. Returns how many were merged."""
    merged = 0
    for name, m in list(model.named_modules()):
        if isinstance(m, LoRALinear):
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name), child, m.merged())
            merged += 1
    return merged


def has_lora(model: nn.Module) -> bool:
    return any(isinstance(m, LoRALinear) for m in model.modules())


def freeze_all_but(model: nn.Module, keep: tuple[str, ...]) -> None:
    """Only the parameters whose name contains one of ``keep`` train."""
    for name, p in model.named_parameters():
        p.requires_grad_(any(k in name for k in keep))


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameters (a tied matrix counted once)."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def build_gpt_lora(cfg: GPTLoRAConfig) -> GPT:
    """A :class:`GPT` with adapters: generation, evaluation and export treat it as a GPT."""
    model = GPT(cfg.gpt)
    add_lora(model, cfg.lora)
    freeze_all_but(model, ("lora_",))
    return model
