"""The bigram language model: the next token depends only on the current one.

It is the baseline every tutorial starts from: a (vocab x vocab) table of logits. It shares the
GPT's interface (``forward(idx, cache=None) -> logits``) so that training, sampling and
evaluation treat both alike.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from scratchgpt.models.configs.bigram import BigramConfig


class PositionCache:
    """The bigram model needs no memory of the past; this only tracks how many tokens were fed
    (a :class:`~scratchgpt.models.cache.DecodeCache` with nothing in it)."""

    rewinds = True

    def __init__(self, batch_size: int, max_len: int | None = None):
        self.batch_size, self.max_len, self.pos = batch_size, max_len, 0
        self.n_pad = torch.zeros(batch_size, dtype=torch.long)  # (B,): kept for pad_counts

    def rollback(self, pos: int) -> None:
        if not 0 <= pos <= self.pos:
            raise ValueError(f"cannot roll back to {pos}: cache holds {self.pos} positions")
        self.pos = pos

    def left_pad(self, n_pad: Tensor | None) -> None:
        """Batched prompts of different lengths: padding changes nothing for a bigram (the
        counts are only remembered)."""
        self.n_pad = torch.zeros(self.batch_size, dtype=torch.long) if n_pad is None else n_pad

    def select_rows(self, rows: Tensor) -> None:
        self.batch_size, self.n_pad = len(rows), self.n_pad[rows]

    def pad_counts(self) -> Tensor:
        return self.n_pad

    def append_rows(self, other: PositionCache) -> None:
        pos = max(self.pos, other.pos)
        self.n_pad = torch.cat([self.n_pad + pos - self.pos, other.n_pad + pos - other.pos])
        self.batch_size, self.pos = self.batch_size + other.batch_size, pos

    def trim(self, n: int) -> None:
        if bool((self.n_pad < n).any()):
            raise ValueError(f"cannot trim {n} positions: every row must have that much padding")
        self.n_pad, self.pos = self.n_pad - n, self.pos - n


class BigramLM(nn.Module):
    """logits[b, t] = table[idx[b, t]]."""

    def __init__(self, cfg: BigramConfig):
        super().__init__()
        self.config = cfg
        self.table = nn.Embedding(cfg.vocab_size, cfg.vocab_size)
        nn.init.normal_(self.table.weight, std=0.02)

    def num_params(self, non_embedding: bool = False) -> int:
        return self.table.weight.numel()

    def new_cache(self, batch_size: int, max_len: int | None = None, dtype=None) -> PositionCache:
        """A cache for ``batch_size`` sequences; unlimited length unless ``max_len`` is given
        (the model itself has no context limit)."""
        return PositionCache(batch_size, max_len)

    def forward(self, idx: Tensor, cache: PositionCache | None = None,
                last_only: bool = False) -> Tensor:
        """idx: (B, T) -> logits (B, T, vocab_size); (B, 1, vocab_size) with ``last_only``."""
        if cache is not None:
            cache.pos += idx.shape[1]
        return self.table(idx[:, -1:] if last_only else idx)
