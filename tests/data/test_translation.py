"""Parallel text: TSV parsing errors with file:line, tokenizer policy, the dates task."""

import datetime as dt

import pytest

from scratchgpt.data.translation import (
    DataSpec,
    dates_pairs,
    dates_task,
    header_note,
    is_held_out_date,
    number_words,
    numbers_task,
    read_tsv,
    split_pairs,
)
from scratchgpt.errors import ScratchGPTError
from scratchgpt.tokenizers.seq2seq import BOS_ID, EOS_ID, UNK_ID, Seq2SeqTokenizer


def test_read_tsv(tmp_path):
    f = tmp_path / "p.tsv"
    f.write_text("hello\tbonjour\ncat\tchat\n", encoding="utf-8")
    assert read_tsv(f) == [("hello", "bonjour"), ("cat", "chat")]
    # a byte-order mark (Notepad's "UTF-8 with BOM") is not part of the first source
    f.write_bytes(b"\xef\xbb\xbf" + f.read_bytes())
    assert read_tsv(f) == [("hello", "bonjour"), ("cat", "chat")]


@pytest.mark.parametrize("text,line,what", [
    ("a\tb\n\nc\td\n", 2, "empty line"),
    ("a\tb\nno tab here\n", 2, "exactly one TAB"),
    ("a\tb\tc\n", 1, "exactly one TAB"),
    ("a\tb\n\tx\n", 2, "empty source"),
    ("a\tb\nc\td\ne\t\n", 3, "empty target"),
])
def test_read_tsv_reports_file_and_line(tmp_path, text, line, what):
    f = tmp_path / "bad.tsv"
    f.write_text(text, encoding="utf-8")
    with pytest.raises(ScratchGPTError, match=rf"bad\.tsv:{line}: .*{what}"):
        read_tsv(f)


@pytest.mark.parametrize("char", ["\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u2029"])
def test_read_tsv_ends_lines_where_an_editor_does(tmp_path, char):
    """A pair may hold a character ``str.splitlines`` takes for a line break: the pair was
    cut in two ("found 0" TABs), and each line after it was named one number too far."""
    f = tmp_path / "p.tsv"
    f.write_text(f"a{char}b\tc\r\nd\te\rf\tg\n", encoding="utf-8")
    assert read_tsv(f) == [(f"a{char}b", "c"), ("d", "e"), ("f", "g")]
    f.write_text(f"a{char}b\tc\nno tab here\n", encoding="utf-8")
    with pytest.raises(ScratchGPTError, match=r"p\.tsv:2: expected exactly one TAB"):
        read_tsv(f)


def test_read_tsv_missing_file(tmp_path):
    with pytest.raises(ScratchGPTError, match="nope.tsv does not exist"):
        read_tsv(tmp_path / "nope.tsv")


def test_read_tsv_says_a_folder_or_device_is_no_file(tmp_path):
    """A folder was reported as "no such file", though it is there."""
    with pytest.raises(ScratchGPTError, match="is a directory, not a file"):
        read_tsv(tmp_path)
    with pytest.raises(ScratchGPTError, match="/dev/null is not a regular file"):
        read_tsv("/dev/null")


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
def test_read_tsv_refuses_utf16_without_a_byte_order_mark(tmp_path, encoding):
    """Pairs saved as UTF-16 without a byte-order mark are valid UTF-8 with a NUL beside every
    letter: big-endian they were read as pairs in silence, a NUL in each character's place of
    the vocabularies. They are refused as prepare refuses such a text; a stray NUL passes."""
    f = tmp_path / "p.tsv"
    f.write_bytes("hello\tbonjour\ncat\tchat\n".encode(encoding))
    with pytest.raises(ScratchGPTError, match=r"p\.tsv is 50% NUL characters: UTF-16 text "
                                              "saved without a byte-order mark"):
        read_tsv(f)
    f.write_bytes("hello\tbonjour\n".encode("utf-16"))  # with its byte-order mark
    with pytest.raises(ScratchGPTError, match=r"p\.tsv is not valid UTF-8 text \(byte 0\): "
                                              "it is UTF-16 text; save it as UTF-8"):
        read_tsv(f)
    f.write_text("hello\0\tbonjour\ncat\tchat\nsun\tsoleil\n", encoding="utf-8")
    assert read_tsv(f)[0] == ("hello\0", "bonjour")


def test_tokenizer_specials_unknowns_and_roundtrip():
    tok = Seq2SeqTokenizer.train(["abc", "cab"])
    assert tok.vocab_size == 4 + 3
    ids = tok.encode("abz")
    assert ids[2] == UNK_ID
    assert tok.decode(tok.encode("cab")) == "cab"
    assert tok.decode([BOS_ID, *tok.encode("ab"), EOS_ID, *tok.encode("c")]) == "ab"
    assert tok.decode(ids) == "ab<unk>"
    with pytest.raises(ScratchGPTError, match="'z'"):
        tok.encode("abz", unknown="error")
    again = Seq2SeqTokenizer.from_dict(tok.to_dict())
    assert again.encode("cab") == tok.encode("cab")


def test_dates_are_correct_and_deterministic():
    a = dates_pairs(300, seed=1, held_out=False)
    assert a == dates_pairs(300, seed=1, held_out=False)
    assert a != dates_pairs(300, seed=2, held_out=False)
    formats_seen = set()
    for src, iso in a:
        d = dt.date.fromisoformat(iso)
        assert not is_held_out_date(d)
        formats_seen.add(src.replace(str(d.year), "Y"))
        # Whatever the form, the day number and either month name or number are in the source.
        low = src.lower()
        assert str(d.day) in src
        month = ("january february march april may june july august september october november "
                 "december").split()[d.month - 1]
        assert month[:3] in low or f"{d.month}" in src
    assert len(formats_seen) > 50


def test_specific_date_forms():
    pairs = dates_pairs(3000, seed=0, held_out=False)
    by_target: dict[str, list[str]] = {}
    for s, t in pairs:
        by_target.setdefault(t, []).append(s)
    # Every form of a date maps to one ISO string; spot-check a weekday form.
    for t, sources in by_target.items():
        d = dt.date.fromisoformat(t)
        for s in sources:
            if s.lower().startswith(("mon", "tue", "wed", "thu", "fri", "sat", "sun")):
                assert s.lower().startswith(d.strftime("%A").lower()[:3])


def test_held_out_dates_are_disjoint_from_training():
    train, test = dates_task(n_train=5000, n_test=500, seed=0)
    assert not {t for _, t in train} & {t for _, t in test}
    assert all(is_held_out_date(dt.date.fromisoformat(t)) for _, t in test)
    # The held-out set does not depend on the seed's training draw: same split rule.
    _, test2 = dates_task(n_train=10, n_test=500, seed=0)
    assert test2 == test


def test_number_words():
    assert number_words(0) == "zero"
    assert number_words(21) == "twenty-one"
    assert number_words(305) == "three hundred and five"
    assert number_words(12_040) == "twelve thousand and forty"
    assert number_words(999_999) == ("nine hundred and ninety-nine thousand "
                                     "nine hundred and ninety-nine")
    train, test = numbers_task(200, 50)
    assert not {t for _, t in train} & {t for _, t in test}


def test_split_and_spec(tmp_path):
    pairs = [(f"s{i}", f"t{i}") for i in range(200)]
    train, held = split_pairs(pairs, 0.2)
    assert len(train) + len(held) == 200 and 20 < len(held) < 60
    assert not {s for s, _ in train} & {s for s, _ in held}
    with pytest.raises(ScratchGPTError):
        DataSpec(task="dates", path="x.tsv")
    with pytest.raises(ScratchGPTError):
        DataSpec(task="poems")
    f = tmp_path / "d.tsv"
    f.write_text("".join(f"{s}\t{t}\n" for s, t in pairs))
    assert DataSpec(task=None, path=str(f), valid_fraction=0.2).load() == (train, held)


@pytest.mark.parametrize("first", ["source\ttarget", "INPUT\tOutput", " src \t tgt"])
def test_a_first_line_naming_the_columns_is_noted(tmp_path, first):
    """A header line is a pair like any other line: the note says it is read as one, what
    the file's first line is, BOM and Windows line ends aside; a first pair that is no column
    name, and a generated task, have none."""
    f = tmp_path / "d.tsv"
    f.write_bytes(b"\xef\xbb\xbf" + f"{first}\r\nabc\tcba\r\n".encode())
    src, tgt = first.split("\t")
    note = f"note: {f}:1 '{src}<TAB>{tgt}' is read as a pair; if it is a header, remove it"
    assert DataSpec(task=None, path=str(f)).header_note() == note
    assert header_note(read_tsv(f), f) == note
    f.write_text("source\tcible\nabc\tcba\n")  # (a pair, whatever its words)
    assert DataSpec(task=None, path=str(f)).header_note() == ""
    assert header_note(read_tsv(f)[1:], f) == ""
    assert DataSpec(task="dates").header_note() == ""


PROSE = "the cat sleeps\tle chat dort\nit is late\til est tard\n"
WORDS = "gato\tköttur\nperro\thundur\ncasa\thús\n"


@pytest.mark.parametrize("first, rest", [
    ("en\tfr", PROSE), ("English\tFrench", PROSE), ("EN-us\tfr_FR", PROSE),
    ("eng\tfra", PROSE), ("input\ttranslation", PROSE), ("question\tanswer", WORDS),
    ("english\tspanish", WORDS)])
def test_a_first_line_naming_languages_or_columns_is_noted(tmp_path, first, rest):
    """Column names beyond 'source<TAB>target' are noted, in train's reading (the first
    line, then the file) and eval's (every pair): languages by code or English name, a
    source's name with a target's; words found nowhere else in the file."""
    f = tmp_path / "d.tsv"
    f.write_text(f"{first}\n{rest}", encoding="utf-8")
    src, tgt = first.split("\t")
    note = f"note: {f}:1 '{src}<TAB>{tgt}' is read as a pair; if it is a header, remove it"
    assert DataSpec(task=None, path=str(f)).header_note() == note
    assert header_note(read_tsv(f), f) == note


@pytest.mark.parametrize("first, rest", [
    ("es\tis", WORDS),  # Spanish-Icelandic words, two of them language codes
    ("German\tDeutsch", "French\tFranzösisch\n"),  # names of languages, translated
    ("cat\tchat", PROSE), ("source\tcible", PROSE), ("en\ten", PROSE),
    ("question\tanswer", "answer\tfrage\n"),  # a word the file holds again
    ("en\tfr", "fr\ten\nthe cat\tle chat\n")])
def test_a_first_pair_of_the_datas_own_kind_is_not_noted(tmp_path, first, rest):
    """No false alarm on a real first pair: words of a word list that are language codes
    too, a language's name and its endonym, one word of a column found again below."""
    f = tmp_path / "d.tsv"
    f.write_text(f"{first}\n{rest}", encoding="utf-8")
    assert DataSpec(task=None, path=str(f)).header_note() == ""
    assert header_note(read_tsv(f), f) == ""


def test_a_split_that_leaves_a_side_empty_says_which_and_by_what_fraction(tmp_path):
    """It said "too few pairs to hold out 0%" of --valid-fraction 0.001 (rounded to 0%), and
    neither how many pairs there were nor which side was empty."""
    pairs = [(f"s{i}", f"t{i}") for i in range(200)]
    f = tmp_path / "d.tsv"
    f.write_text("".join(f"{s}\t{t}\n" for s, t in pairs))
    for fraction, says in ((0.001, "held out none of its 200 pairs"),
                           (0.9999, "held out all of its 200 pairs, leaving none to train on")):
        train, held = split_pairs(pairs, fraction)
        assert not (train and held)  # the split itself leaves that side empty
        with pytest.raises(ScratchGPTError, match=rf"d\.tsv: --valid-fraction {fraction} {says}"):
            DataSpec(task=None, path=str(f), valid_fraction=fraction).load()


def test_reverse_task_is_reversal_with_disjoint_held_out_strings():
    from scratchgpt.data.translation import TASKS, reverse_task

    train, held = reverse_task(n_train=500, n_test=100, seed=1)
    assert len(train) == 500 and len(held) == 100
    assert all(t == s[::-1] and 10 <= len(s) <= 60 and s.isalpha() for s, t in train + held)
    assert not {s for s, _ in train} & {s for s, _ in held}
    assert reverse_task(n_train=5, n_test=5, seed=1) == (train[:5], held[:5])
    assert TASKS["reverse"] is reverse_task
