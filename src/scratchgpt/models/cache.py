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

A server batches continuously: sequences join a running batch between two decode steps and
leave when done. :class:`JoinableCache` adds what that needs: ``append_rows`` puts another
cache's rows (a prompt just prefilled alone) beside the running ones, aligned so that every
row's next token goes into the same slot (the shorter side gets more left padding), and
``trim`` drops leading slots that are padding in every row::

    batch.append_rows(new)                  # new.pos == 5, batch.pos == 9: new is padded by 4
    batch.pad_counts()                      # (B,) padding slots at the front of each row
    batch.trim(int(batch.pad_counts().min()))   # all rows padded by >= n: drop those n slots
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

    def __call__(self, idx: Tensor, cache: DecodeCache | None = None,
                 last_only: bool = False) -> Tensor:
        """idx (B, T) token ids -> logits (B, T, vocab_size); ``last_only``: the logits of the
        last position alone, (B, 1, vocab_size) (a prefill needs no more, and the output
        head of a large vocabulary is a large share of a prompt's cost)."""
        ...

    def new_cache(self, batch_size: int, max_len: int | None = None,
                  dtype: torch.dtype | None = None) -> DecodeCache:
        """An empty cache for ``batch_size`` sequences of up to ``max_len`` positions."""
        ...


@runtime_checkable
class JoinableCache(DecodeCache, Protocol):
    """A :class:`DecodeCache` whose rows may join and leave a running batch (continuous
    batching). Every cache of :mod:`scratchgpt.models` is one."""

    def pad_counts(self) -> Tensor:
        """Padding positions at the front of each row, (B,) int64."""
        ...

    def append_rows(self, other: JoinableCache) -> None:
        """Add the rows of ``other`` (a cache of the same model) after this cache's rows,
        aligned at their ends: afterwards both continue at position ``max(self.pos,
        other.pos)``; the rows of the shorter one get the difference as extra left padding,
        which they never see. ``other`` is not to be used afterwards."""
        ...

    def trim(self, n: int) -> None:
        """Drop the first ``n`` positions of every row, which must be padding in all of them
        (``n <= pad_counts().min()``); ``pos`` goes down by ``n``. Rows compute as before."""
        ...


def moved_rows(rows: Tensor) -> tuple[Tensor, Tensor] | None:
    """For a beam search's reorder in place, where row ``i`` continues row ``rows[i]``: (the
    rows that take another row's place, the rows they take), or None where every row keeps its
    own. Copying ``held[moved] = held[taken]`` then does the reorder (the right side is
    gathered before anything is written, so swaps and repeats come out right).

    >>> moved_rows(torch.tensor([0, 0, 2, 1]))
    (tensor([1, 3]), tensor([0, 1]))
    >>> moved_rows(torch.tensor([0, 1])) is None
    True
    """
    moved = (rows != torch.arange(rows.numel(), device=rows.device)).nonzero().squeeze(1)
    return None if moved.numel() == 0 else (moved, rows[moved])
