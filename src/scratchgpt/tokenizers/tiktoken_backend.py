"""tiktoken's Rust core as the fast backend of our BPE vocabularies: the Python path's ids,
several times faster.

tiktoken runs any vocabulary given as ranks (token bytes -> id) and a pre-tokenizer pattern, so
we build its ``Encoding`` from our own ranks (no download), with the pattern's letters and
numbers pinned to Unicode 16.0 (:func:`~scratchgpt.tokenizers.pretokenize.pinned_pattern`) as
the Python path pins them.
"""

from __future__ import annotations

from collections.abc import Callable

from scratchgpt.tokenizers.pretokenize import pinned_pattern


def tiktoken_available() -> bool:
    """Whether the ``tiktoken`` package can be imported."""
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        return False
    return True


class TiktokenBackend:
    """Encodes with tiktoken exactly as the Python path does.

    ``python_encode`` (text -> ids, no special tokens) is the Python path."""

    def __init__(self, name: str, pattern: str, ranks: dict[bytes, int],
                 special_tokens: dict[str, int], python_encode: Callable[[str], list[int]]):
        import tiktoken

        self._encoding = tiktoken.Encoding(f"scratchgpt-{name}", pat_str=pinned_pattern(pattern),
                                           mergeable_ranks=ranks, special_tokens=special_tokens)
        self._python_encode = python_encode

    def encode(self, text: str, allowed: dict[str, int]) -> list[int]:
        """Ids of ``text``; the special tokens in ``allowed`` (text -> id) become their ids,
        everything else is ordinary text."""
        if allowed:
            return self._encoding.encode(text, allowed_special=set(allowed), disallowed_special=())
        return self._encoding.encode_ordinary(text)
