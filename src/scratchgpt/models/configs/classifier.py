"""The config of a GPT with a classification head, :class:`GPTClassifierConfig`: plain data,
no torch (the model is ``models/classifier.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from scratchgpt.errors import ConfigError
from scratchgpt.models.configs.gpt import GPTConfig
from scratchgpt.models.configs.lora import LoRAConfig
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
            raise ConfigError(f"train must be one of {', '.join(TRAIN_POLICIES)}, got "
                              f"{self.train!r}")
        if (self.train == "lora") != (self.lora is not None):
            raise ConfigError("train='lora' goes with a LoRA config, and only with one")
        if not 1 <= self.last_k <= self.gpt.n_layer:
            raise ConfigError(f"last_k must be in [1, n_layer = {self.gpt.n_layer}], got "
                              f"{self.last_k}")
        if self.lora is not None:
            self.lora.check_width(self.gpt.n_embd)  # (the GPT's layers it adapts)
