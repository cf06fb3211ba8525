"""What a language model keeps between decode calls, declared once.

Incremental generation feeds a model only its new tokens; everything it must remember about the
earlier ones lives in a cache object that ``model.new_cache(batch_size)`` creates and
``model(idx, cache=cache)`` updates. Three models, three very different memories, one interface:

* the GPT's :class:`~scratchgpt.models.gpt.KVCache`: keys and values of every past position;
* the bigram's :class:`~scratchgpt.models.bigram.PositionCache`: nothing but a count;
* a recurrent model's :class:`~scratchgpt.models.rnn.RecurrentState`: the hidden state.

The decode loop (``scratchgpt.generation.decode``) only ever uses what :class:`DecodeCache`
declares, so stream, batched generation, beam search and speculative decoding work with any of
them::

    cache = model.new_cache(2)              # two sequences
    cache.left_pad(torch.tensor([2, 0]))    # row 0's prompt is 2 tokens shorter
    logits = model(idx, cache=cache)        # idx (2, T): prefill; cache.pos == T
    cache.select_rows(torch.tensor([1]))    # row 0 finished: keep row 1 only
    cache.rollback(T - 1)                   # forget the last position (if cache.rewinds)
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor


@runtime_checkable
class DecodeCache(Protocol):
    """The memory of a partly decoded batch of sequences.

    ``pos`` is the cache's length: positions fed so far (left padding included); a forward
    call with ``T`` new tokens advances it by ``T``. ``max_len`` is the most positions it can
    hold (None: unlimited, e.g. a recurrent state, whose size never grows). ``rewinds`` says
    whether :meth:`rollback` accepts any earlier length (speculative decoding needs it) or only
    0 and the current one.
    """

    pos: int
    max_len: int | None
    rewinds: bool

    @property
    def batch_size(self) -> int:
        """Number of sequences (rows)."""
        ...

    def rollback(self, pos: int) -> None:
        """Forget positions ``pos`` and later, so the next call continues from length ``pos``."""
        ...

    def select_rows(self, rows: Tensor) -> None:
        """Row ``i`` becomes a copy of row ``rows[i]`` (1-D indices; repeats allowed): drops
        finished sequences from a batch, or reorders beams."""
        ...

    def left_pad(self, n_pad: Tensor | None) -> None:
        """Row ``b`` starts with ``n_pad[b]`` padding positions ((B,) int; None = none) that
        must not influence it; called on an empty cache before prefilling padded prompts."""
        ...


class CachedLM(Protocol):
    """A language model that decodes incrementally (every model in :mod:`scratchgpt.models`,
    and anything else generation should drive, such as the NumPy engine)."""

    config: object

    def __call__(self, idx: Tensor, cache: DecodeCache | None = None) -> Tensor:
        """idx (B, T) token ids -> logits (B, T, vocab_size)."""
        ...

    def new_cache(self, batch_size: int, max_len: int | None = None,
                  dtype: torch.dtype | None = None) -> DecodeCache:
        """An empty cache for ``batch_size`` sequences of up to ``max_len`` positions."""
        ...
