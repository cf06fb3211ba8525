"""A BPE tokenizer's files that are missing, damaged or of another tokenizer: each is one
line that names the file read, and, for the merges a copied checkpoint left behind, where
they must be."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from scratchgpt.checkpoints import Checkpoint, save_checkpoint
from scratchgpt.errors import TokenizerError
from scratchgpt.tokenizers import BPETokenizer, load_tokenizer
from tests.cli_errors import error_of
from tests.tiny_gpt import sharp_gpt

TEXT = "the cat sat on the mat, and the dog sat on the log.\n" * 40


@pytest.fixture(scope="module")
def trained() -> BPETokenizer:
    return BPETokenizer.train(TEXT, 280, backend="python")


def _merges(text: bytes) -> Callable[[Path], None]:
    def write(d: Path) -> None:
        (d / "merges.txt").write_bytes(text)
    return write


def _no_merges(d: Path) -> None:
    (d / "merges.txt").unlink()


def _merges_a_folder(d: Path) -> None:
    (d / "merges.txt").unlink()
    (d / "merges.txt").mkdir()


def _state(**change: object) -> Callable[[Path], None]:
    def write(d: Path) -> None:
        state = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
        (d / "tokenizer.json").write_text(json.dumps({**state, **change}), encoding="utf-8")
    return write


def _old_state_and(damage: Callable[[Path], None]) -> Callable[[Path], None]:
    """``damage``, to a tokenizer.json saved before it recorded its merges' sha256: the
    merges are then checked for what a vocabulary must be."""
    def write(d: Path) -> None:
        state = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
        del state["merges_sha256"]
        (d / "tokenizer.json").write_text(json.dumps(state), encoding="utf-8")
        damage(d)
    return write


# (damage to a saved BPE tokenizer, the file the message must name, words it must hold)
OURS = {
    "merges missing": (_no_merges, "merges.txt", ("beside", "copy merges.txt")),
    "merges a folder": (_merges_a_folder, "merges.txt", ("directory",)),
    "merges not text": (_merges(b"\xff\xfe#scratchgpt"), "merges.txt", ("utf-8",)),
    # another tokenizer's merges beside this one's tokenizer.json: its sha256 is not the one
    # recorded; where none is (a state saved before), the vocabulary they make is checked:
    # fewer merges than the special token's id says, a merge of tokens not made yet, the same
    # bytes twice
    "merges of another tokenizer": (_merges(b"#scratchgpt-bpe v1\n97 98\n"), "merges.txt",
                                    ("sha256", "another tokenizer's")),
    "merges of a smaller tokenizer, old state": (
        _old_state_and(_merges(b"#scratchgpt-bpe v1\n97 98\n")), "merges.txt",
        ("do not fit", "another tokenizer's")),
    "merges out of order, old state": (
        _old_state_and(_merges(b"#scratchgpt-bpe v1\n300 301\n")), "merges.txt",
        ("do not fit", "not defined before")),
    "merges twice, old state": (
        _old_state_and(_merges(b"#scratchgpt-bpe v1\n97 98\n97 98\n")), "merges.txt",
        ("do not fit", "same bytes twice")),
    # tokenizer.json pointing at a file elsewhere: read as merges wherever it led
    "merges_file a path": (_state(merges_file="/etc/hostname"), "tokenizer.json",
                           ("merges_file",)),
    "merges_file a number": (_state(merges_file=5), "tokenizer.json", ("merges_file",)),
}


@pytest.mark.parametrize("damage,named,words", OURS.values(), ids=OURS)
def test_a_damaged_bpe_tokenizer_names_its_file(trained, tmp_path, damage, named, words):
    d = tmp_path / "tok"
    trained.save(d)
    damage(d)
    with pytest.raises(TokenizerError) as err:
        load_tokenizer(d)
    msg = str(err.value)
    assert str(d / named) in msg, msg
    assert all(w.lower() in msg.lower() for w in words), msg
    assert "Errno" not in msg, msg  # the system's words, not Python's repr of its error


def _gpt2_copy(gpt2_files, d: Path, encoder: bytes | None = None,
               merges: bytes | None = None) -> None:
    d.mkdir()
    encoder_json, vocab_bpe = gpt2_files
    for src, data in ((encoder_json, encoder), (vocab_bpe, merges)):
        if data is None:
            shutil.copy(src, d / src.name)
        elif data:
            (d / src.name).write_bytes(data)


# (encoder.json's bytes, vocab.bpe's, the file the message names, a word it holds):
# None keeps GPT-2's file, b"" leaves the file out
GPT2 = {
    "encoder.json a list": (b"[]", None, "encoder.json", "json object"),
    "encoder.json ids as text": (b'{"a": "0"}', None, "encoder.json", "json object"),
    "encoder.json not json": (b"{", None, "encoder.json", "not valid json"),
    "encoder.json not text": (b"\xff\xfe{", None, "encoder.json", "utf-8"),
    "encoder.json missing": (b"", None, "encoder.json", "does not exist"),
    "vocab.bpe not text": (None, b"\xff\xfe", "vocab.bpe", "utf-8"),
    "vocab.bpe missing": (None, b"", "vocab.bpe", "does not exist"),
}


@pytest.mark.parametrize("encoder,merges,named,word", GPT2.values(), ids=GPT2)
def test_damaged_gpt2_files_are_named(gpt2_files, tmp_path, encoder, merges, named, word):
    """A GPT-2 checkpoint directory's encoder.json and vocab.bpe: the message said 'cannot
    read GPT-2 vocabulary files' and the parser's words, not which of the two; a list for
    encoder.json was a traceback; either one alone was 'no tokenizer.json'."""
    d = tmp_path / "gpt2"
    _gpt2_copy(gpt2_files, d, encoder, merges)
    with pytest.raises(TokenizerError) as err:
        load_tokenizer(d)
    msg = str(err.value)
    assert str(d / named) in msg and word in msg.lower(), msg


def test_a_checkpoint_copied_without_its_merges_says_where_they_go(trained, tmp_path, capsys):
    """best.pt of a BPE run copied on its own: sample and prepare --tokenizer-from said
    "cannot read BPE merges: [Errno 2] No such file or directory: 'copied/merges.txt'"."""
    model = sharp_gpt(scale=30, vocab_size=trained.vocab_size, block_size=32)
    alone = tmp_path / "copied" / "best.pt"
    save_checkpoint(alone, Checkpoint("gpt", model.config, model.state_dict(),
                                      {"text": trained.state()}))
    (tmp_path / "t.txt").write_text(TEXT, encoding="utf-8")
    for argv in (["sample", "--checkpoint", str(alone), "--max-new-tokens", "2"],
                 ["prepare", "--data", str(tmp_path / "t.txt"), "--tokenizer-from", str(alone),
                  "--out", str(tmp_path / "data")]):
        msg = error_of(capsys, argv)
        assert str(alone.parent / "merges.txt") in msg and "beside" in msg, msg
    assert not (tmp_path / "data").exists()
    trained.save(alone.parent)  # the run's merges.txt copied along: it works
    from scratchgpt.cli import main

    assert main(["prepare", "--data", str(tmp_path / "t.txt"), "--tokenizer-from", str(alone),
                 "--out", str(tmp_path / "data")]) == 0


def test_another_tokenizers_merges_of_the_same_size_are_refused(tmp_path, capsys):
    """Two BPE runs of the default size, one merges.txt beside both checkpoints: the second
    loaded the first's merges without a word, and every id it read or wrote was another
    token. The state records the sha256 of its merges now; a state saved before, which does
    not, still loads."""
    trained = BPETokenizer.train(TEXT, 270, backend="python")
    other = BPETokenizer.train(TEXT.replace("cat", "cow").replace("dog", "hen"), 270,
                               backend="python")
    assert other.vocab_size == trained.vocab_size and other.merges != trained.merges
    model = sharp_gpt(scale=30, vocab_size=trained.vocab_size, block_size=32)
    folder = tmp_path / "models"
    save_checkpoint(folder / "cat.pt", Checkpoint("gpt", model.config, model.state_dict(),
                                                  {"text": trained.state()}))
    other.save(folder)  # the merges.txt (and tokenizer.json) of the other run
    msg = error_of(capsys, ["sample", "--checkpoint", str(folder / "cat.pt"),
                            "--max-new-tokens", "2"])
    assert str(folder / "merges.txt") in msg and "sha256" in msg, msg
    old = {k: v for k, v in trained.state().items() if k != "merges_sha256"}
    trained.save(folder)
    assert load_tokenizer(folder).same_as(trained)
    (folder / "tokenizer.json").write_text(json.dumps(old), encoding="utf-8")
    assert load_tokenizer(folder).same_as(trained)
