r"""Pre-tokenization: cutting text into chunks before BPE, the same way on every backend.

A regex splits text into chunks (words with their leading space, runs of digits, runs of
punctuation, whitespace). BPE merges never cross a chunk boundary, so " dog" and " dog." share
the token for " dog":

    >>> PreTokenizer(GPT2_PATTERN).split("Hello world!! It's 2024.\n")
    ['Hello', ' world', '!!', ' It', "'s", ' 2024', '.', '\n']

Special tokens such as ``<|endoftext|>`` are cut out before that (:func:`encode_with_specials`),
so no chunk spans one.

**Unicode versions.** ``\p{L}`` and ``\p{N}`` follow the Unicode version of the regex engine,
and the engines differ: tiktoken's Rust regex has Unicode 16.0, the Python ``regex`` module a
newer one (18.0 in release 2026.11), where thousands of code points that were unassigned (so
"other", like punctuation) became letters or numbers. ``"\ua7ce's"`` is one chunk
``"\ua7ce'"`` and then ``"s"`` under 16.0, but ``"\ua7ce"`` and ``"'s"`` under 17.0. Both
backends therefore follow Unicode 16.0 (:mod:`~scratchgpt.tokenizers.unicode_tables`):

- tiktoken runs :func:`pinned_pattern`, the pattern with ``\p{L}`` and ``\p{N}`` written out as
  Unicode 16.0's ranges (its Rust engine matches such a class as fast as its own ``\p{L}``);
- the Python ``regex`` module matches a class of 800 ranges ten times slower than its own
  ``\p{L}``, so :class:`PreTokenizer` keeps the pattern as it is and, for the rare text holding a
  character that ``regex`` classes differently from Unicode 16.0 (:func:`reclassified`), matches
  a copy in which each such character is replaced by a stand-in of its Unicode 16.0 class, then
  cuts the text itself at the same places.

Both are exact for patterns whose character classes are built from ``\p{L}``, ``\p{N}``, ``\s``
and literal ASCII, as GPT-2's is; other Unicode properties (``\p{Lu}``, ``\p{M}``) would follow
each engine's own version.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Collection, Iterable

import regex

from scratchgpt.tokenizers.unicode_tables import LETTERS, NUMBERS

# GPT-2's pre-tokenizer, as tiktoken writes it. The published GPT-2 pattern is
# r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""; this form
# splits identically and runs faster (possessive ++ never backtracks). Note the contractions are
# lower case only: "'S" is split as "'" + "S", as GPT-2 did.
GPT2_PATTERN = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
)

# Long text is encoded a piece of about this many characters at a time, each piece's ids
# stored at once as 2 or 4 bytes: a list of the whole text's ids as Python ints takes ~36 bytes
# a token (preparing 42 MB of Python source with GPT-2's BPE peaked at 940 MB, in pieces 565).
# BPE training counts the chunks of such pieces one after another, for the same reason: the
# list of a whole text's chunks holds a string object for every word.
PIECE_CHARS = 1 << 20
# Where a piece may end: after a line's newline, between two non-space characters. No chunk of
# GPT-2's pre-tokenizer spans such a place, so the pieces encode to the whole text's ids.
PIECE_END = re.compile(r"(?<=\S\n)(?=\S)")


def piece_bounds(text: str, piece_chars: int = PIECE_CHARS) -> list[tuple[int, int]]:
    """Where to cut ``text``: (start, stop) of pieces of at least ``piece_chars`` characters
    (the last may be shorter), each ending where :data:`PIECE_END` allows; text without such a
    place is one piece. Bounds, not the pieces: each is sliced when it is encoded, so the
    pieces never hold a second copy of the text.

    >>> text = "ab\\ncd\\n\\nef\\ngh"
    >>> [text[a:b] for a, b in piece_bounds(text, 2)]
    ['ab\\n', 'cd\\n\\nef\\n', 'gh']
    """
    bounds, start = [], 0
    while start < len(text):
        end = PIECE_END.search(text, start + piece_chars)
        stop = end.start() if end else len(text)
        bounds.append((start, stop))
        start = stop
    return bounds


# Stand-ins for reclassified characters, one per Unicode 16.0 class: characters that every
# Unicode version classes the same (letter, number, other), that have no case, and that no
# pattern of ours names literally.
LETTER_STAND_IN = "\u00aa"  # ª, feminine ordinal indicator: a letter (Lo)
NUMBER_STAND_IN = "\u00b2"  # ², superscript two: a number (No)
OTHER_STAND_IN = "\u00a6"  # ¦, broken bar: neither (So), and not whitespace


def fix_surrogates(text: str) -> str:
    """Text that is valid UTF-8: lone surrogates become U+FFFD, surrogate pairs are joined.

    A Python ``str`` can hold lone surrogates (e.g. from ``os.fsdecode``), which have no UTF-8
    form. tiktoken repairs them this same way, so both backends agree.

    >>> fix_surrogates("a\\ud800b") == "a\\ufffdb"
    True
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


# --------------------------------------------------------------------------- special tokens


def special_token_regex(tokens: Iterable[str]) -> regex.Pattern[str]:
    """A regex matching any of ``tokens`` literally (longest first, so overlaps pick the longer)."""
    return regex.compile("|".join(regex.escape(t) for t in sorted(tokens, key=len, reverse=True)))


def encode_with_specials(text: str, specials: dict[str, int],
                         encode_ordinary: Callable[[str], list[int]]) -> list[int]:
    """Ids of ``text`` in which the special tokens ``specials`` (text -> id) become their ids and
    the pieces between them are encoded by ``encode_ordinary``.

    >>> encode_with_specials("ab<|x|>c", {"<|x|>": 9}, lambda s: [ord(c) for c in s])
    [97, 98, 9, 99]
    """
    if not specials:
        return encode_ordinary(text)
    out: list[int] = []
    pos = 0
    for m in special_token_regex(specials).finditer(text):
        out += encode_ordinary(text[pos:m.start()])
        out.append(specials[m.group()])
        pos = m.end()
    out += encode_ordinary(text[pos:])
    return out


def find_special(text: str, tokens: Collection[str]) -> str | None:
    """The first of ``tokens`` that occurs in ``text``, or None."""
    if not tokens:
        return None
    found = special_token_regex(tokens).search(text)
    return found.group() if found else None


# --------------------------------------------------------------------------- Unicode 16.0


def _class_body(ranges: Iterable[tuple[int, int]]) -> str:
    """Ranges as the inside of a character class both regex engines read: ``\\U0000xxxx-...``."""
    return "".join(f"\\U{a:08X}" if a == b else f"\\U{a:08X}-\\U{b:08X}" for a, b in ranges)


_PINNED_CLASSES = {"L": _class_body(LETTERS), "N": _class_body(NUMBERS)}
# What pinned_pattern must see in a pattern: \p{L} / \p{N} (and \P), other escapes (skipped
# whole, so "\\p{L}" stays a backslash and text), and the brackets of character classes.
_PATTERN_TOKEN = regex.compile(r"\\[pP]\{[LN]\}|\\.|\[\^?\]?|\]", regex.DOTALL)


def pinned_pattern(pattern: str) -> str:
    r"""``pattern`` with ``\p{L}`` and ``\p{N}`` written out as Unicode 16.0's code point ranges,
    so that a regex engine of any Unicode version splits as Unicode 16.0 says.

    >>> pinned_pattern(r" ?\p{N}++").startswith(r" ?[\U00000030-\U00000039\U000000B2-")
    True
    >>> pinned_pattern(r"[^\s\p{N}]").startswith(r"[^\s\U00000030-")
    True
    """
    out: list[str] = []
    pos, depth = 0, 0
    for m in _PATTERN_TOKEN.finditer(pattern):
        token = m.group()
        out.append(pattern[pos:m.start()])
        pos = m.end()
        if token.startswith("["):
            depth += 1
        elif token == "]":
            depth = max(depth - 1, 0)
        elif len(token) == 5:  # \p{L}, \p{N}, \P{L}, \P{N}
            body = _PINNED_CLASSES[token[3]]
            if token[1] == "P":
                token = f"[^{body}]"  # inside a class: a nested class (Rust regex reads it)
            else:
                token = body if depth else f"[{body}]"
        out.append(token)
    out.append(pattern[pos:])
    return "".join(out)


def _all_characters() -> str:
    """Every code point except the surrogates, in order."""
    return "".join(map(chr, range(0xD800))) + "".join(map(chr, range(0xE000, 0x110000)))


@functools.cache
def reclassified() -> dict[str, str]:
    r"""The characters that the installed ``regex`` module classes differently from Unicode 16.0
    (letter, number or other), each mapped to a stand-in of its Unicode 16.0 class.

    Empty when ``regex`` ships Unicode 16.0; with a newer one, the letters and numbers added
    since (``"\ua7ce"`` -> ``"¦"``: unassigned, so "other", in Unicode 16.0). Computed once per
    process, in about 0.3 s.
    """
    everything = _all_characters()
    letters = set(regex.findall(r"\p{L}", everything))
    numbers = set(regex.findall(r"\p{N}", everything))
    letters16 = {chr(c) for first, last in LETTERS for c in range(first, last + 1)}
    numbers16 = {chr(c) for first, last in NUMBERS for c in range(first, last + 1)}
    changed = (letters ^ letters16) | (numbers ^ numbers16)
    return {c: (LETTER_STAND_IN if c in letters16 else NUMBER_STAND_IN if c in numbers16
                else OTHER_STAND_IN) for c in sorted(changed)}


@functools.cache
def _stand_in_table() -> dict[int, str]:
    return str.maketrans(reclassified())


class PreTokenizer:
    """Splits text into chunks with ``pattern`` (Python ``regex``), as Unicode 16.0 classes
    letters and numbers.

    >>> PreTokenizer(GPT2_PATTERN).split("\ua7ce's")  # U+A7CE: a letter only since 17.0
    ["\ua7ce'", 's']
    """

    def __init__(self, pattern: str):
        self.pattern = pattern
        self._regex = regex.compile(pattern)

    def split(self, text: str) -> list[str]:
        """The chunks of ``text`` in order (lone surrogates repaired first, as tiktoken does)."""
        text = fix_surrogates(text)
        if text.isascii() or reclassified().keys().isdisjoint(text):
            return self._regex.findall(text)
        # Stand-ins have the Unicode 16.0 class of the character they replace, and one code
        # point replaces one, so the chunks of the copy sit at the offsets of the text's chunks.
        masked = text.translate(_stand_in_table())
        return [text[m.start():m.end()] for m in self._regex.finditer(masked)]
