r"""Pre-tokenization: cutting text into chunks before BPE, the same way on every backend.

A regex splits text into chunks (words with their leading space, runs of digits, runs of
punctuation, whitespace). BPE merges never cross a chunk boundary, so " dog" and " dog." share
the token for " dog":

    >>> PreTokenizer(GPT2_PATTERN).split("Hello world!! It's 2024.\n")
    ['Hello', ' world', '!!', ' It', "'s", ' 2024', '.', '\n']

Special tokens such as ``<|endoftext|>`` are cut out before that (:func:`encode_with_specials`),
so no chunk spans one.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

import regex

# GPT-2's pre-tokenizer, as tiktoken writes it. The published GPT-2 pattern is
# r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""; this form
# splits identically and runs faster (possessive ++ never backtracks). Note the contractions are
# lower case only: "'S" is split as "'" + "S", as GPT-2 did.
GPT2_PATTERN = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
)

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


# --------------------------------------------------------------------------- chunks


class PreTokenizer:
    """Splits text into chunks with ``pattern`` (Python ``regex``)."""

    def __init__(self, pattern: str):
        self.pattern = pattern
        self._regex = regex.compile(pattern)

    def split(self, text: str) -> list[str]:
        """The chunks of ``text`` in order (lone surrogates repaired first, as tiktoken does)."""
        return self._regex.findall(fix_surrogates(text))
