"""Both BPE backends split text by Unicode 16.0's letters and numbers, whichever Unicode version
the installed regex engines ship: one saved tokenizer encodes a text one way.

The Python ``regex`` module here may know newer Unicode than tiktoken's Rust regex (Unicode 16.0
in tiktoken 0.14): thousands of code points it calls letters or numbers were unassigned, so
"other", in 16.0. The reference is tiktoken itself: its own Encoding over GPT-2's pattern.
"""

from __future__ import annotations

import random
import unicodedata

import numpy as np
import pytest
import regex
import tiktoken

from scratchgpt.tokenizers import BPETokenizer
from scratchgpt.tokenizers.pretokenize import (
    GPT2_PATTERN,
    LETTER_STAND_IN,
    NUMBER_STAND_IN,
    OTHER_STAND_IN,
    PreTokenizer,
    pinned_pattern,
    reclassified,
)
from scratchgpt.tokenizers.unicode_tables import LETTERS, NUMBERS, UNICODE_VERSION

# Letters or numbers since Unicode 17.0 (U+A7CE Latin, U+0C5C Telugu, U+323B0 CJK Extension J,
# U+11DE0 Tolong Siki digit) or 18.0 (U+3D000 Seal script); unassigned in 16.0.
NEWER_TEXTS = ["\ua7ce's", "A\u0c5c's", "\U000323b0's", "x \U0003d000's 12\U00011de0 ",
               "\ua7ce\ua7ce it's \U000323b0\U000323b1 \U00011de0\U00011de1!"]
CODE_POINTS = np.array([c for c in range(0x110000) if not 0xD800 <= c < 0xE000])
BYTE_RANKS = {bytes([b]): b for b in range(256)}


def _tiktoken_members(pattern: str) -> set[int]:
    """The code points tiktoken's regex engine matches with ``pattern`` (e.g. ``\\p{L}``): with
    a vocabulary of single bytes the ids are the matched text's bytes (unmatched text is
    skipped), so decoding them gives the members."""
    probe = tiktoken.Encoding("probe", pat_str=pattern, mergeable_ranks=BYTE_RANKS,
                              special_tokens={})
    matched = bytes(probe.encode_ordinary("".join(map(chr, CODE_POINTS)))).decode("utf-8")
    return set(map(ord, matched))


def _regex_members(pattern: str) -> set[int]:
    return set(map(ord, regex.findall(pattern, "".join(map(chr, CODE_POINTS)))))


def _table_members(ranges) -> set[int]:
    return {c for first, last in ranges for c in range(first, last + 1)}


@pytest.fixture(scope="module")
def tiktoken_classes() -> dict[str, set[int]]:
    return {p: _tiktoken_members(p) for p in (r"\p{L}", r"\p{N}", r"\s")}


@pytest.fixture(scope="module")
def regex_classes() -> dict[str, set[int]]:
    return {p: _regex_members(p) for p in (r"\p{L}", r"\p{N}", r"\s")}


# ----------------------------------------------------------------------------- the tables


def test_tables_are_tiktokens_unicode(tiktoken_classes, regex_classes):
    assert tiktoken_classes[r"\p{L}"] == _table_members(LETTERS), (
        f"tiktoken's letters are no longer Unicode {UNICODE_VERSION}'s: it moved to a new "
        "Unicode version, and GPT-2 parity with it now needs a decision (tables are pinned)")
    assert tiktoken_classes[r"\p{N}"] == _table_members(NUMBERS)
    assert tiktoken_classes[r"\s"] == regex_classes[r"\s"]  # whitespace is not pinned


def test_tables_agree_with_pythons_unicodedata():
    """An independent source: every code point assigned in Python's own Unicode data (an older
    or equal version) has the same class there as in the tables."""
    version = tuple(map(int, unicodedata.unidata_version.split(".")))
    assert version <= tuple(map(int, UNICODE_VERSION.split(".")))
    letters, numbers = _table_members(LETTERS), _table_members(NUMBERS)
    for c in CODE_POINTS.tolist():
        category = unicodedata.category(chr(c))
        if category == "Cn" and version != (16, 0, 0):
            continue  # unassigned in Python's older version, maybe assigned by 16.0
        assert (category[0] == "L") == (c in letters), hex(c)
        assert (category[0] == "N") == (c in numbers), hex(c)


def test_reclassified_is_where_the_engines_disagree(tiktoken_classes, regex_classes):
    """reclassified() holds exactly the characters whose class the installed regex module and
    tiktoken disagree on, each mapped to a stand-in of tiktoken's (Unicode 16.0) class."""
    def cls(c: int, classes: dict[str, set[int]]) -> str:
        return "L" if c in classes[r"\p{L}"] else "N" if c in classes[r"\p{N}"] else "other"

    disagree = {c for c in CODE_POINTS.tolist()
                if cls(c, tiktoken_classes) != cls(c, regex_classes)}
    assert set(map(ord, reclassified())) == disagree
    stand_in_class = {LETTER_STAND_IN: "L", NUMBER_STAND_IN: "N", OTHER_STAND_IN: "other"}
    for c, stand_in in reclassified().items():
        assert stand_in_class[stand_in] == cls(ord(c), tiktoken_classes)
    for stand_in, expected in stand_in_class.items():
        assert cls(ord(stand_in), regex_classes) == cls(ord(stand_in), tiktoken_classes) == expected
        assert not stand_in.isspace()


# ----------------------------------------------------------------------------- encoding


@pytest.mark.parametrize("text", NEWER_TEXTS, ids=ascii)
def test_newer_letters_encode_as_tiktoken(text, gpt2_python, gpt2_tiktoken, tiktoken_gpt2):
    expected = tiktoken_gpt2.encode(text)
    assert gpt2_python.encode(text) == expected
    assert gpt2_tiktoken.encode(text) == expected
    assert gpt2_python.decode(expected) == text


def test_every_disagreeing_character_encodes_as_tiktoken(tiktoken_classes, regex_classes,
                                                         gpt2_python, gpt2_tiktoken,
                                                         tiktoken_gpt2):
    """Each character that the two regex engines class differently, between a letter, a digit,
    punctuation and a contraction, encodes the same on both backends as on tiktoken's own."""
    disagree = set()
    for p in (r"\p{L}", r"\p{N}"):
        disagree |= tiktoken_classes[p] ^ regex_classes[p]
    text = "".join(f"a{chr(c)}'s{chr(c)}1{chr(c)}. {chr(c)}" for c in sorted(disagree))
    expected = tiktoken_gpt2.encode(text)
    assert gpt2_python.encode(text) == expected
    assert gpt2_tiktoken.encode(text) == expected


def test_sweep_every_code_point(gpt2_python):
    """Every code point from U+0080 on, between a letter probe and a number probe (they
    alternate: ``c1 é c2 ½ c3 é ...``), splits the same on the Python path and on the tiktoken
    backend.

    tiktoken does not return its chunks, so the vocabulary makes them visible: single bytes plus
    a merge for every (last byte of a character, first byte of the next), i.e. continuation byte
    0x80-0xBF then lead byte 0xC2-0xF4. BPE applies such a merge exactly when the two characters
    are in one chunk, so the 2-byte tokens mark the character boundaries that are not chunk
    boundaries. A code point joins the letter beside it, the number, or neither. (Whitespace
    and tiktoken's own classes: test_tables_are_tiktokens_unicode.)"""
    merges = [(x, y) for x in range(0x80, 0xC0) for y in range(0xC2, 0xF5)]
    tok = BPETokenizer(merges, backend="tiktoken")
    probes = "\u00e9\u00bd"  # é (a letter), ½ (a number): two UTF-8 bytes each
    cps = CODE_POINTS[CODE_POINTS >= 0x80]
    text = "".join(chr(c) + probes[i % 2] for i, c in enumerate(cps.tolist()))
    utf8_length = np.where(cps < 0x800, 2, np.where(cps < 0x10000, 3, 4))
    char_bytes = np.stack([utf8_length, np.full_like(cps, 2)], 1).ravel()
    char_starts = np.concatenate([[0], np.cumsum(char_bytes)])  # byte offset of each character

    ids = np.array(tok.encode_ordinary(text))
    lengths = np.where(ids >= 256, 2, 1)
    joined = (np.cumsum(lengths) - lengths)[ids >= 256] + 1  # boundaries inside a chunk
    tiktoken_starts = np.setdiff1d(char_starts[1:-1], joined)

    chunks = gpt2_python._pretokenizer.split(text)
    assert "".join(chunks) == text
    python_starts = char_starts[np.cumsum(np.fromiter(map(len, chunks), np.int64))[:-1]]
    np.testing.assert_array_equal(tiktoken_starts, python_starts)


# ----------------------------------------------------------------------------- the two methods


def test_stand_ins_split_as_the_pinned_pattern():
    """Variant equivalence in one engine: the Python path (regex's own \\p{L}, reclassified
    characters swapped for stand-ins) splits exactly as ``regex`` running the pinned pattern
    (Unicode 16.0's ranges written out, ten times slower)."""
    rng = random.Random(0)
    newer = list(reclassified()) or ["\ua7ce"]
    pool = newer + list("ab Z09 ½é'sdt.,!?\n\t") + ["  ", "'ll", "\u3000", "日本", "😀"]
    texts = ["".join(rng.choice(pool) for _ in range(rng.randrange(1, 60))) for _ in range(300)]
    texts += NEWER_TEXTS
    pinned = regex.compile(pinned_pattern(GPT2_PATTERN))
    pre = PreTokenizer(GPT2_PATTERN)
    for text in texts:
        assert pre.split(text) == pinned.findall(text), ascii(text)


def test_pinned_pattern_rewrites_only_letter_and_number_classes():
    letters = pinned_pattern(r"\p{L}")
    assert letters.startswith(r"[\U00000041-\U0000005A\U00000061-\U0000007A") and letters[-1] == "]"
    assert pinned_pattern(r"[^\s\p{N}]") == "[^\\s" + pinned_pattern(r"\p{N}")[1:]
    assert pinned_pattern(r"\P{L}") == "[^" + letters[1:]
    for untouched in (r"\\p{L}", r"\p{Lu}", r"\s+(?!\S)", r"[\]\p]"):
        assert pinned_pattern(untouched) == untouched
    assert regex.findall(pinned_pattern(r"\\p{L}"), r"\p{L}") == [r"\p{L}"]
