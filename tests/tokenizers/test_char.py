"""Character-level tokenizer."""

from __future__ import annotations

import pytest

from scratchgpt.errors import ScratchGPTError
from scratchgpt.tokenizers import CharTokenizer, load_tokenizer


@pytest.mark.parametrize("corpus", ["english_text", "stdlib_text"])
def test_round_trip(corpus, request):
    text = request.getfixturevalue(corpus)
    tok = CharTokenizer.train(text)
    assert tok.vocab_size == len(set(text))
    assert tok.chars == sorted(set(text))
    ids = tok.encode(text[:5000])
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert sorted(set(tok.encode(text))) == list(range(tok.vocab_size))  # every id is used
    assert tok.decode(ids) == text[:5000]
    assert tok.eot_id is None


def test_unknown_characters():
    tok = CharTokenizer.train("hello world?")
    with pytest.raises(ScratchGPTError, match="2 character"):
        tok.encode("hello, world!")
    assert tok.decode(tok.encode("hi!", unknown="replace")) == "h??"
    assert tok.encode("") == []


def test_invalid_vocabularies():
    with pytest.raises(ScratchGPTError, match="empty"):
        CharTokenizer([])
    with pytest.raises(ScratchGPTError, match="duplicate"):
        CharTokenizer(["a", "a"])


def test_save_load(tmp_path):
    tok = CharTokenizer.train("naïve 😀\n")
    tok.save(tmp_path)
    loaded = load_tokenizer(tmp_path)
    assert isinstance(loaded, CharTokenizer) and loaded.chars == tok.chars


@pytest.mark.parametrize("ids", [[-1], [0, -2], [3], [1.5]])
def test_ids_outside_the_vocabulary_are_refused(ids):
    """As BPE's decode does: a negative id is no character, not one counted from the end."""
    with pytest.raises(ScratchGPTError, match="out of range"):
        CharTokenizer.train("abc").decode(ids)


def test_the_characters_a_text_lacks_are_counted_in_words_that_agree():
    """One missing character was "text has 1 character(s) not in the vocabulary"."""
    tok = CharTokenizer.train("abc")
    with pytest.raises(ScratchGPTError, match=r"^text has 1 character not in the vocabulary: "
                       r"'z'$"):
        tok.encode("abz")
    with pytest.raises(ScratchGPTError, match=r"^text has 2 characters not in the vocabulary: "
                       r"'y', 'z'$"):
        tok.encode("zyab")


def test_a_lone_surrogate_is_no_character_of_a_vocabulary(tmp_path):
    with pytest.raises(ScratchGPTError, match=r"lone surrogate, U\+D800"):
        CharTokenizer.train("ab\ud800")


def test_a_state_utf8_cannot_spell_leaves_no_half_written_file(tmp_path):
    tok = CharTokenizer.train("ab")
    tok.chars = ["a", "\ud800"]  # (as no constructor lets one be made)
    with pytest.raises(UnicodeEncodeError):
        tok.save(tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("text", ["hello", "hello, world"])
def test_an_unknown_policy_neither_error_nor_replace_is_refused_whatever_the_text(text):
    """It was taken in silence for a text of known characters, and answered with the
    characters' refusal, not the policy's, for one with unknown ones (BPE refused it alike)."""
    with pytest.raises(ScratchGPTError, match="unknown='ignore': expected 'error' or 'replace'"):
        CharTokenizer.train("helo").encode(text, unknown="ignore")
