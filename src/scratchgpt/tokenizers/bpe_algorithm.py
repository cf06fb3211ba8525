"""The byte pair encoding algorithm: learn merges from text, and apply them to a chunk.

Token ids are lists of ints; the 256 single bytes come first. Training counts adjacent pairs and
repeatedly replaces the most frequent pair by a new id:

    >>> ids = list(b"aaabdaaabac")
    >>> get_stats(ids)[(97, 97)]
    4
    >>> merge(ids, (97, 97), 256)
    [256, 97, 98, 100, 256, 97, 98, 97, 99]

Encoding applies the learned merges to one pre-token chunk, lowest rank (earliest merge) first:

    >>> ranks = {bytes([b]): b for b in range(256)} | {b"aa": 256, b"ab": 257, b"aab": 258}
    >>> bpe_encode_chunk(b"aaab", ranks)
    [256, 257]

(The leftmost ``aa`` merges first, then ``ab``; ``aa`` + ``ab`` is not a token.) Token ids are
ranks exactly as in tiktoken, so a vocabulary encodes byte for byte as tiktoken does.
"""

from __future__ import annotations

import heapq
import random
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from itertools import pairwise

Pair = tuple[int, int]

# Above this many bytes a chunk is merged with a heap (n log n) instead of rescanning all pairs
# after every merge (n^2): a 100 kB run of letters with no spaces must not take minutes.
LONG_CHUNK = 256
NO_RANK = sys.maxsize  # rank of a pair that is not a token: never the best
# Above this many tokens a training chunk keeps its pairs by position (:class:`LinkedChunk`), so
# a merge costs its occurrences rather than a rewrite of the whole chunk: a megabyte of letters
# without a space is one chunk, which every one of 4096 merges rewrote whole.
LONG_TRAINING_CHUNK = 1024


# --------------------------------------------------------------------------- training


def get_stats(ids: Sequence[int], counts: dict[Pair, int] | None = None,
              weight: int = 1) -> dict[Pair, int]:
    """Count adjacent pairs: ``[1, 2, 3, 1, 2] -> {(1, 2): 2, (2, 3): 1, (3, 1): 1}``.

    Adds ``weight`` per occurrence into ``counts`` when given (and returns it)."""
    counts = {} if counts is None else counts
    for pair in pairwise(ids):
        counts[pair] = counts.get(pair, 0) + weight
    return counts


def merge(ids: Sequence[int], pair: Pair, new_id: int) -> list[int]:
    """Replace every non-overlapping occurrence of ``pair`` (left to right) by ``new_id``:
    ``merge([1, 1, 1], (1, 1), 7) == [7, 1]``."""
    out: list[int] = []
    a, b = pair
    i, n = 0, len(ids)
    while i < n:
        if i < n - 1 and ids[i] == a and ids[i + 1] == b:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


class LinkedChunk:
    """A long training chunk as a linked list of tokens, with the positions of each adjacent
    pair, so that merging a pair visits only its occurrences.

    ``merge`` replaces the occurrences of a pair left to right, non-overlapping, exactly as
    :func:`merge` does, and returns how many occurrences each pair gained or lost:

    >>> chunk = LinkedChunk([1, 1, 1, 1, 2])
    >>> {p: d for p, d in chunk.merge((1, 1), 7).items() if d}, chunk.tokens()
    ({(1, 1): -3, (7, 7): 1, (1, 2): -1, (7, 2): 1}, [7, 7, 2])
    """

    def __init__(self, ids: Sequence[int]):
        n = len(ids)
        self.ids = list(ids)  # a token, or -1 where a merge took it into its left neighbour
        self.nxt = list(range(1, n + 1))
        self.prv = list(range(-1, n - 1))
        self.at: dict[Pair, set[int]] = defaultdict(set)  # pair -> positions of its left token
        for i, pair in enumerate(pairwise(ids)):
            self.at[pair].add(i)

    def tokens(self) -> list[int]:
        """The chunk's tokens now, in order."""
        return [t for t in self.ids if t >= 0]

    def merge(self, pair: Pair, new_id: int) -> dict[Pair, int]:
        """Replace every non-overlapping occurrence of ``pair`` (left to right) by ``new_id``;
        returns the change in each touched pair's occurrences."""
        delta: dict[Pair, int] = defaultdict(int)
        n = len(self.ids)
        for i in sorted(self.at.pop(pair, ())):
            j = self.nxt[i]  # (an occurrence whose left token an earlier one took is skipped)
            if self.ids[i] == pair[0] and j < n and self.ids[j] == pair[1]:
                self._merge_at(i, j, new_id, delta)
        return delta

    def _merge_at(self, i: int, j: int, new_id: int, delta: dict[Pair, int]) -> None:
        ids, n = self.ids, len(self.ids)
        h, k = self.prv[i], self.nxt[j]
        delta[(ids[i], ids[j])] -= 1
        if h >= 0:
            self._move(h, (ids[h], ids[i]), (ids[h], new_id), delta)
        if k < n:
            self._forget(j, (ids[j], ids[k]), delta)
            self._move(i, None, (new_id, ids[k]), delta)
        ids[i], ids[j] = new_id, -1
        self.nxt[i] = k
        if k < n:
            self.prv[k] = i

    def _forget(self, pos: int, pair: Pair, delta: dict[Pair, int]) -> None:
        where = self.at.get(pair)
        if where is not None:
            where.discard(pos)
        delta[pair] -= 1

    def _move(self, pos: int, old: Pair | None, new: Pair, delta: dict[Pair, int]) -> None:
        """The pair at ``pos`` becomes ``new`` (it was ``old``, if given)."""
        if old is not None:
            self._forget(pos, old, delta)
        self.at[new].add(pos)
        delta[new] += 1


class PairCounts:
    """Pair counts over a set of chunks, kept exact while merges rewrite the chunks.

    ``counts[pair]`` sums the frequencies of the chunks holding ``pair`` (once per occurrence);
    ``where[pair]`` lists those chunks, so a merge visits only them (and in a chunk of more than
    :data:`LONG_TRAINING_CHUNK` tokens, a :class:`LinkedChunk`, only the pair's occurrences).
    The most frequent pair comes from a heap of ``(-count, pair)`` entries: an entry whose count
    went out of date is skipped when popped (a fresh one was pushed when the count changed), and
    equal counts pop the smallest pair first, so training is deterministic.
    """

    def __init__(self, chunks: list[list[int]], freqs: list[int]):
        self.chunks = chunks
        self.freqs = freqs
        self.counts: dict[Pair, int] = defaultdict(int)
        self.where: dict[Pair, set[int]] = defaultdict(set)
        self.linked = {i: LinkedChunk(ids) for i, ids in enumerate(chunks)
                       if len(ids) > LONG_TRAINING_CHUNK}
        for i, (ids, f) in enumerate(zip(chunks, freqs, strict=True)):
            for pair in pairwise(ids):
                self.counts[pair] += f
                self.where[pair].add(i)
        self.heap = [(-c, pair) for pair, c in self.counts.items()]
        heapq.heapify(self.heap)

    def most_frequent(self) -> tuple[Pair, int] | None:
        """The most frequent pair and its count (None when no pair is left); removes it from
        the heap, so call :meth:`merge` next."""
        while self.heap:
            neg, pair = heapq.heappop(self.heap)
            if self.counts.get(pair, 0) == -neg:
                return pair, -neg
        return None

    def merge(self, pair: Pair, new_id: int) -> None:
        """Replace ``pair`` by ``new_id`` in every chunk that holds it, updating the counts."""
        changed: set[Pair] = set()
        for i in self.where.pop(pair):
            if i in self.linked:
                self._merge_linked(i, pair, new_id, changed)
                continue
            old = self.chunks[i]
            new = merge(old, pair, new_id)
            if len(new) == len(old):
                continue  # stale: this chunk lost the pair to an earlier merge
            f = self.freqs[i]
            for p in pairwise(old):
                self.counts[p] -= f
                changed.add(p)
            for p in pairwise(new):
                self.counts[p] += f
                self.where[p].add(i)
                changed.add(p)
            self.chunks[i] = new
        for p in changed:
            c = self.counts[p]
            if c > 0:
                heapq.heappush(self.heap, (-c, p))
            else:
                del self.counts[p]

    def _merge_linked(self, i: int, pair: Pair, new_id: int, changed: set[Pair]) -> None:
        f = self.freqs[i]
        for p, d in self.linked[i].merge(pair, new_id).items():
            self.counts[p] += d * f
            changed.add(p)
            if d > 0:
                self.where[p].add(i)

    def tokens(self) -> list[list[int]]:
        """Every chunk's tokens now (long chunks are kept as linked lists while merging)."""
        for i, linked in self.linked.items():
            self.chunks[i] = linked.tokens()
        return self.chunks


def learn_merges(chunks: list[list[int]], freqs: list[int], num_merges: int,
                 token_bytes: list[bytes],
                 progress: Callable[[int, Pair, int], None] | None = None) -> list[Pair]:
    """Learn up to ``num_merges`` merges over ``chunks`` (token id lists, each seen ``freqs[i]``
    times); returns the merges in order. ``chunks`` and ``token_bytes`` (bytes of each id; new
    tokens are appended) are updated in place. ``progress(k, pair, count)`` is called after
    each new merge.

    Incremental (:class:`PairCounts`): a merge costs the size of the chunks that hold its pair,
    not of the whole text. If a pair's joined bytes already are a token (the same bytes reached
    by another split), the pair is merged into that token and no new id is used: every id has
    distinct bytes.

    >>> token_bytes = [bytes([b]) for b in range(256)]
    >>> learn_merges([list(b"hug"), list(b"pug"), list(b"hugs")], [10, 5, 5], 2, token_bytes)
    [(117, 103), (104, 256)]
    >>> token_bytes[256:]
    [b'ug', b'hug']
    """
    pairs = PairCounts(chunks, freqs)
    by_bytes = {b: i for i, b in enumerate(token_bytes)}
    merges: list[Pair] = []
    while len(merges) < num_merges:
        best = pairs.most_frequent()
        if best is None:
            break
        pair, count = best
        joined = token_bytes[pair[0]] + token_bytes[pair[1]]
        new_id = by_bytes.get(joined)
        if new_id is None:
            new_id = len(token_bytes)
            token_bytes.append(joined)
            by_bytes[joined] = new_id
            merges.append(pair)
            if progress is not None:
                progress(len(merges), pair, count)
        pairs.merge(pair, new_id)
    pairs.tokens()  # the chunks as merged, in place
    return merges


# --------------------------------------------------------------------------- encoding


def bpe_encode_chunk(chunk: bytes, ranks: dict[bytes, int]) -> list[int]:
    """Token ids for one pre-token chunk: start from single bytes, then repeatedly merge the
    leftmost adjacent pair whose joined bytes have the lowest rank (tiktoken's rule).

    A chunk that is itself a token is returned as that token directly, as tiktoken does."""
    rank = ranks.get(chunk)
    if rank is not None:
        return [rank]
    if len(chunk) > LONG_CHUNK:
        return merge_with_heap(chunk, ranks)
    return merge_by_scanning(chunk, ranks)


def merge_with_dropout(chunk: bytes, ranks: dict[bytes, int], dropout: float,
                       rng: random.Random) -> list[int]:
    """One segmentation of ``chunk`` sampled by BPE-dropout (Provilkov, Emelianenko and Voita,
    2020): at every step each pair that could merge is skipped with probability ``dropout`` and
    the lowest-ranked pair kept is merged; the merging stops when every pair is skipped. A word
    then comes out in smaller pieces now and then, always bytes that join back to ``chunk``.

        >>> ranks = {bytes([b]): b for b in range(256)} | {b"aa": 256, b"ab": 257, b"aab": 258}
        >>> merge_with_dropout(b"aaab", ranks, 0.0, random.Random(0))  # bpe_encode_chunk's ids
        [256, 257]
        >>> merge_with_dropout(b"aaab", ranks, 1.0, random.Random(0))  # every merge skipped
        [97, 97, 97, 98]
    """
    if not 0.0 <= dropout <= 1.0:
        raise ValueError(f"dropout must be in [0, 1], got {dropout}")
    return merge_with_heap(chunk, ranks, dropout, rng)


def merge_by_scanning(chunk: bytes, ranks: dict[bytes, int]) -> list[int]:
    """The plain algorithm: find the best adjacent pair, merge it, repeat. Fast for words.

    ``pair_ranks[i]`` is the rank of parts ``i`` and ``i + 1`` joined (``NO_RANK`` if that is not
    a token); a merge only changes its two neighbours' entries, and ``min``/``index`` scan the
    list at C speed."""
    parts = [chunk[i:i + 1] for i in range(len(chunk))]
    get = ranks.get
    pair_ranks = [get(chunk[i:i + 2], NO_RANK) for i in range(len(chunk) - 1)]
    while pair_ranks:
        best = min(pair_ranks)
        if best == NO_RANK:
            break
        i = pair_ranks.index(best)  # leftmost of the lowest rank
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
        del pair_ranks[i]
        if i < len(pair_ranks):
            pair_ranks[i] = get(parts[i] + parts[i + 1], NO_RANK)
        if i > 0:
            pair_ranks[i - 1] = get(parts[i - 1] + parts[i], NO_RANK)
    return [ranks[p] for p in parts]


def merge_with_heap(chunk: bytes, ranks: dict[bytes, int], dropout: float = 0.0,
                    rng: random.Random | None = None) -> list[int]:
    """Same result as :func:`merge_by_scanning`, for long chunks; with ``dropout``, one sampled
    segmentation (:func:`merge_with_dropout`).

    Parts form a linked list (``nxt``/``prv``) indexed by their first byte's offset, so heap
    entries ``(rank, left, right, len(right part))`` pop lowest rank first and, among equal
    ranks, leftmost first, which is the scanning rule. An entry is stale, and skipped, once its
    left part died or its right neighbour changed.

    Dropout: a popped pair is skipped with probability ``dropout`` and set aside; the first pair
    kept is merged, and the pairs set aside go back on the heap for the next step. Rolling the
    pairs lazily, lowest rank first, picks the same pair as rolling every pair and taking the
    lowest kept one; the merging stops when every pair left was skipped in one step."""
    n = len(chunk)
    parts: list[bytes | None] = [chunk[i:i + 1] for i in range(n)]
    nxt = list(range(1, n + 1))
    prv = list(range(-1, n - 1))
    get = ranks.get
    heap = []
    for i in range(n - 1):
        r = get(chunk[i:i + 2])
        if r is not None:
            heap.append((r, i, i + 1, 1))
    heapq.heapify(heap)
    skipped: list[tuple[int, int, int, int]] = []
    while heap:
        entry = heapq.heappop(heap)
        _, i, j, len_j = entry
        left, right = parts[i], parts[j]
        if left is None or nxt[i] != j or right is None or len(right) != len_j:
            continue
        if dropout and rng.random() < dropout:  # type: ignore[union-attr]
            skipped.append(entry)
            continue
        for e in skipped:  # skipped for this step only
            heapq.heappush(heap, e)
        skipped.clear()
        joined = left + right
        parts[i], parts[j] = joined, None
        k = nxt[j]
        nxt[i] = k
        if k < n:
            prv[k] = i
            r = get(joined + parts[k])  # type: ignore[operator]
            if r is not None:
                heapq.heappush(heap, (r, i, k, len(parts[k])))  # type: ignore[arg-type]
        h = prv[i]
        if h >= 0:
            r = get(parts[h] + joined)  # type: ignore[operator]
            if r is not None:
                heapq.heappush(heap, (r, h, i, len(joined)))
    out = []
    i = 0
    while i < n:
        out.append(ranks[parts[i]])  # type: ignore[index]
        i = nxt[i]
    return out
