"""Parallel text for sequence-to-sequence models: TSV files and a generated dates task.

A *pair* is ``(source, target)``, two strings. Each side has its own character-level
:class:`~scratchgpt.tokenizers.seq2seq.Seq2SeqTokenizer` whose first four ids are the special
tokens ``<pad>``, ``<bos>``, ``<eos>``, ``<unk>``.

Unknown-character policy: the vocabularies are built from the training pairs. A source character
never seen in training is encoded as ``<unk>`` (the model then translates the rest), because
``translate`` must accept any user text. A target character never seen in training can only occur
in evaluation references; it is also mapped to ``<unk>``, which the model never produces, so such a
reference always counts as a miss rather than crashing the evaluation.

The dates task turns dates written many ways ("the 3rd of march 1999", "03/03/1999", "3 mar 99",
"tuesday, 3 march 1999", ...) into ISO ``1999-03-03``. Held-out dates are a fixed set (chosen by a
hash of the date, independent of the seed), so no held-out date is ever seen in training.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import random
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from scratchgpt.data.sources import decode_utf8, text_lines
from scratchgpt.errors import DataError
from scratchgpt.validation import check_range, file_source_problem
from scratchgpt.wording import plural

Pair = tuple[str, str]

# ---------------------------------------------------------------------------------------------
# TSV files
# ---------------------------------------------------------------------------------------------


def read_tsv(path: str | Path) -> list[Pair]:
    """Read ``source<TAB>target`` lines. Empty or malformed lines raise ``DataError(file:line)``."""
    path = Path(path)
    problem = file_source_problem(path)
    if problem is not None:  # a folder was "no such file", though it is there
        raise DataError(f"{path} {problem}")
    # (a byte-order mark, which some editors write, is not the first source's first character;
    # UTF-16 is refused with or without one, not split into pairs of it)
    text = decode_utf8(path.read_bytes(), path)
    pairs = []
    for n, line in enumerate(text_lines(text), start=1):
        if not line.strip():
            raise DataError(f"{path}:{n}: empty line (expected 'source<TAB>target')")
        fields = line.split("\t")
        if len(fields) != 2:
            raise DataError(
                f"{path}:{n}: expected exactly one TAB between source and target, "
                f"found {len(fields) - 1}"
            )
        src, tgt = fields
        if not src or not tgt:
            side = "source" if not src else "target"
            raise DataError(f"{path}:{n}: empty {side}")
        pairs.append((src, tgt))
    if not pairs:
        raise DataError(f"{path}: no pairs")
    return pairs


# first lines that name the columns ('source<TAB>target'), case aside: read as a pair
HEADERS = frozenset({("source", "target"), ("input", "output"), ("src", "tgt")})
# words that name a column of pairs, each side's own (input<TAB>target names both too)
SOURCE_NAMES = frozenset({"source", "src", "input", "original", "question", "prompt", "query"})
TARGET_NAMES = frozenset({"target", "tgt", "output", "translation", "answer", "response",
                          "reference"})
# the names of languages a column of translations is named by: ISO 639-1 and 639-2 codes,
# with a region ('en-US', 'pt_BR') or none, and English names. Endonyms ('Deutsch') are left
# out: 'German<TAB>Deutsch' is a pair of an English-German list of language names
LANGUAGE_CODES = frozenset(
    "ar bg bn ca cs cy da de el en eo es et eu fa fi fr ga gl he hi hr hu hy id is it ja ka "
    "kk ko la lt lv mk ms mt nb nl nn no pl pt ro ru sk sl sq sr sv sw ta te th tl tr uk ur "
    "uz vi zh ara bul cat ces chi cze dan deu dut ell eng epo est fas fin fra fre ger gre heb "
    "hin hrv hun ind isl ita jpn kor lat lit nld nor per pol por ron rum rus slk slv spa srp "
    "swe tha tur ukr urd vie zho".split())
LANGUAGE_NAMES = frozenset(
    "arabic bulgarian catalan chinese croatian czech danish dutch english esperanto estonian "
    "finnish french german greek hebrew hindi hungarian icelandic indonesian irish italian "
    "japanese korean latin latvian lithuanian malay norwegian persian polish portuguese "
    "romanian russian serbian slovak slovenian spanish swahili swedish thai turkish "
    "ukrainian urdu vietnamese welsh".split())
_REGION = re.compile(r"(?P<code>[a-z]{2,3})(?:[-_][a-z0-9]{2,4})?")


def _language(field: str) -> str:
    """'code' for a language code ('fr', 'eng', 'en-US'), 'name' for a language's English name,
    or ''."""
    if field in LANGUAGE_NAMES:
        return "name"
    m = _REGION.fullmatch(field)
    return "code" if m and m["code"] in LANGUAGE_CODES else ""


def _names_columns(src: str, tgt: str) -> bool:
    """``src<TAB>tgt`` (lower case, stripped) names two columns: as HEADERS do, by a source's
    name and a target's, or by two languages' names or codes."""
    if (src, tgt) in HEADERS or (src in SOURCE_NAMES and tgt in TARGET_NAMES):
        return True
    return src != tgt and bool(_language(src)) and bool(_language(tgt))


def _looks_like_data(pairs: Sequence[Pair], src: str, tgt: str) -> bool:
    """The first pair, ``src<TAB>tgt`` (lower case, stripped), is one of the data's own: either
    word is a field of another pair ('question<TAB>answer' of a word list that holds
    'answer<TAB>réponse'),
    or it names languages by codes, which are words too ('es<TAB>is' of a Spanish-Icelandic
    word list), and no other pair is longer than a word."""
    rest = pairs[1:]
    fields = {f.strip().lower() for pair in rest for f in pair}
    if src in fields or tgt in fields:
        return True
    codes = _language(src) == "code" and _language(tgt) == "code"
    return codes and not any(len(f.split()) > 1 for pair in rest for f in pair)


def header_note(pairs: Sequence[Pair], path: str | Path) -> str:
    """A note that the first pair of ``pairs`` (of the file ``path``) looks like a header, or
    ''. Every line is a pair: a header was trained on as one, with no word. A header names
    the columns (one of HEADERS, 'input<TAB>translation') or the languages ('en<TAB>fr',
    'English<TAB>French') by words found nowhere else in the file.

    >>> header_note([("Source", "Target"), ("a", "b")], "p.tsv")
    "note: p.tsv:1 'Source<TAB>Target' is read as a pair; if it is a header, remove it"
    >>> header_note([("en", "fr"), ("the cat", "le chat")], "p.tsv")
    "note: p.tsv:1 'en<TAB>fr' is read as a pair; if it is a header, remove it"
    >>> header_note([("source", "cible")], "p.tsv")
    ''
    """
    if not pairs:
        return ""
    src, tgt = (f.strip().lower() for f in pairs[0])
    if not _names_columns(src, tgt) or _looks_like_data(pairs, src, tgt):
        return ""
    src, tgt = pairs[0]
    return f"note: {path}:1 '{src}<TAB>{tgt}' is read as a pair; if it is a header, remove it"


def pairs_sha256(pairs: Sequence[Pair]) -> str:
    """A fingerprint of ``pairs`` in their order: the same for the same pairs whatever the
    file's line endings or byte-order mark.

    >>> pairs_sha256([("a", "b")]) == pairs_sha256([("a", "b")]) != pairs_sha256([("a", "c")])
    True
    """
    return hashlib.sha256("".join(f"{s}\t{t}\n" for s, t in pairs).encode()).hexdigest()


def split_pairs(pairs: Sequence[Pair], valid_fraction: float) -> tuple[list[Pair], list[Pair]]:
    """Deterministic train/held-out split by a hash of the source, so a source (and its
    duplicates) lands on one side only, whatever the order of the file."""
    train, held = [], []
    for p in pairs:
        bucket = zlib.crc32(p[0].encode("utf-8")) % 10_000
        (held if bucket < valid_fraction * 10_000 else train).append(p)
    return train, held


# ---------------------------------------------------------------------------------------------
# The dates task
# ---------------------------------------------------------------------------------------------

MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august",
          "september", "october", "november", "december")
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
FIRST_DATE, LAST_DATE = dt.date(1950, 1, 1), dt.date(2049, 12, 31)  # two-digit years are unique


def _ordinal(n: int) -> str:
    suffix = "th" if 11 <= n % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


# Every way this task writes a date, as templates of the fields of _fields. Numeric forms are
# day-first (03/04 is 3 April).
FORMATS = (
    "{day} {mon} {yr}",
    "{day} {short} {yr}",
    "{day} {short} {yy}",
    "{mon} {day}, {yr}",
    "{Mon} {day}, {yr}",
    "{short} {day} {yr}",
    "the {nth} of {mon} {yr}",
    "{nth} {mon} {yr}",
    "{mon} {nth}, {yr}",
    "{day:02d}/{m:02d}/{yr}",
    "{day}/{m}/{yy}",
    "{day:02d}.{m:02d}.{yr}",
    "{day:02d}-{short}-{yr}",
    "{yr}/{m:02d}/{day:02d}",
    "{wd}, {day} {mon} {yr}",
    "{Wd}, {Mon} {day}, {yr}",
    "{wd3} {day} {short} {yr}",
    "{day} {MON} {yr}",
)


def _fields(d: dt.date) -> dict[str, object]:
    """The parts of ``d`` that FORMATS write: ``{"day": 3, "mon": "march", "nth": "3rd",
    "yy": "99", ...}``."""
    mon, wd = MONTHS[d.month - 1], WEEKDAYS[d.weekday()]
    return dict(day=d.day, m=d.month, yr=d.year, yy=f"{d.year % 100:02d}", mon=mon,
                Mon=mon.capitalize(), MON=mon.upper(), short=mon[:3], nth=_ordinal(d.day),
                wd=wd, Wd=wd.capitalize(), wd3=wd[:3])


def written(d: dt.date, template: str) -> str:
    """``d`` written as ``template`` (one of FORMATS): ``written(date(1999, 3, 3),
    "the {nth} of {mon} {yr}") == "the 3rd of march 1999"``."""
    return template.format(**_fields(d))


def is_held_out_date(d: dt.date) -> bool:
    """The fixed held-out dates: about 10% of all days, chosen by a hash of the ISO string."""
    return zlib.crc32(d.isoformat().encode()) % 10 == 0


def _random_date(rng: random.Random, held_out: bool) -> dt.date:
    span = (LAST_DATE - FIRST_DATE).days
    while True:
        d = FIRST_DATE + dt.timedelta(days=rng.randint(0, span))
        if is_held_out_date(d) == held_out:
            return d


def dates_pairs(n: int, seed: int, held_out: bool) -> list[Pair]:
    """``n`` (written date, ISO date) pairs, deterministic in ``seed``; ``held_out`` picks the
    side of the fixed date split."""
    rng = random.Random(seed * 2 + int(held_out))
    out = []
    for _ in range(n):
        d = _random_date(rng, held_out)
        out.append((written(d, rng.choice(FORMATS)), d.isoformat()))
    return out


def dates_task(n_train: int = 100_000, n_test: int = 2_000, seed: int = 0) -> tuple[
    list[Pair], list[Pair]
]:
    """(train pairs, held-out pairs) of the dates task; the two share no date."""
    return dates_pairs(n_train, seed, held_out=False), dates_pairs(n_test, seed, held_out=True)


# ---------------------------------------------------------------------------------------------
# Number words <-> digits (a second small task)
# ---------------------------------------------------------------------------------------------

_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
         "fifteen sixteen seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def number_words(n: int) -> str:
    """English words for ``0 <= n < 1_000_000`` ("three hundred and four")."""
    if not 0 <= n < 1_000_000:
        raise ValueError("n must be in [0, 1000000)")
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else "-" + _ONES[n % 10])
    if n < 1000:
        rest = n % 100
        return _ONES[n // 100] + " hundred" + ("" if rest == 0 else " and " + number_words(rest))
    rest = n % 1000
    tail = "" if rest == 0 else (" and " if rest < 100 else " ") + number_words(rest)
    return number_words(n // 1000) + " thousand" + tail


def numbers_task(n_train: int = 50_000, n_test: int = 2_000, seed: int = 0,
                 to_digits: bool = True) -> tuple[list[Pair], list[Pair]]:
    """Numbers below a million in words -> digits (or back); held-out numbers are a fixed set."""

    def pairs(k: int, held: bool) -> list[Pair]:
        rng, out = random.Random(seed * 2 + int(held)), []
        while len(out) < k:
            n = rng.randrange(1_000_000) if rng.random() < 0.8 else rng.randrange(1000)
            if (zlib.crc32(str(n).encode()) % 10 == 0) == held:
                w, d = number_words(n), str(n)
                out.append((w, d) if to_digits else (d, w))
        return out

    return pairs(n_train, False), pairs(n_test, True)


# ---------------------------------------------------------------------------------------------
# Reversal of long strings (the task where a fixed-size encoder state runs out)
# ---------------------------------------------------------------------------------------------

REVERSE_ALPHABET = "abcdefghijklmnopqrstuvwxyz"


def reverse_task(n_train: int = 200_000, n_test: int = 2_000, seed: int = 0,
                 min_len: int = 10, max_len: int = 60) -> tuple[list[Pair], list[Pair]]:
    """Random lowercase strings of ``min_len..max_len`` letters -> the same string reversed.

    Every source character must reach the decoder, so a model without attention has to squeeze
    up to ``max_len * log2(26)`` (~280) bits through its final encoder state: accuracy by source
    length shows that bottleneck. Held-out strings are a fixed set (by a hash of the string)."""

    def pairs(k: int, held: bool) -> list[Pair]:
        rng, out = random.Random(seed * 2 + int(held)), []
        while len(out) < k:
            s = "".join(rng.choices(REVERSE_ALPHABET, k=rng.randint(min_len, max_len)))
            if (zlib.crc32(s.encode()) % 10 == 0) == held:
                out.append((s, s[::-1]))
        return out

    return pairs(n_train, False), pairs(n_test, True)


TASKS = {"dates": dates_task, "numbers": numbers_task, "reverse": reverse_task}


def _one_sided(pairs: Sequence[Pair], held_none: bool) -> str:
    """Why a split of ``pairs`` left one side empty, and what to do: the words after 'held out'.
    The split goes by source, so pairs of a few sources (a label-first file, as classify
    reads, has two: 'ham', 'spam') land on one side however many they are: 'give more pairs'
    did not help there."""
    n, sources = len(pairs), len({s for s, _ in pairs})
    what = f"{'none' if held_none else 'all'} of its {plural(n, 'pair', grouped=True)}"
    side = "" if held_none else ", leaving none to train on"
    bound = "larger" if held_none else "smaller"
    if sources == n:
        return (f"{what}{side} (a hash of each source picks them); give more pairs or a "
                f"{bound} --valid-fraction")
    return (f"{what}{side}: they have {plural(sources, 'distinct source', grouped=True)}, and "
            "a hash of the source puts all the pairs of a source on one side; give pairs of "
            "more sources (is the first column the source, 'source<TAB>target'?) or a "
            f"{bound} --valid-fraction")


@dataclass
class DataSpec:
    """Where a seq2seq run's pairs come from: a generated ``task`` or a TSV file at ``path``.

    Stored in checkpoints so that ``eval`` rebuilds exactly the same held-out pairs. The
    ``sha256`` of a TSV file's pairs (:func:`pairs_sha256`) is recorded by the first
    :meth:`load` and checked by every later one: a file edited since the run trained on it was
    read in silence, by ``--resume`` (new characters became ``<unk>`` of the run's
    vocabularies) and by ``eval`` (on a held-out split that was not the run's).
    """

    task: str | None = "dates"
    path: str | None = None
    n_train: int = 200_000  # generated tasks only
    n_test: int = 2_000  # generated tasks only
    seed: int = 0
    valid_fraction: float = 0.1  # TSV only: share of sources held out
    sha256: str | None = None  # TSV only: of its pairs, once loaded (None in older runs)

    def __post_init__(self) -> None:
        if (self.task is None) == (self.path is None):
            raise DataError("give either a task or a TSV data file, not both")
        if self.task is not None and self.task not in TASKS:
            raise DataError(f"unknown task {self.task!r} (choose from {', '.join(TASKS)})")
        if self.n_train < 1 or self.n_test < 1:
            raise DataError("n_train and n_test must be >= 1")
        # named as a setting, so that the refusal names the flag (it said "valid fraction")
        check_range("valid_fraction", self.valid_fraction, 0, 1, low_open=True, high_open=True)

    def load(self) -> tuple[list[Pair], list[Pair]]:
        """-> (training pairs, held-out pairs)."""
        if self.task is not None:
            return TASKS[self.task](n_train=self.n_train, n_test=self.n_test, seed=self.seed)
        pairs = read_tsv(self.path)
        digest = pairs_sha256(pairs)
        if self.sha256 is not None and digest != self.sha256:
            raise DataError(f"the pairs of {self.path} have changed since the run was trained "
                            "on them, so they and their held-out split are not the run's: put "
                            "the run's file back, or train a new run on this one ('seq2seq "
                            "eval --data' scores every pair of a file)")
        self.sha256 = digest
        train, held = split_pairs(pairs, self.valid_fraction)
        if not train or not held:  # (it said "too few pairs to hold out 0%" of 0.001)
            raise DataError(f"{self.path}: --valid-fraction {self.valid_fraction:g} held out "
                            + _one_sided(pairs, held_none=not held))
        return train, held

    def header_note(self) -> str:
        """:func:`header_note` of a TSV file ('' for a task), a file :meth:`load` has read:
        only its first line is read again, unless that line names columns."""
        if self.path is None:
            return ""
        with open(self.path, "rb") as f:
            first = text_lines(decode_utf8(f.readline(), self.path))[:1]
        fields = first[0].split("\t") if first else []
        if len(fields) != 2 or not _names_columns(*(f.strip().lower() for f in fields)):
            return ""
        return header_note(read_tsv(self.path), self.path)

    def describe(self) -> str:
        return f"task {self.task}" if self.task else f"{self.path}"
