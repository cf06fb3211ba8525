"""Tokenizers: character level and byte-level BPE, saved as a directory with tokenizer.json."""

from __future__ import annotations

import json
from pathlib import Path

from scratchgpt.errors import UserError
from scratchgpt.tokenizers.base import TOKENIZER_FILE, Tokenizer
from scratchgpt.tokenizers.char import CharTokenizer

# kind -> class; a new tokenizer registers itself here.
TOKENIZERS: dict[str, type[Tokenizer]] = {CharTokenizer.kind: CharTokenizer}


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """Load the tokenizer saved in ``directory`` (a dataset or checkpoint directory)."""
    path = Path(directory) / TOKENIZER_FILE
    if not path.is_file():
        raise UserError(f"no tokenizer found: {path} does not exist")
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise UserError(f"{path} is not a valid tokenizer file ({e})") from None
    return tokenizer_from_dict(state, Path(directory), where=str(path))


def tokenizer_from_dict(state: dict, directory: Path | None = None, where: str = "") -> Tokenizer:
    """Rebuild a tokenizer from its saved state (``{"kind": ..., **to_dict()}``)."""
    state = dict(state)
    kind = state.pop("kind", None)
    if kind not in TOKENIZERS:
        raise UserError(f"{where or 'tokenizer'}: unknown tokenizer kind {kind!r}")
    return TOKENIZERS[kind].from_dict(state, directory)


def build_tokenizer(kind: str, text: str, vocab_size: int | None = None) -> Tokenizer:
    """Learn a tokenizer of ``kind`` from ``text``."""
    if kind == "char":
        return CharTokenizer.train(text)
    raise UserError(f"unknown tokenizer {kind!r}; choose from: char")


__all__ = ["TOKENIZERS", "CharTokenizer", "Tokenizer", "build_tokenizer", "load_tokenizer",
           "tokenizer_from_dict"]
