"""BPE-dropout: sampled segmentations that join back to the text, exact at p = 0, and sampled
from the distribution the method defines (every mergeable pair skipped with probability p at
each step, the lowest-ranked kept pair merged)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from scratchgpt.errors import TokenizerError
from scratchgpt.tokenizers.bpe import BPETokenizer
from scratchgpt.tokenizers.bpe_algorithm import (
    LONG_CHUNK,
    bpe_encode_chunk,
    merge_with_dropout,
)

TOY_RANKS = {bytes([b]): b for b in range(256)} | {
    b"aa": 256, b"ab": 257, b"aab": 258, b"ba": 259, b"aaa": 260, b"abab": 261}


def reference_dropout(chunk: bytes, ranks: dict[bytes, int], p: float,
                      rng: random.Random) -> tuple[int, ...]:
    """The method as written: roll every mergeable pair at every step, merge the lowest-ranked
    kept one (leftmost among equals), stop when none is kept."""
    parts = [chunk[i:i + 1] for i in range(len(chunk))]
    while True:
        kept = [(ranks[parts[i] + parts[i + 1]], i) for i in range(len(parts) - 1)
                if parts[i] + parts[i + 1] in ranks and rng.random() >= p]
        if not kept:
            return tuple(ranks[x] for x in parts)
        _, i = min(kept)
        parts[i:i + 2] = [parts[i] + parts[i + 1]]


@pytest.fixture(scope="module")
def trained(english_text) -> BPETokenizer:
    return BPETokenizer.train(english_text[:60_000], vocab_size=400, backend="python")


def test_no_dropout_is_the_exact_encoding(gpt2_python, stdlib_text):
    ranks = gpt2_python._ranks
    chunks = {c.encode() for c in gpt2_python._pretokenizer.split(stdlib_text[:200_000])}
    chunks.add(b"x" * (3 * LONG_CHUNK))  # a long chunk, which the exact path merges by heap
    rng = random.Random(0)
    for chunk in chunks:
        assert merge_with_dropout(chunk, ranks, 0.0, rng) == bpe_encode_chunk(chunk, ranks)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_every_sample_decodes_to_the_text(gpt2_python, stdlib_text, p):
    text = stdlib_text[:30_000] + " naïve café, 東京 🙂 "
    ids = gpt2_python.encode_with_dropout(text, p, random.Random(3))
    assert gpt2_python.decode(ids) == text
    assert ids != gpt2_python.encode(text)


def test_all_merges_dropped_leaves_the_bytes(trained, english_text):
    text = english_text[:5_000]
    assert trained.encode_with_dropout(text, 1.0, random.Random(0)) == list(text.encode())


def test_more_dropout_gives_smaller_pieces(trained, english_text):
    text = english_text[60_000:80_000]
    lengths = [len(trained.encode(text))] + [
        len(trained.encode_with_dropout(text, p, random.Random(0))) for p in (0.1, 0.3, 0.6)]
    assert lengths == sorted(lengths) and len(set(lengths)) == 4, lengths


def test_samples_follow_the_seed(trained, english_text):
    text = english_text[:3_000]
    a, b, c = (trained.encode_with_dropout(text, 0.2, random.Random(s)) for s in (7, 7, 8))
    assert a == b
    assert a != c


@pytest.mark.parametrize("chunk", [b"aaab", b"abababaa", b"aaaaab"])
def test_samples_have_the_method_distribution(chunk):
    # The implementation rolls pairs lazily off a heap; the reference rolls all of them.
    # Both must give each segmentation with the same probability.
    n, p = 20_000, 0.3
    rng_a, rng_b = random.Random(1), random.Random(2)
    ours = Counter(tuple(merge_with_dropout(chunk, TOY_RANKS, p, rng_a)) for _ in range(n))
    ref = Counter(reference_dropout(chunk, TOY_RANKS, p, rng_b) for _ in range(n))
    assert len(ref) > 2  # the chunk has several segmentations to tell apart
    for seg in ours.keys() | ref.keys():
        f, g = ours[seg] / n, ref[seg] / n
        sigma = (max(g, 1 / n) * (1 - g) * 2 / n) ** 0.5
        assert abs(f - g) < 5 * sigma + 1e-3, (seg, f, g)


def test_special_tokens_follow_encode_policy(trained):
    text = "to be<|endoftext|>or not"
    with pytest.raises(TokenizerError, match="special token"):
        trained.encode_with_dropout(text, 0.1, random.Random(0))
    ids = trained.encode_with_dropout(text, 0.1, random.Random(0), allowed_special="all")
    assert ids.count(trained.eot_id) == 1
    assert trained.decode(ids) == text


def test_dropout_outside_0_1_is_an_error():
    with pytest.raises(ValueError, match="dropout"):
        merge_with_dropout(b"aab", TOY_RANKS, 1.5, random.Random(0))
