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
        kind = state.pop("kind")
    except (ValueError, KeyError) as e:
        raise UserError(f"{path} is not a valid tokenizer file ({e})") from None
    if kind not in TOKENIZERS:
        raise UserError(f"{path}: unknown tokenizer kind {kind!r}")
    return TOKENIZERS[kind].from_dict(state, Path(directory))


__all__ = ["Tokenizer", "CharTokenizer", "TOKENIZERS", "load_tokenizer"]
