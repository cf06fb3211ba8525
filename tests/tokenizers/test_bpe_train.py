"""Training BPE from scratch, and the saved format."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
import regex

from scratchgpt import bars
from scratchgpt.errors import ScratchGPTError
from scratchgpt.tokenizers import BPETokenizer, load_tokenizer
from scratchgpt.tokenizers.bpe import count_chunks
from scratchgpt.tokenizers.bpe_algorithm import (
    LONG_TRAINING_CHUNK,
    get_stats,
    learn_merges,
    merge,
)
from scratchgpt.tokenizers.bpe_files import ENDOFTEXT, MERGES_FILE, MERGES_HEADER
from scratchgpt.tokenizers.pretokenize import GPT2_PATTERN, PreTokenizer, piece_bounds
from tests.corpus import play_text


@pytest.fixture(scope="module")
def small_text(english_text) -> str:
    return english_text[:100_000]


@pytest.fixture(scope="module")
def trained(small_text) -> BPETokenizer:
    return BPETokenizer.train(small_text, 512, backend="python")


def _naive_merges(text: str, num_merges: int) -> list[tuple[int, int]]:
    """Reference trainer: recount every pair from scratch before each merge (slow, obvious)."""
    counter = Counter(regex.findall(GPT2_PATTERN, text))
    chunks = [list(c.encode()) for c in counter]
    freqs = list(counter.values())
    token_bytes = [bytes([b]) for b in range(256)]
    merges: list[tuple[int, int]] = []
    while len(merges) < num_merges:
        counts: dict[tuple[int, int], int] = {}
        for ids, f in zip(chunks, freqs, strict=True):
            get_stats(ids, counts, weight=f)
        if not counts:
            break
        pair = min(counts, key=lambda p: (-counts[p], p))  # most frequent, then smallest pair
        joined = token_bytes[pair[0]] + token_bytes[pair[1]]
        if joined in token_bytes:
            new_id = token_bytes.index(joined)
        else:
            new_id = len(token_bytes)
            token_bytes.append(joined)
            merges.append(pair)
        chunks = [merge(ids, pair, new_id) for ids in chunks]
    return merges


@pytest.mark.parametrize("corpus", ["english_text", "stdlib_text"])
def test_incremental_training_equals_naive(corpus, request):
    text = request.getfixturevalue(corpus)[:5_000]
    tok = BPETokenizer.train(text, 256 + 150, special_tokens=())
    assert tok.merges == _naive_merges(text, 150)


def test_learn_merges_reuses_a_token_with_the_same_bytes():
    # Two splits of the same bytes: "ab"+"c" and "a"+"bc". The second must reuse "abc"'s id, so
    # no two ids share bytes (which would break encoding by rank).
    a, c = ord("a"), ord("c")
    token_bytes = [bytes([i]) for i in range(256)] + [b"ab", b"bc"]  # ids 256, 257
    chunks = [[256, c]] * 3 + [[a, 257]] * 2
    merges = learn_merges([list(x) for x in chunks], [1] * 5, 10, token_bytes)
    assert merges == [(256, c)]  # the (a, "bc") merge used id 258 again
    assert token_bytes[258:] == [b"abc"]


def test_vocab_size_reached_and_tokens_shrink(trained, small_text):
    assert trained.vocab_size == 512
    assert trained.eot_id == 511 and trained.special_tokens == {ENDOFTEXT: 511}
    assert len(trained.merges) == 512 - 256 - 1
    ids = trained.encode(small_text)
    n_bytes = len(small_text.encode("utf-8"))
    assert len(ids) < 0.6 * n_bytes  # 255 merges cut the byte count by well over a third
    assert trained.decode(ids) == small_text
    # Later merges are rarer: encoding with fewer merges gives more tokens.
    fewer = BPETokenizer(trained.merges[:100], backend="python")
    assert len(fewer.encode(small_text)) > len(ids)


def test_round_trip_on_unseen_text(trained):
    rng = random.Random(0)
    texts = [
        "😀 日本語 naïve e\u0301 \x00\x7f <|endof",
        "".join(chr(rng.randint(0, 0x10FFFF)) for _ in range(300)).encode(
            "utf-8", errors="replace").decode("utf-8", errors="replace"),
    ]
    texts += [rng.randbytes(300).decode("utf-8", errors="replace") for _ in range(20)]
    texts += [rng.randbytes(300).decode("latin-1") for _ in range(5)]
    for text in texts:
        ids = trained.encode(text)
        assert all(0 <= i < trained.vocab_size for i in ids)
        assert trained.decode(ids) == text
        assert trained.decode_bytes(ids) == text.encode("utf-8")


def test_python_and_tiktoken_backends_agree_on_trained(trained, stdlib_text):
    fast = BPETokenizer(trained.merges, trained.special_tokens, backend="tiktoken")
    # Text the tokenizer never saw: another play, and Python code with long whitespace runs.
    text = (play_text(100_000, seed=1) + stdlib_text[:200_000] + "\n😀 日本語 it's  \n\n "
            + ENDOFTEXT)
    assert fast.encode(text, allowed_special="all") == trained.encode(text, allowed_special="all")


def test_special_tokens_are_cut_out_of_training():
    text = ("hello world" + ENDOFTEXT) * 200
    tok = BPETokenizer.train(text, 300, backend="python")
    assert all(ENDOFTEXT.encode() not in tok.token_bytes(i) for i in range(256, tok.eot_id))
    assert tok.encode(ENDOFTEXT, allowed_special="all") == [tok.eot_id]
    assert len(tok.encode_ordinary(ENDOFTEXT)) > 1
    assert tok.encode(text, allowed_special="all").count(tok.eot_id) == 200


def test_training_stops_when_text_is_exhausted():
    tok = BPETokenizer.train("ab ab", 1000, special_tokens=())
    # chunks "ab" and " ab": merges (a,b) then (" ", ab); nothing more to merge
    assert tok.vocab_size == 258
    assert tok.encode("ab ab") == [256, 257]


def test_training_rejects_bad_sizes():
    with pytest.raises(ScratchGPTError, match="too small"):
        BPETokenizer.train("text", 256)  # no room for <|endoftext|>
    with pytest.raises(ScratchGPTError, match="duplicate"):
        BPETokenizer.train("text", 300, special_tokens=("<a>", "<a>"))


def test_training_is_fast_enough(english_text):
    """Incremental pair counts: a merge touches only the chunks that hold its pair. A trainer
    that recounts everything per merge needs minutes for this; ours takes about a second."""
    import time

    start = time.process_time()  # CPU time: other processes on the machine do not count
    tok = BPETokenizer.train(english_text[:300_000], 2048, backend="python")
    assert time.process_time() - start < 15
    assert tok.vocab_size == 2048


def test_a_long_chunk_learns_the_naive_merges():
    """Letters without a space are one chunk however long; above LONG_TRAINING_CHUNK tokens
    its pairs are kept by position, and it must learn what the textbook loop learns."""
    rng = random.Random(0)
    runs = ["".join(rng.choice("aab") for _ in range(n)) for n in (3_000, 1_500, 40)]
    text = " ".join(runs * 2)
    assert max(len(run) for run in runs) > LONG_TRAINING_CHUNK
    tok = BPETokenizer.train(text, 256 + 120, special_tokens=())
    assert tok.merges == _naive_merges(text, 120)
    assert tok.decode(tok.encode(text)) == text


def test_a_long_line_without_spaces_trains_fast():
    """A megabyte of DNA on one line is one chunk: rewriting it for every merge took half an
    hour for 4096 ids; by position a merge costs its occurrences, a few seconds in all."""
    import time

    rng = random.Random(0)
    text = "".join(rng.choice("acgt") for _ in range(300_000))
    start = time.process_time()
    tok = BPETokenizer.train(text, 1024, backend="python")
    assert time.process_time() - start < 15
    assert tok.vocab_size == 1024


# ----------------------------------------------------------------------------- saved format


def test_save_load_identical(trained, small_text, tmp_path):
    trained.save(tmp_path)
    lines = (tmp_path / MERGES_FILE).read_text(encoding="utf-8").splitlines()
    assert lines[0] == MERGES_HEADER == "#scratchgpt-bpe v1"
    assert lines[1:] == [f"{a} {b}" for a, b in trained.merges]
    state = json.loads((tmp_path / "tokenizer.json").read_text(encoding="utf-8"))
    assert state["kind"] == "bpe" and state["version"] == 1
    loaded = load_tokenizer(tmp_path)
    assert isinstance(loaded, BPETokenizer)
    assert loaded.merges == trained.merges and loaded.special_tokens == trained.special_tokens
    text = small_text[:20_000] + ENDOFTEXT + "😀"
    assert loaded.encode(text, allowed_special="all") == trained.encode(
        text, allowed_special="all")


def test_version_mismatch_is_a_clear_error(trained, tmp_path):
    trained.save(tmp_path)
    state_path = tmp_path / "tokenizer.json"
    state = json.loads(state_path.read_text(encoding="utf-8"))
    state_path.write_text(json.dumps({**state, "version": 2}), encoding="utf-8")
    with pytest.raises(ScratchGPTError, match="version 2 is not supported"):
        load_tokenizer(tmp_path)
    state_path.write_text(json.dumps(state), encoding="utf-8")
    merges_path = tmp_path / MERGES_FILE
    body = merges_path.read_text(encoding="utf-8").split("\n", 1)[1]
    merges_path.write_text("#scratchgpt-bpe v2\n" + body, encoding="utf-8")
    with pytest.raises(ScratchGPTError, match="different format version"):
        load_tokenizer(tmp_path)
    merges_path.write_text(body, encoding="utf-8")
    with pytest.raises(ScratchGPTError, match="not a scratchgpt merges file"):
        load_tokenizer(tmp_path)


def test_corrupt_merges_are_rejected(tmp_path):
    tok = BPETokenizer([(97, 98)], {ENDOFTEXT: 257})
    tok.save(tmp_path)
    # a state saved before it recorded its merges' sha256: the merges themselves are checked
    state_path = tmp_path / "tokenizer.json"
    state = json.loads(state_path.read_text(encoding="utf-8"))
    del state["merges_sha256"]
    state_path.write_text(json.dumps(state), encoding="utf-8")
    merges_path = tmp_path / MERGES_FILE
    for body, message in [("97 x", "malformed"), ("97 300", "not defined before"),
                          ("97 98\n97 98", "same bytes twice")]:
        merges_path.write_text(f"{MERGES_HEADER}\n{body}\n", encoding="utf-8")
        with pytest.raises(ScratchGPTError, match=message):
            load_tokenizer(tmp_path)
    with pytest.raises(ScratchGPTError, match="special token ids"):
        BPETokenizer([(97, 98)], {ENDOFTEXT: 100})
    with pytest.raises(ScratchGPTError, match="permutation"):
        BPETokenizer([], byte_ids=[0] * 256)


def test_a_long_text_is_counted_piece_by_piece_as_it_is_whole(english_text):
    text = f"{english_text[:20_000]}{ENDOFTEXT}  \n\n{english_text[20_000:40_000]}"
    pre = PreTokenizer(GPT2_PATTERN)
    whole = Counter(pre.split(english_text[:20_000])
                    + pre.split(f"  \n\n{english_text[20_000:40_000]}"))
    pieces = count_chunks(text, [ENDOFTEXT], pre, piece_chars=50)
    assert len(piece_bounds(text, 50)) > 100  # (cut in many pieces)
    assert list(pieces.items()) == list(whole.items())  # the same counts, in the same order


@pytest.mark.parametrize("progress", [True, False])
def test_training_shows_its_progress_on_stderr_when_asked(english_text, monkeypatch, capsys,
                                                           progress):
    monkeypatch.setattr(bars, "PROGRESS_DELAY_S", 0.0)  # (bars show once a step runs this long)
    tok = BPETokenizer.train(english_text[:20_000], 300, backend="python", progress=progress)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert ("BPE: reading the text" in captured.err) is progress
    done = f"BPE: learning merges: 100%|██████████| {len(tok.merges)}/{len(tok.merges)}"
    assert (done in captured.err) is progress


@pytest.mark.parametrize("size", [300.0, "300", True])
def test_a_vocabulary_size_that_is_no_integer_is_refused(size):
    with pytest.raises(ScratchGPTError, match=f"must be an integer, got {size!r}"):
        BPETokenizer.train("the cat sat on the mat", size)


def test_a_training_out_of_pairs_ends_its_bar_full(monkeypatch, capsys):
    monkeypatch.setattr(bars, "PROGRESS_DELAY_S", 0.0)
    tok = BPETokenizer.train("the cat sat on the mat " * 20, 1000, progress=True)
    assert len(tok.merges) < 1000 - 257  # (it ran out of pairs)
    n = len(tok.merges)
    assert f"BPE: learning merges: 100%|██████████| {n}/{n} " in capsys.readouterr().err
