"""Long whitespace runs: tiktoken's regex engine panics on ~1,000,000 whitespace characters
followed by text; the tiktoken backend cuts such runs out and must still give the Python path's
(and tiktoken's own) ids."""

from __future__ import annotations

import random

import numpy as np
import pytest
import regex

from scratchgpt.cli import main
from scratchgpt.tokenizers import BPETokenizer, load_tokenizer
from scratchgpt.tokenizers import tiktoken_backend as backend_module
from scratchgpt.tokenizers.bpe_files import ENDOFTEXT
from scratchgpt.tokenizers.tiktoken_backend import long_whitespace_runs
from tests.corpus import play_text

# Whitespace at the edges of the text and of special tokens, before words, digits, punctuation,
# contractions and emoji, and runs of every kind of whitespace (GPT-2 splits each differently).
EDGES = [
    "", " ", "  ", "\n", "\n\n\n", "x \n\n", "\n\n x", "  x", "x  ", " x ", "\t\tx\t\t",
    "a  b", "a \n b", "a\n\nb", "a\r\n\r\nb", "1  2", "!!  ??", "it's  'll", "😀  😀",
    "\u3000\u3000x", "x\u00a0\u00a0", "\u2028\u2029 \x85x", " " * 100 + "x", "x" + "\n" * 40,
    f"  {ENDOFTEXT}  ", f"{ENDOFTEXT}\n\n{ENDOFTEXT}", f"x \n{ENDOFTEXT}\n y",
]

# The published GPT-2 pattern: splits as ours does, but is not ours, so the backend cannot rely on
# its chunking and hands texts with long runs to the Python path.
PUBLISHED_GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def _whitespace_texts(seed: int, n: int) -> list[str]:
    """Texts made of whitespace runs of every kind between words, digits and punctuation."""
    rng = random.Random(seed)
    spaces = [" ", "\n", "\t", "\r\n", "\u3000", "\u00a0", " \n"]
    words = ["a", "word", " b", "12", "!?", "it's", "😀", ENDOFTEXT]
    out = []
    for _ in range(n):
        parts = [rng.choice(words) if rng.random() < 0.4 else rng.choice(spaces) * rng.randint(1, 9)
                 for _ in range(rng.randint(1, 12))]
        out.append("".join(parts))
    return out


def test_long_whitespace_runs_are_found():
    text = "a" + " " * 6 + "b  c" + "\n \t" * 3 + "d" + " " * 5
    assert long_whitespace_runs(text, 5) == [(1, 7), (11, 20), (21, 26)]
    assert long_whitespace_runs(text, 10) == []
    assert long_whitespace_runs(" " * 99 + "x", 100) == []
    assert long_whitespace_runs("\u3000" * 100, 100) == [(0, 100)]


@pytest.mark.parametrize("min_length", [16, 27, 40])
def test_a_run_of_the_length_is_found_wherever_it_starts(min_length):
    """The probes skip the search only where no run can be: a run of exactly ``min_length``
    is found at every offset, one a character shorter is not, and whitespace at every probe
    with no run there is searched and found to be none."""
    for start in range(3 * min_length):
        for length in (min_length, min_length - 1):
            text = "x" * start + " " * length + "y" * (2 * min_length)
            expected = [(start, start + length)] if length == min_length else []
            assert long_whitespace_runs(text, min_length) == expected, (start, length)
    step = min_length // backend_module.PROBES
    probes_only = "".join(" " if i % step == 0 else "x" for i in range(20 * min_length))
    assert long_whitespace_runs(probes_only, min_length) == []


@pytest.mark.parametrize("seed", [1, 2])
def test_prose_is_not_searched_for_long_runs(monkeypatch, seed):
    """Prose is whitespace at about one character in six: most megabytes of it held two probes
    in a row that were, so every encode by the tiktoken backend searched the whole text first,
    a quarter of tiktoken's own time (the auto backend measured 1.3x tiktoken on Tiny
    Shakespeare, where bench_tokenize.md says 0.97x)."""
    text = play_text(1_200_000, seed)
    searched: list[str] = []
    finditer = regex.finditer
    monkeypatch.setattr(backend_module.regex, "finditer",
                        lambda pattern, string, *a, **k: searched.append(pattern)
                        or finditer(pattern, string, *a, **k))
    assert long_whitespace_runs(text) == []
    assert not searched


def _no_fallback(text: str) -> list[int]:
    raise AssertionError("the tiktoken backend fell back to the Python path")


@pytest.mark.parametrize("space", ["\n", " "], ids=repr)
def test_a_million_whitespace_characters_then_text(space, gpt2_python):
    """The case that made tiktoken panic: both backends now give the same ids, and they decode
    back to the text. tiktoken never sees the run (no panic, no fallback to the Python path)."""
    tok = BPETokenizer(gpt2_python.merges, gpt2_python.special_tokens,
                       byte_ids=gpt2_python.byte_ids, backend="tiktoken")
    tok._tiktoken_backend()._python_encode = _no_fallback
    text = space * 1_000_000 + "text"
    ids = tok.encode(text)
    assert ids == gpt2_python.encode(text)
    assert gpt2_python.decode(ids) == text


def test_cut_runs_encode_as_tiktoken(monkeypatch, gpt2_tiktoken, tiktoken_gpt2):
    """With the threshold lowered to 2, every whitespace run is cut out before tiktoken runs:
    the ids must still be tiktoken's own, for runs at the start, the end, between words and
    special tokens."""
    monkeypatch.setattr(backend_module, "LONG_WHITESPACE", 2)
    texts = EDGES + _whitespace_texts(0, 400)
    for text in texts:
        assert long_whitespace_runs(text) == long_whitespace_runs(text, 2)
        ordinary = text.replace(ENDOFTEXT, "")
        assert gpt2_tiktoken.encode(ordinary) == tiktoken_gpt2.encode(ordinary), repr(text)
        assert (gpt2_tiktoken.encode(text, allowed_special="all")
                == tiktoken_gpt2.encode(text, allowed_special="all")), repr(text)


def test_long_run_below_the_panic_encodes_as_tiktoken(gpt2_tiktoken, tiktoken_gpt2):
    """Runs over LONG_WHITESPACE but short enough for tiktoken itself: cut, and still exact."""
    n = backend_module.LONG_WHITESPACE + 50_001
    text = "x" + "\n" * n + "y  " + " " * n + ENDOFTEXT + "\t" * n
    assert long_whitespace_runs(text) == [(1, n + 1), (n + 2, 2 * n + 4),
                                          (2 * n + 4 + len(ENDOFTEXT), len(text))]
    assert (gpt2_tiktoken.encode(text, allowed_special="all")
            == tiktoken_gpt2.encode(text, allowed_special="all"))


def test_other_patterns_take_the_python_path(monkeypatch, gpt2_python):
    monkeypatch.setattr(backend_module, "LONG_WHITESPACE", 2)
    fast = BPETokenizer(gpt2_python.merges, gpt2_python.special_tokens, pattern=PUBLISHED_GPT2,
                        byte_ids=gpt2_python.byte_ids, backend="tiktoken")
    slow = BPETokenizer(gpt2_python.merges, gpt2_python.special_tokens, pattern=PUBLISHED_GPT2,
                        byte_ids=gpt2_python.byte_ids, backend="python")
    for text in _whitespace_texts(1, 200):
        assert fast.encode(text, allowed_special="all") == slow.encode(text, allowed_special="all")


class PanicException(BaseException):
    """Stands for pyo3's PanicException (a Rust panic raised in Python), which has this name."""


class _PanickingEncoding:
    def encode_ordinary(self, text):
        raise PanicException("called `Result::unwrap()` on an `Err` value")

    def encode(self, text, **kwargs):
        raise PanicException("called `Result::unwrap()` on an `Err` value")


def test_an_unforeseen_panic_falls_back_to_the_python_path(gpt2_python):
    tok = BPETokenizer(gpt2_python.merges, gpt2_python.special_tokens,
                       byte_ids=gpt2_python.byte_ids, backend="tiktoken")
    tok._tiktoken_backend()._encoding = _PanickingEncoding()
    text = f"text the Rust core fails on{ENDOFTEXT} and more"
    assert tok.encode_ordinary(text) == gpt2_python.encode_ordinary(text)
    assert (tok.encode(text, allowed_special="all")
            == gpt2_python.encode(text, allowed_special="all"))


def test_other_base_exceptions_are_not_swallowed(gpt2_python):
    class Interrupting:
        def encode_ordinary(self, text):
            raise KeyboardInterrupt

    tok = BPETokenizer(gpt2_python.merges, backend="tiktoken")
    tok._tiktoken_backend()._encoding = Interrupting()
    with pytest.raises(KeyboardInterrupt):
        tok.encode_ordinary("x")


def test_prepare_a_file_with_a_million_newlines(tmp_path, capsys):
    """``scratchgpt prepare`` on such a file succeeds, and its tokens decode to the text."""
    text = "First line.\n" + "\n" * 1_000_000 + "Then text again, " * 50 + "\n"
    data = tmp_path / "text.txt"
    data.write_text(text, encoding="utf-8")
    assert main(["prepare", "--data", str(data), "--tokenizer", "gpt2",
                 "--out", str(tmp_path / "ds")]) == 0
    assert "prepared" in capsys.readouterr().out
    tok = load_tokenizer(tmp_path / "ds")
    ids = [np.fromfile(tmp_path / "ds" / f, dtype=np.uint16).tolist()
           for f in ("train.bin", "val.bin")]
    split = int(len(text) * 0.9)
    assert tok.decode(ids[0]) == text[:split] and tok.decode(ids[1]) == text[split:]
