"""Words in messages read as English: '1 token', never '1 tokens'; 'an lstm', never 'a
lstm'."""

from __future__ import annotations

import doctest

import pytest

from scratchgpt import wording
from scratchgpt.wording import a_kind, plural


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


def test_the_docstring_examples():
    assert doctest.testmod(wording, raise_on_error=True).attempted > 0


@pytest.mark.parametrize("kind, expected", [
    ("lstm", "an lstm"), ("rnn", "an rnn"), ("gpt", "a gpt"), ("gru", "a gru"),
    ("bigram", "a bigram"), ("seq2seq", "a seq2seq"), ("gpt-lora", "a gpt-lora"),
    ("rnn-classifier", "an rnn-classifier"), ("gpt-classifier", "a gpt-classifier"),
    ("encoder", "an encoder"),  # (a word, not letters: its own first sound)
])
def test_a_kind_is_the_article_the_name_is_spoken_with(kind, expected):
    assert a_kind(kind) == expected
