"""A prepared dataset on disk, and random training batches drawn from it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from scratchgpt.data.prepare import META_FILE, META_VERSION
from scratchgpt.errors import DataError
from scratchgpt.tokenizers import Tokenizer, load_tokenizer


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
    ix = ix[rank * batch_size:(rank + 1) * batch_size].numpy()
    window = np.arange(block_size + 1)
    chunk = torch.from_numpy(data[ix[:, None] + window].astype(np.int64))  # (B, T + 1)
    return chunk[:, :-1], chunk[:, 1:]


class TokenDataset:
    """Memory-mapped ``train.bin``/``val.bin`` of a prepared dataset directory."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        meta_path = self.directory / META_FILE
        if not meta_path.is_file():
            raise DataError(
                f"{self.directory} is not a prepared dataset (no {META_FILE}); "
                "run 'scratchgpt prepare' first"
            )
        self.meta = json.loads(meta_path.read_text())
        if self.meta.get("version") != META_VERSION:
            raise DataError(f"{meta_path}: unsupported dataset version {self.meta.get('version')}")
        dtype = np.dtype(self.meta["dtype"])
        self.splits = {}
        for split in ("train", "val"):
            path = self.directory / f"{split}.bin"
            if not path.is_file():
                raise DataError(f"{path} is missing; prepare the dataset again")
            self.splits[split] = np.memmap(path, dtype=dtype, mode="r")
        self.vocab_size: int = int(self.meta["vocab_size"])

    def tokenizer(self) -> Tokenizer:
        return load_tokenizer(self.directory)

    def chars_per_token(self, split: str) -> float:
        """Characters of text per token in ``split``: what turns a loss per token into one per
        character, comparable across tokenizers. From ``meta.json`` (datasets prepared before
        it recorded ``{split}_chars``: by decoding the split)."""
        chars = self.meta.get(f"{split}_chars")
        if chars is None:
            chars = len(self.tokenizer().decode(self.splits[split].tolist()))
        return chars / len(self.splits[split])

    def bits_per_char(self, split: str, loss: float) -> float:
        """A mean loss per token of ``split`` (nats) in bits per character of its text."""
        return loss / self.chars_per_token(split) / math.log(2)

    def check_block_size(self, block_size: int) -> None:
        """Each split must hold more than one context window (+1 for the shifted targets)."""
        for split, data in self.splits.items():
            if len(data) <= block_size:
                raise DataError(
                    f"the {split} split has {len(data)} tokens, fewer than one context window "
                    f"of {block_size} + 1; use more data or a smaller --block-size"
                )

    def get_batch(self, split: str, batch_size: int, block_size: int,
                  generator: torch.Generator,
                  shard: tuple[int, int] = (0, 1)) -> tuple[Tensor, Tensor]:
        """Random windows of ``split``: see :func:`random_windows`."""
        return random_windows(self.splits[split], batch_size, block_size, generator, shard)

    def sequential_batches(self, split: str, batch_size: int, block_size: int):
        """Every non-overlapping window of ``split`` once, in order: the full-split evaluation."""
        data = self.splits[split]
        n = (len(data) - 1) // block_size
        for start in range(0, n, batch_size):
            rows = np.arange(start, min(start + batch_size, n)) * block_size
            window = rows[:, None] + np.arange(block_size + 1)  # (rows, T + 1)
            chunk = torch.from_numpy(data[window].astype(np.int64))
            yield chunk[:, :-1], chunk[:, 1:]
