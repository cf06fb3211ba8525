"""Counts in messages read as English: '1 token', never '1 tokens'."""

from __future__ import annotations

import pytest

from scratchgpt.wording import plural


@pytest.mark.parametrize("n, word, words, expected", [
    (1, "token", None, "1 token"),
    (0, "token", None, "0 tokens"),
    (2, "step", None, "2 steps"),
    (1_024, "new token", None, "1024 new tokens"),  # (as 'done: N steps' is parsed)
    (1, "hypothesis", "hypotheses", "1 hypothesis"),
    (3, "hypothesis", "hypotheses", "3 hypotheses"),
])
def test_plural(n, word, words, expected):
    assert plural(n, word, words) == expected


def test_plural_grouped():
    assert plural(1_024, "sequence", grouped=True) == "1,024 sequences"
    assert plural(1, "sequence", grouped=True) == "1 sequence"
