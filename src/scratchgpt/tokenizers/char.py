"""Character-level tokenizer: one id per distinct character of the training text."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scratchgpt.errors import UserError
from scratchgpt.tokenizers.base import Tokenizer


class CharTokenizer(Tokenizer):
    """Vocabulary = the sorted set of characters seen in the training text."""

    kind = "char"

    def __init__(self, chars: Sequence[str]):
        if len(set(chars)) != len(chars):
            raise UserError("character vocabulary has duplicate entries")
        if not chars:
            raise UserError("character vocabulary is empty")
        self.chars = list(chars)
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @classmethod
    def train(cls, text: str) -> CharTokenizer:
        """Build the vocabulary from ``text``."""
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def _replacement(self) -> int:
        for c in ("?", " ", "_"):
            if c in self.stoi:
                return self.stoi[c]
        return 0

    def encode(self, text: str, unknown: str = "error") -> list[int]:
        stoi = self.stoi
        try:
            return [stoi[c] for c in text]
        except KeyError:
            pass
        missing = sorted({c for c in text if c not in stoi})
        if unknown == "replace":
            rep = self._replacement()
            return [stoi.get(c, rep) for c in text]
        shown = ", ".join(repr(c) for c in missing[:10])
        more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        raise UserError(
            f"text has {len(missing)} character(s) not in the vocabulary: {shown}{more} "
            "(use --unknown replace to substitute them)"
        )

    def decode(self, ids: Sequence[int]) -> str:
        chars = self.chars
        return "".join(chars[i] for i in ids)

    def to_dict(self) -> dict[str, Any]:
        return {"chars": self.chars}

    @classmethod
    def from_dict(cls, d: dict[str, Any], directory: Path | None = None) -> CharTokenizer:
        return cls(d["chars"])
