"""Text -> tokenizer + memory-mapped token files with a 90/10 train/val split.

A prepared dataset is a directory::

    train.bin   tokens of the first 90% of the text (uint16, or uint32 for vocabularies > 65535)
    val.bin     tokens of the last 10%
    meta.json   tokenizer kind, vocab size, dtype, token and character counts, sha256 of the
                source text
    tokenizer.json (+ any tokenizer files)
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from scratchgpt.errors import DataError
from scratchgpt.tokenizers import Tokenizer, build_tokenizer

META_FILE = "meta.json"
META_VERSION = 1


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds every token id."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def _write_atomic(path: Path, array: np.ndarray) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    array.tofile(tmp)
    os.replace(tmp, path)


def encode_corpus(tok: Tokenizer, text: str) -> list[int]:
    """Encode training text. A literal ``<|endoftext|>`` in a corpus is a document separator
    (as in GPT-2's training data), so byte-level BPE maps it to its special id."""
    from scratchgpt.tokenizers.bpe import BPETokenizer

    if isinstance(tok, BPETokenizer):
        return tok.encode(text, allowed_special="all")
    return tok.encode(text, unknown="replace")


def prepare_text(text: str, out: str | Path, tokenizer: str | Tokenizer = "char",
                 vocab_size: int | None = None, val_fraction: float = 0.1,
                 source: str = "", progress: bool = False) -> dict[str, Any]:
    """Tokenize ``text`` and write a prepared dataset into ``out``. Returns the meta dict."""
    if not text.strip():
        raise DataError(f"the data ({source or 'text'}) is empty")
    if not 0.0 < val_fraction < 1.0:
        raise DataError(f"val_fraction must be in (0, 1), got {val_fraction}")
    out = Path(out)
    split = int(len(text) * (1.0 - val_fraction))
    train_text, val_text = text[:split], text[split:]
    # The tokenizer is learned on the training split only, so validation stays unseen.
    tok = tokenizer if isinstance(tokenizer, Tokenizer) else build_tokenizer(
        tokenizer, train_text, vocab_size=vocab_size)
    dtype = token_dtype(tok.vocab_size)
    train_ids = np.asarray(encode_corpus(tok, train_text), dtype=dtype)
    val_ids = np.asarray(encode_corpus(tok, val_text), dtype=dtype)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(out)
    _write_atomic(out / "train.bin", train_ids)
    _write_atomic(out / "val.bin", val_ids)
    meta = {
        "version": META_VERSION,
        "tokenizer": tok.kind,
        "vocab_size": tok.vocab_size,
        "dtype": dtype.name,
        "train_tokens": int(train_ids.size),
        "val_tokens": int(val_ids.size),
        "chars": len(text),
        "train_chars": len(train_text),
        "val_chars": len(val_text),  # bits per character = nats/token * tokens / chars / ln 2
        "source": source,
        "source_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        "val_fraction": val_fraction,
    }
    (out / META_FILE).write_text(json.dumps(meta, indent=1))
    return meta
