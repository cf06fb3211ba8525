"""build_tokenizer and load_tokenizer: the entry points the commands use."""

from __future__ import annotations

import json

import pytest

from scratchgpt.errors import ScratchGPTError
from scratchgpt.tokenizers import (
    TOKENIZERS,
    BPETokenizer,
    CharTokenizer,
    ProseCharTokenizer,
    Seq2SeqTokenizer,
    build_tokenizer,
    load_tokenizer,
)

TEXT = "To be, or not to be, that is the question:\n" * 50


def test_registered_kinds():
    assert TOKENIZERS == {"char": CharTokenizer, "char-prose": ProseCharTokenizer,
                          "bpe": BPETokenizer, "char-seq2seq": Seq2SeqTokenizer}


def test_build_char():
    tok = build_tokenizer("char", TEXT)
    assert isinstance(tok, CharTokenizer) and tok.decode(tok.encode(TEXT)) == TEXT
    with pytest.raises(ScratchGPTError, match="set by the text"):
        build_tokenizer("char", TEXT, vocab_size=100)
    with pytest.raises(ScratchGPTError, match="empty"):
        build_tokenizer("char", "")


def test_build_bpe(english_text, tmp_path):
    text = english_text[:20_000]
    tok = build_tokenizer("bpe", text, vocab_size=300)
    assert isinstance(tok, BPETokenizer)
    assert tok.vocab_size == 300 and tok.eot_id == 299
    assert tok.decode(tok.encode(text)) == text
    tok.save(tmp_path)
    assert load_tokenizer(tmp_path).encode(text) == tok.encode(text)


def test_build_bpe_default_size(english_text):
    assert build_tokenizer("bpe", english_text[:200_000]).vocab_size == 4096


@pytest.mark.parametrize("size", [256, 100, 0, -5, 1000.5, "512", True])
def test_build_bpe_bad_sizes(size):
    with pytest.raises(ScratchGPTError, match="above 256"):
        build_tokenizer("bpe", TEXT, vocab_size=size)


def test_build_bpe_empty_text():
    with pytest.raises(ScratchGPTError, match="empty"):
        build_tokenizer("bpe", "", vocab_size=512)


def test_build_gpt2():
    tok = build_tokenizer("gpt2", "ignored: the vocabulary is fixed")
    assert isinstance(tok, BPETokenizer) and tok.vocab_size == 50257 and tok.eot_id == 50256
    assert build_tokenizer("gpt2", "", vocab_size=50257).vocab_size == 50257
    with pytest.raises(ScratchGPTError, match="50257"):
        build_tokenizer("gpt2", "", vocab_size=4096)


def test_unknown_kind():
    with pytest.raises(ScratchGPTError, match="unknown tokenizer kind 'word'"):
        build_tokenizer("word", TEXT)


def test_load_tokenizer_errors(tmp_path):
    with pytest.raises(ScratchGPTError, match="no tokenizer found"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(ScratchGPTError, match="not a valid tokenizer"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text(json.dumps({"kind": "word"}), encoding="utf-8")
    with pytest.raises(ScratchGPTError, match="unknown tokenizer kind"):
        load_tokenizer(tmp_path)


def test_load_tokenizer_of_a_file_reads_a_tokenizer_json_and_names_any_other(tmp_path,
                                                                              english_text):
    """A learner passes the tokenizer.json itself, or another file: both were "FILE/
    tokenizer.json does not exist"."""
    tok = build_tokenizer("bpe", english_text[:5_000], vocab_size=300)
    tok.save(tmp_path / "d")
    assert load_tokenizer(tmp_path / "d" / "tokenizer.json").same_as(tok)  # merges.txt beside
    (tmp_path / "notes.txt").write_text("text", encoding="utf-8")
    with pytest.raises(ScratchGPTError, match=r"notes\.txt is a file, not the directory of a "
                                              r"tokenizer \(the folder that holds its "
                                              r"tokenizer\.json\)"):
        load_tokenizer(tmp_path / "notes.txt")


@pytest.mark.parametrize("state", [
    {"kind": "char"},
    {"kind": "char", "chars": None},
    {"kind": "char", "chars": [1, 2]},
    {"kind": "char-prose", "chars": ["ab", "c"]},
    {"kind": "bpe", "version": 1, "special_tokens": [1]},
    {"kind": "bpe", "version": 1, "pattern": "(("},
    {"kind": "bpe", "version": 1, "byte_ids": 5},
    {"kind": "bpe", "version": 1, "byte_ids": ["x"] * 256},
])
def test_a_damaged_tokenizer_file_is_a_tokenizer_error(tmp_path, state):
    """A tokenizer.json edited or damaged by hand is bad input: a TokenizerError, which the
    command line reports in one line, not a KeyError or TypeError from inside from_dict."""
    BPETokenizer.train(TEXT, 300).save(tmp_path)  # a valid merges.txt beside it
    (tmp_path / "tokenizer.json").write_text(json.dumps(state), encoding="utf-8")
    with pytest.raises(ScratchGPTError, match="not a valid|single characters"):
        load_tokenizer(tmp_path)


def test_tokenizer_files_are_utf8_whatever_the_locale(tmp_path):
    """tokenizer.json and a Hugging Face vocab.json are read as UTF-8, so they are written as
    UTF-8: under a locale whose encoding is not (ASCII here, cp1252 on Windows) saving a
    vocabulary with "é" or "Ġ" failed, or wrote bytes that read back as other characters."""
    import os
    import subprocess
    import sys

    text = "héllo wörld 😀 naïve café " * 20
    code = ("import sys; from pathlib import Path\n"
            "from scratchgpt.tokenizers import BPETokenizer, CharTokenizer\n"
            "from scratchgpt.tokenizers.bpe_files import write_hf_tokenizer\n"
            f"out, text = Path(sys.argv[1]), {ascii(text)}\n"
            "CharTokenizer.train(text).save(out / 'char')\n"
            "(out / 'hf').mkdir()\n"
            "write_hf_tokenizer(BPETokenizer.train(text, 300), out / 'hf', 64)\n")
    env = {**os.environ, "LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-500:]
    assert load_tokenizer(tmp_path / "char").chars == sorted(set(text))
    hf = BPETokenizer.from_gpt2_files(*(tmp_path / "hf" / f for f in ("vocab.json", "merges.txt")))
    assert hf.same_as(BPETokenizer.train(text, 300))
