"""Counts in messages: ``plural(1, "token")`` is '1 token', ``plural(3, "token")`` '3 tokens'."""

from __future__ import annotations


def plural(n: int, word: str, words: str | None = None, *, grouped: bool = False) -> str:
    """``n`` and ``word``, or its plural (``words``, default ``word + "s"``) unless ``n`` is
    1; ``grouped``: ``n`` with thousands separators (``1,024 tokens``)."""
    count = f"{n:,}" if grouped else str(n)
    return f"{count} {word if n == 1 else words or word + 's'}"
