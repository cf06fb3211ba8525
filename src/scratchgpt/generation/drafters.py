"""Where speculative decoding's draft tokens come from.

A drafter proposes up to ``k`` tokens to continue the sequence, together with the distribution
each was drawn from, so the verification rule can keep the output exactly the target's
(:func:`scratchgpt.generation.speculative.accept_or_resample`). Two kinds:

* :class:`ModelDrafter`: a small language model with the same vocabulary samples them, with
  the same sampling settings (Leviathan et al. 2023, Chen et al. 2023);
* :class:`NgramDrafter` (prompt lookup): the tokens that followed the latest earlier
  occurrence of the sequence's last n tokens, copied; no model at all. The proposal is
  deterministic (a point mass), which the rule handles exactly too. It pays off where the
  output repeats its input: quoting, copying code, extracting from a document.

Example, with the sequence so far ``seq`` (token ids)::

    NgramDrafter().propose([5, 6, 7, 1, 5, 6], 3)   # -> ([7, 1, 5], None): 5 6 was seen before
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from scratchgpt.errors import GenerationError
from scratchgpt.generation.decode import context_length, decode_n_tokens, slide_keep, window_start
from scratchgpt.generation.sampling import SamplingConfig
from scratchgpt.models.cache import CachedLM


class Drafter(Protocol):
    """Proposes draft tokens; told after each round which prefix of the sequence is final."""

    def propose(self, seq: list[int], k: int) -> tuple[list[int], Tensor | None]:
        """Up to ``k`` (>= 1) tokens continuing ``seq``, and the distribution each was drawn
        from, (n, V) float32 with the sampling settings applied; None when the proposals are
        point masses (deterministic, or greedy)."""
        ...

    def keep(self, n: int) -> None:
        """``seq[:n]`` is final: forget anything fed beyond it (rejected drafts)."""
        ...


class ModelDrafter:
    """Draft tokens sampled from a small model, which keeps its own cache and context window
    (its window affects speed only, never the output distribution)."""

    def __init__(self, model: CachedLM, cfg: SamplingConfig,
                 generator: torch.Generator | None = None):
        self.model, self.cfg, self.generator = model, cfg, generator
        self.ctx = context_length(model)
        self.cache = model.new_cache(1, self.ctx)
        if not self.cache.rewinds:
            raise GenerationError("the draft model's cache cannot roll back (a recurrent "
                                  "model); use a GPT or bigram draft, or --draft ngram")
        self.start = 0  # the cache holds seq[start : start + cache.pos]

    def propose(self, seq: list[int], k: int) -> tuple[list[int], Tensor | None]:
        n = len(seq)
        if self.ctx is not None:  # feeding up to seq[n + k - 2] must fit the window
            k = min(k, slide_keep(self.ctx))
            start = window_start(self.start, n + k - 1, self.ctx)
            if start != self.start:
                self.start = start
                self.cache.rollback(0)
        behind = torch.tensor([seq[self.start + self.cache.pos: n]])  # (1, >= 1) not yet fed
        tokens, probs = decode_n_tokens(self.model, self.cache, behind, k, self.cfg,
                                        self.generator)
        return tokens[0].tolist(), None if probs is None else probs[0]

    def keep(self, n: int) -> None:
        if self.start + self.cache.pos > n:
            self.cache.rollback(n - self.start)


class NgramDrafter:
    """Prompt lookup: find the latest earlier occurrence of the sequence's last ``n`` tokens
    (``n`` from ``max_n`` down to ``min_n``) and propose the tokens that followed it.

    An index from each n-gram to the end of its latest occurrence grows with the sequence, so
    a lookup costs O(max_n), however long the context.
    """

    def __init__(self, max_n: int = 3, min_n: int = 1):
        if not 1 <= min_n <= max_n:
            raise GenerationError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.max_n, self.min_n = max_n, min_n
        self.index: dict[tuple[int, ...], int] = {}  # n-gram -> index of its last token
        self.indexed = 0  # n-grams ending before this index are in the index

    def _extend_index(self, seq: list[int]) -> None:
        """Index the n-grams ending at ``indexed .. len(seq) - 2``: every occurrence except
        the sequence's own tail, which is what we look up."""
        for end in range(self.indexed, len(seq) - 1):
            for n in range(self.min_n, min(self.max_n, end + 1) + 1):
                self.index[tuple(seq[end - n + 1: end + 1])] = end
        self.indexed = max(self.indexed, len(seq) - 1)

    def propose(self, seq: list[int], k: int) -> tuple[list[int], Tensor | None]:
        self._extend_index(seq)
        for n in range(min(self.max_n, len(seq)), self.min_n - 1, -1):
            end = self.index.get(tuple(seq[-n:]))
            if end is not None:
                return seq[end + 1: end + 1 + k], None
        return [], None

    def keep(self, n: int) -> None:
        """Nothing to forget: the index only ever holds final tokens."""
