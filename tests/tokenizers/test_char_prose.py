"""The prose-normalizing character tokenizer (``char-prose``)."""

from __future__ import annotations

import pytest

from scratchgpt.errors import ScratchGPTError
from scratchgpt.tokenizers import ProseCharTokenizer, build_tokenizer, load_tokenizer
from scratchgpt.tokenizers.char import normalize_prose

BOOK = ("CHAPTER I\r\n\r\n\u201cWell, Prince, so Genoa and Lucca are now just family estates\r\n"
        "of the Buonapartes\u2014_mon cher_!\u201d   It\u2019s 1805\u2026\tNo #3 [sic].\n")


def test_folds_newlines_spaces_and_typography():
    out = normalize_prose(BOOK)
    assert "\n" not in out and "\t" not in out and "  " not in out and "_" not in out
    assert out.startswith('CHAPTER I "Well, Prince,') and "Buonapartes- mon cher !\"" in out
    assert "It's 1805... No 3 sic ." in out
    assert normalize_prose(out) == out  # idempotent
    assert normalize_prose("  \n\n ") == ""
    assert normalize_prose("Pierre B\u00e9zukhov") == "Pierre B\u00e9zukhov"  # letters kept


def test_round_trip_of_normalized_text_and_save(tmp_path):
    tok = build_tokenizer("char-prose", BOOK)
    assert isinstance(tok, ProseCharTokenizer) and tok.kind == "char-prose"
    assert "\n" not in tok.chars and "_" not in tok.chars
    ids = tok.encode(BOOK)
    assert tok.decode(ids) == normalize_prose(BOOK)
    assert tok.encode(tok.decode(ids)) == ids
    tok.save(tmp_path)
    again = load_tokenizer(tmp_path)
    assert type(again) is ProseCharTokenizer and again.encode(BOOK) == ids


def test_unknown_policy():
    tok = ProseCharTokenizer.train("the cat sat.")
    assert tok.encode("the\n\ncat   sat.") == tok.encode("the cat sat.")  # folded, not unknown
    with pytest.raises(ScratchGPTError, match="not in the vocabulary"):
        tok.encode("the dog")
    assert tok.decode(tok.encode("the dog", unknown="replace")) == "the    "  # d, o, g: space


def test_char_docstring_examples_run():
    import doctest

    from scratchgpt.tokenizers import char

    assert doctest.testmod(char, raise_on_error=True).attempted > 0


def test_unknown_count_is_what_replace_substitutes():
    """The prose tokenizer counts after normalizing, as it encodes: curly quotes are spelled
    the plain way, not missing."""
    from scratchgpt.tokenizers.char import ProseCharTokenizer

    tok = ProseCharTokenizer.train("it's a test, isn't it?")
    text = "\u2019tis a test \u2014 zebra!"
    replaced = tok.encode(text, unknown="replace")
    assert tok.unknown_count(text) == sum(c not in tok.stoi for c in normalize_prose(text)) > 0
    assert len(replaced) == len(normalize_prose(text))


@pytest.mark.parametrize("missing", [3, 400])
def test_unknown_count_counts_every_missing_character(missing):
    """A few missing characters or many (text in another script) are counted alike."""
    from scratchgpt.tokenizers.char import FEW_MISSING, CharTokenizer

    tok = CharTokenizer.train("abc ")
    foreign = [chr(0x4E00 + i) for i in range(missing)]
    text = "abc " + "".join(c * (i % 3 + 1) + " a" for i, c in enumerate(foreign))
    assert (missing > FEW_MISSING) == (missing == 400)  # both ways of counting are tried
    assert tok.unknown_count(text) == sum(c not in tok.stoi for c in text)
