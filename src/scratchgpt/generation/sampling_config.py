"""How to pick the next token: :class:`SamplingConfig`, plain data, no torch here.

The sampling code that applies it (:mod:`scratchgpt.generation.sampling`, which re-exports it)
imports torch; a config, its checks included, does not, so ``scratchgpt.SamplingConfig`` and
the commands that read sampling flags build one without loading torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scratchgpt.errors import GenerationError
from scratchgpt.validation import check_types, refuse_unknown_fields


@refuse_unknown_fields
@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 means greedy (argmax); top_k 0/None and top_p 1.0/None mean off. A
    top_k of the vocabulary's size or more keeps every token, as top_k 0 does (one setting can
    serve models of any vocabulary)."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        check_types(self)  # (top_k 2.5 failed inside torch; "0.8" in a comparison)
        if not 0 <= self.temperature < math.inf:  # (NaN fails too)
            raise GenerationError(f"temperature must be >= 0 and finite, got {self.temperature}")
        if self.top_k is not None and self.top_k < 0:
            raise GenerationError(f"top_k must be >= 0, got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise GenerationError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
