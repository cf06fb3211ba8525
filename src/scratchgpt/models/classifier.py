"""A GPT with a classification head: text -> one of N classes.

    idx (B, T) -> GPT blocks -> ln_f -> hidden state at each row's last real token (B, C)
              -> head: Linear(C, n_classes) -> logits (B, n_classes)

A causal model's last token is the only one that has seen the whole text, so the head reads
it. Rows are right-padded: causal attention keeps the padding after a row's last real token
from reaching it, so ``lengths`` (B,) is all the model needs to be padding-aware, and a row
gives the same logits alone or in a padded batch.

What trains is part of the config (``train``): ``all`` (full fine-tuning), ``head`` (the new
head alone), ``last-k`` (the last ``last_k`` blocks, the final LayerNorm and the head) or
``lora`` (low-rank adapters on the blocks, plus the head; ``models/lora.py``).

>>> from scratchgpt.models.gpt import GPTConfig
>>> cfg = GPTClassifierConfig(GPTConfig(vocab_size=10, n_layer=2, n_head=2, n_embd=8), 3,
...                           train="head")
>>> model = GPTClassifier(cfg)
>>> model(torch.tensor([[1, 2, 3], [4, 5, 0]]), torch.tensor([3, 2])).shape
torch.Size([2, 3])
>>> [n for n, p in model.named_parameters() if p.requires_grad]
['head.weight', 'head.bias']
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from scratchgpt.errors import ConfigError
from scratchgpt.models.gpt import GPT, GPTConfig
from scratchgpt.models.lora import LoRAConfig, add_lora, freeze_all_but
from scratchgpt.validation import refuse_unknown_fields

TRAIN_POLICIES = ("all", "head", "last-k", "lora")


@refuse_unknown_fields
@dataclass
class GPTClassifierConfig:
    """A GPT backbone (``gpt``: its base's config), ``n_classes`` outputs, and what trains."""

    gpt: GPTConfig = field(default_factory=GPTConfig)
    n_classes: int = 2
    train: str = "all"  # one of TRAIN_POLICIES
    last_k: int = 1  # with train="last-k": how many of the last blocks train
    lora: LoRAConfig | None = None  # with train="lora"

    def __post_init__(self) -> None:
        if self.n_classes < 2:
            raise ConfigError(f"a classifier needs at least 2 classes, got {self.n_classes}")
        if self.train not in TRAIN_POLICIES:
            raise ConfigError(f"--train must be one of {', '.join(TRAIN_POLICIES[:3])} (or "
                              f"--lora), got {self.train!r}")
        if (self.train == "lora") != (self.lora is not None):
            raise ConfigError("train='lora' goes with a LoRA config, and only with one")
        if not 1 <= self.last_k <= self.gpt.n_layer:
            raise ConfigError(f"--last-k must be in [1, n_layer = {self.gpt.n_layer}], got "
                              f"{self.last_k}")


class GPTClassifier(nn.Module):
    """``forward(idx, lengths) -> logits (B, n_classes)`` (see the module docstring)."""

    def __init__(self, cfg: GPTClassifierConfig):
        super().__init__()
        self.config = cfg
        self.gpt = GPT(cfg.gpt)
        self.head = nn.Linear(cfg.gpt.n_embd, cfg.n_classes)
        nn.init.normal_(self.head.weight, mean=0.0, std=0.02)
        nn.init.zeros_(self.head.bias)
        if cfg.lora is not None:
            add_lora(self.gpt, cfg.lora)
        freeze_all_but(self, self.trainable_names())

    def trainable_names(self) -> tuple[str, ...]:
        """Name fragments of the parameters that train under the config's policy."""
        cfg = self.config
        if cfg.train == "all":
            return ("",)
        if cfg.train == "lora":
            return ("lora_", "head.")
        if cfg.train == "last-k":
            first = cfg.gpt.n_layer - cfg.last_k
            blocks = tuple(f"gpt.transformer.h.{i}." for i in range(first, cfg.gpt.n_layer))
            return (*blocks, "gpt.transformer.ln_f.", "head.")
        return ("head.",)

    def forward(self, idx: Tensor, lengths: Tensor | None = None) -> Tensor:
        """idx: (B, T) right-padded token ids, lengths: (B,) real tokens per row (None: all
        T) -> logits (B, n_classes)."""
        h = self.gpt.features(idx)  # (B, T, C)
        B, T, _ = h.shape
        last = (torch.full((B,), T, device=idx.device) if lengths is None else lengths) - 1
        h_last = h[torch.arange(B, device=idx.device), last]  # (B, C)
        return self.head(h_last)  # (B, n_classes)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
