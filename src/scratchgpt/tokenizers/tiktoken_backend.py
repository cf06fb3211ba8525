r"""tiktoken's Rust core as the fast backend of our BPE vocabularies: the Python path's ids,
several times faster.

tiktoken runs any vocabulary given as ranks (token bytes -> id) and a pre-tokenizer pattern, so
we build its ``Encoding`` from our own ranks (no download), with the pattern's letters and
numbers pinned to Unicode 16.0 (:func:`~scratchgpt.tokenizers.pretokenize.pinned_pattern`) as
the Python path pins them.

**Long whitespace.** tiktoken's regex engine (fancy-regex) keeps one backtracking entry per
character while it matches ``\s+(?!\S)``, and at about 1,000,000 whitespace characters followed
by more text it panics: a Rust panic arrives in Python as a ``BaseException`` that no
``except Exception`` catches. So runs of :data:`LONG_WHITESPACE` characters or more never reach
tiktoken. Under GPT-2's pattern such a run is a chunk of its own: all of it at the end of the
text (``\s++$``), otherwise all but its last character (``\s+(?!\S)``; the last one goes with the
next word, as in ``" world"``). A chunk always ends where whitespace follows a non-space
character, and the pattern never looks behind, so the text before the run and the text after it
split as they would alone: tiktoken encodes those, and :func:`bpe_encode_chunk` the run. Text
under any other pattern that holds such a run is encoded by the Python path.
"""

from __future__ import annotations

from collections.abc import Callable

import regex

from scratchgpt.tokenizers.bpe_algorithm import bpe_encode_chunk
from scratchgpt.tokenizers.pretokenize import GPT2_PATTERN, encode_with_specials, pinned_pattern

# Whitespace runs this long are cut out before tiktoken runs (it panics from ~1,000,000).
LONG_WHITESPACE = 100_000
_WHITESPACE = regex.compile(r"\s")
PROBES = 8  # characters at one step apart that a long run covers (long_whitespace_runs)


def tiktoken_available() -> bool:
    """Whether the ``tiktoken`` package can be imported."""
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        return False
    return True


def long_whitespace_runs(text: str, min_length: int | None = None) -> list[tuple[int, int]]:
    r"""``(start, end)`` of every run of at least ``min_length`` (default
    :data:`LONG_WHITESPACE`) whitespace characters.

    >>> long_whitespace_runs("a" + " " * 6 + "b  c" + "\n" * 5, min_length=5)
    [(1, 7), (11, 16)]

    A run that long covers :data:`PROBES` consecutive multiples of ``min_length // PROBES``, so
    the characters there, a few per megabyte, are looked at first, and the search skipped
    unless as many in a row are whitespace. Two in a row were looked for before: prose is
    whitespace at about one character in six, so most texts of a megabyte held such a pair, and
    the search then ran over all of the text, a quarter of the time tiktoken takes to encode it.
    """
    min_length = LONG_WHITESPACE if min_length is None else min_length
    step = min_length // PROBES
    if step and not _probes_in_a_row(text, step):
        return []
    # (?<!\s): only from the first character of a run, so the search stays linear.
    return [m.span() for m in regex.finditer(rf"(?<!\s)\s{{{min_length},}}", text)]


def _probes_in_a_row(text: str, step: int) -> bool:
    """Whether :data:`PROBES` consecutive multiples of ``step`` in ``text`` are whitespace."""
    in_a_row = 0
    for i in range(0, len(text), step):
        in_a_row = in_a_row + 1 if _WHITESPACE.match(text, i) else 0
        if in_a_row == PROBES:
            return True
    return False


class TiktokenBackend:
    """Encodes with tiktoken exactly as the Python path does (see the module docstring).

    ``python_encode`` (text -> ids, no special tokens) is the Python path: it encodes text that
    tiktoken cannot, at the Python path's speed."""

    def __init__(self, name: str, pattern: str, ranks: dict[bytes, int],
                 special_tokens: dict[str, int], python_encode: Callable[[str], list[int]]):
        import tiktoken

        self._encoding = tiktoken.Encoding(f"scratchgpt-{name}", pat_str=pinned_pattern(pattern),
                                           mergeable_ranks=ranks, special_tokens=special_tokens)
        self._ranks = ranks
        self._cuts_long_runs = pattern == GPT2_PATTERN
        self._python_encode = python_encode

    def encode(self, text: str, allowed: dict[str, int]) -> list[int]:
        """Ids of ``text``; the special tokens in ``allowed`` (text -> id) become their ids,
        everything else is ordinary text."""
        try:
            return self._encode(text, allowed)
        except BaseException as e:
            if type(e).__name__ != "PanicException":
                raise
        # A panic in tiktoken's Rust code that the guards above do not foresee: the Python path
        # gives the same ids, only slower.
        return encode_with_specials(text, allowed, self._python_encode)

    def _encode(self, text: str, allowed: dict[str, int]) -> list[int]:
        if long_whitespace_runs(text):
            cut = self._encode_around_long_runs if self._cuts_long_runs else self._python_encode
            return encode_with_specials(text, allowed, cut)
        if allowed:
            return self._encoding.encode(text, allowed_special=set(allowed), disallowed_special=())
        return self._encoding.encode_ordinary(text)

    def _encode_around_long_runs(self, text: str) -> list[int]:
        """GPT-2's pattern: each long whitespace run is one chunk (module docstring)."""
        encode = self._encoding.encode_ordinary
        out: list[int] = []
        start = 0
        for a, b in long_whitespace_runs(text):
            end = b if b == len(text) else b - 1
            out += encode(text[start:a])
            out += bpe_encode_chunk(text[a:end].encode("utf-8"), self._ranks)
            start = end
        out += encode(text[start:])
        return out
