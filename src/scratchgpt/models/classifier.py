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

import torch
from torch import Tensor, nn

from scratchgpt.models.configs.classifier import GPTClassifierConfig
from scratchgpt.models.gpt import GPT
from scratchgpt.models.lora import add_lora, freeze_all_but


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
