"""The tokenizer interface every tokenizer implements.

A tokenizer maps text to a list of integer ids and back. It is saved as a directory holding
``tokenizer.json`` (whose ``"kind"`` names the class) plus any files the kind needs, so that a
prepared dataset and every checkpoint carry the exact tokenizer they were made with.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from scratchgpt.errors import TokenizerError

TOKENIZER_FILE = "tokenizer.json"
UNKNOWN_POLICIES = ("error", "replace")


def check_unknown_policy(unknown: str) -> None:
    """``unknown`` is one of :data:`UNKNOWN_POLICIES`, whatever the text holds.

    >>> check_unknown_policy("ignore")
    Traceback (most recent call last):
    ...
    scratchgpt.errors.TokenizerError: unknown='ignore': expected 'error' or 'replace'
    """
    if unknown not in UNKNOWN_POLICIES:
        raise TokenizerError(f"unknown={unknown!r}: expected 'error' or 'replace'")


class Tokenizer(ABC):
    """Base class: ``encode``/``decode`` plus ``to_dict``/``from_dict`` for persistence."""

    kind: ClassVar[str]

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of distinct token ids (ids are ``0 .. vocab_size - 1``)."""

    @abstractmethod
    def encode(self, text: str, unknown: str = "error") -> list[int]:
        """Text -> token ids. ``unknown`` is the policy for text the vocabulary cannot express:
        ``"error"`` raises :class:`~scratchgpt.errors.TokenizerError` naming it, ``"replace"``
        substitutes a replacement token. Byte-level tokenizers never meet unknown text."""

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Token ids -> text."""

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable state; must contain everything ``from_dict`` needs."""

    @classmethod
    @abstractmethod
    def from_dict(cls, d: dict[str, Any], directory: Path | None = None) -> Tokenizer:
        """Rebuild from ``to_dict`` output; ``directory`` is where extra files live, if any."""

    def same_as(self, other: Tokenizer) -> bool:
        """True when ``other`` maps every text to the same ids as this tokenizer, and back:
        the same kind and vocabulary, whatever each is called."""
        return self.state() == other.state()

    def unknown_count(self, text: str) -> int:
        """How many characters of ``text`` the vocabulary lacks: those ``encode(text,
        unknown="replace")`` substitutes. None here: a byte-level vocabulary spells any
        text."""
        return 0

    @property
    def eot_id(self) -> int | None:
        """The end-of-text token id, if the tokenizer has one."""
        return None

    def state(self) -> dict[str, Any]:
        """What ``tokenizer.json`` holds: ``to_dict()`` tagged with the tokenizer's kind."""
        return {"kind": self.kind, **self.to_dict()}

    def save(self, directory: str | Path) -> None:
        """Write ``tokenizer.json`` (and any extra files) into ``directory``."""
        # (encoded before the file is opened: a state UTF-8 cannot spell leaves no empty file)
        data = json.dumps(self.state(), ensure_ascii=False, indent=1).encode("utf-8")
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / TOKENIZER_FILE).write_bytes(data)
