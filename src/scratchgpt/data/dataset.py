"""A prepared dataset on disk, and random training batches drawn from it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from scratchgpt.data.prepare import META_FILE, META_VERSION
from scratchgpt.errors import DataError
from scratchgpt.tokenizers import Tokenizer, load_tokenizer
from scratchgpt.validation import FLAGS, json_loads, named
from scratchgpt.wording import plural

IDENTITY_KEYS = ("source_sha256", "train_tokens", "val_tokens")


def random_windows(data: np.ndarray, batch_size: int, block_size: int,
                   generator: torch.Generator,
                   shard: tuple[int, int] = (0, 1)) -> tuple[Tensor, Tensor]:
    """Random windows of the token array ``data``: inputs x (B, T), next-token targets y (B, T),
    int64.

    ``shard=(rank, world)``: draw the global batch of ``batch_size * world`` windows and keep
    rows ``rank * B .. (rank + 1) * B`` (data-parallel training; the generator then advances
    identically in every process).
    """
    rank, world = shard
    ix = torch.randint(len(data) - block_size, (batch_size * world,), generator=generator)
    return windows_at(data, ix[rank * batch_size:(rank + 1) * batch_size].numpy(), block_size)


def windows_at(data: np.ndarray, starts: np.ndarray, block_size: int) -> tuple[Tensor, Tensor]:
    """The windows of ``data`` starting at ``starts`` (B,): inputs x (B, T), next-token targets
    y (B, T), int64."""
    window = np.arange(block_size + 1)
    chunk = torch.from_numpy(data[starts[:, None] + window].astype(np.int64))  # (B, T + 1)
    return chunk[:, :-1], chunk[:, 1:]


CHUNK = 1 << 24  # tokens read at a time when checking a split's ids


def read_meta(directory: Path) -> dict:
    """``meta.json`` of a prepared dataset, its fields checked (one-line DataErrors)."""
    path = directory / META_FILE
    if not path.is_file():
        raise DataError(f"{directory} is not a prepared dataset (no {META_FILE}); "
                        "run 'scratchgpt prepare' first")
    try:
        meta = json_loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{path} is not valid JSON ({e}); prepare the dataset again") from None
    if not isinstance(meta, dict):
        raise DataError(f"{path} holds a JSON {type(meta).__name__}, not the dataset's record")
    if meta.get("version") != META_VERSION:
        raise DataError(f"{path}: unsupported dataset version {meta.get('version')!r}")
    checks = {"vocab_size": lambda v: type(v) is int and v >= 1,
              "dtype": lambda v: v in ("uint16", "uint32"),
              "train_tokens": lambda v: type(v) is int and v >= 0,
              "val_tokens": lambda v: type(v) is int and v >= 0,
              "train_copies": lambda v: type(v) is int and v >= 1}
    for key, ok in checks.items():
        if (key in meta or key in ("vocab_size", "dtype")) and not ok(meta.get(key)):
            raise DataError(f"{path}: {key}={meta.get(key)!r} is not valid; prepare the "
                            "dataset again")
    return meta


def dataset_tokenizer(directory: str | Path, vocab_size: int | None = None) -> Tokenizer:
    """The tokenizer of the prepared dataset in ``directory``, checked against the vocabulary
    its ``meta.json`` records (``vocab_size``, where that was read already), without opening
    its token files."""
    directory = Path(directory)
    if vocab_size is None:
        vocab_size = read_meta(directory)["vocab_size"]
    tok = load_tokenizer(directory)
    if tok.vocab_size != vocab_size:
        raise DataError(f"{directory}: its tokenizer has {tok.vocab_size:,} tokens, "
                        f"meta.json records {vocab_size:,}; prepare the dataset again")
    return tok


class TokenDataset:
    """Memory-mapped ``train.bin``/``val.bin`` of a prepared dataset directory, checked when
    opened: a malformed ``meta.json``, a token file of the wrong size (truncated, or written
    with another dtype) or a token id beyond the vocabulary is a one-line DataError."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.meta = read_meta(self.directory)
        dtype = np.dtype(self.meta["dtype"])
        self.vocab_size: int = self.meta["vocab_size"]
        self.splits = {split: self._open(split, dtype) for split in ("train", "val")}

    def _open(self, split: str, dtype: np.dtype) -> np.ndarray:
        path = self.directory / f"{split}.bin"
        if not path.is_file():
            raise DataError(f"{path} is missing; prepare the dataset again")
        size = path.stat().st_size
        tokens = size // dtype.itemsize
        expected = self.meta.get(f"{split}_tokens", tokens)
        if size == 0 and expected == 0:  # written so, by a prepare that did not refuse it
            raise DataError(f"{path} is empty: the {split} split holds no tokens; prepare the "
                            "dataset again with more text or another validation fraction")
        if size % dtype.itemsize or size == 0 or tokens != expected:
            raise DataError(f"{path} has {size:,} bytes, not the {expected:,} {dtype.name} "
                            "tokens meta.json records (truncated or damaged); prepare the "
                            "dataset again")
        data = np.memmap(path, dtype=dtype, mode="r")
        top = max((int(data[i:i + CHUNK].max()) for i in range(0, len(data), CHUNK)),
                  default=0)
        if top >= self.vocab_size:
            raise DataError(f"{path} holds token id {top}, beyond the vocabulary of "
                            f"{self.vocab_size} (damaged, or tokenized with another "
                            "tokenizer); prepare the dataset again")
        return data

    def tokenizer(self) -> Tokenizer:
        return dataset_tokenizer(self.directory, self.vocab_size)

    def identity(self) -> dict[str, Any]:
        """What tells this dataset from its directory prepared again from another text, or
        split another way: its source's sha256 and each split's tokens (``meta.json``)."""
        return {key: self.meta.get(key) for key in IDENTITY_KEYS}

    def chars_per_token(self, split: str) -> float:
        """Characters of text per token in ``split``: what turns a loss per token into one per
        character, comparable across tokenizers. From ``meta.json`` (datasets prepared before
        it recorded ``{split}_chars``: by decoding the split). A training split of several
        BPE-dropout copies holds its text that many times."""
        chars = self.meta.get(f"{split}_chars")
        if chars is None:
            chars = len(self.tokenizer().decode(self.splits[split].tolist()))
        elif split == "train":
            chars *= self.meta.get("train_copies", 1)
        return chars / len(self.splits[split])

    def bits_per_char(self, split: str, loss: float) -> float:
        """A mean loss per token of ``split`` (nats) in bits per character of its text."""
        return loss / self.chars_per_token(split) / math.log(2)

    def check_block_size(self, block_size: int, fixed: bool = False,
                         options: Mapping[str, str] = FLAGS) -> None:
        """Each split must hold more than one context window (+1 for the shifted targets).
        ``fixed``: the context is a trained model's (no --block-size can change it);
        ``options`` name the setting (validation.FLAGS, or KEYWORDS from Python)."""
        smaller = f" or a smaller {named(options, 'block_size')}"
        remedy = "use more data" + ("" if fixed else smaller)
        for split in self.splits:
            self._windowed(split, block_size, remedy)

    def _windowed(self, split: str, block_size: int,
                  remedy: str = "use more data or a smaller block_size") -> np.ndarray:
        """The tokens of ``split``, which hold a context window of ``block_size`` + 1 (the
        shifted targets), or a DataError ending with ``remedy``."""
        data = self.splits[split]
        if len(data) <= block_size:
            raise DataError(f"the {split} split has {plural(len(data), 'token')}, fewer than "
                            f"one context window of {block_size} + 1; {remedy}")
        return data

    def get_batch(self, split: str, batch_size: int, block_size: int,
                  generator: torch.Generator,
                  shard: tuple[int, int] = (0, 1)) -> tuple[Tensor, Tensor]:
        """Random windows of ``split``: see :func:`random_windows`. A split without one window
        is a DataError (torch's "random_ expects 'from' to be less than 'to'" from Python)."""
        return random_windows(self._windowed(split, block_size), batch_size, block_size,
                              generator, shard)

    def window_count(self, split: str, block_size: int) -> int:
        """How many non-overlapping windows of ``block_size`` (each with its ``block_size`` + 1
        tokens: the targets are shifted by one) ``split`` holds: what a full-split evaluation
        reads."""
        return (len(self.splits[split]) - 1) // block_size

    def sequential_batches(self, split: str, batch_size: int, block_size: int):
        """Every non-overlapping window of ``split`` once, in order: the full-split evaluation.
        A split without one window is a DataError (it gave no batch, and a loss over them
        divided by zero)."""
        data = self._windowed(split, block_size)
        n = self.window_count(split, block_size)
        for start in range(0, n, batch_size):
            rows = np.arange(start, min(start + batch_size, n)) * block_size
            window = rows[:, None] + np.arange(block_size + 1)  # (rows, T + 1)
            chunk = torch.from_numpy(data[window].astype(np.int64))
            yield chunk[:, :-1], chunk[:, 1:]
