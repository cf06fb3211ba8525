"""The bigram model's hyperparameters, :class:`BigramConfig`: plain data, no torch (the model
is ``models/bigram.py``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from scratchgpt.errors import ConfigError
from scratchgpt.validation import refuse_unknown_fields


@refuse_unknown_fields
@dataclass
class BigramConfig:
    vocab_size: int = 65
    block_size: int = 256  # training sequence length; the model itself has no context limit

    def __post_init__(self) -> None:
        if self.vocab_size < 1 or self.block_size < 1:
            raise ConfigError("vocab_size and block_size must be >= 1")

    def to_dict(self) -> dict:
        return asdict(self)
