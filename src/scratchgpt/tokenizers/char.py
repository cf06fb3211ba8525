"""Character-level tokenizer: one id per distinct character of the training text."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scratchgpt.errors import TokenizerError
from scratchgpt.tokenizers.base import Tokenizer, check_unknown_policy
from scratchgpt.wording import first_of, plural

# Up to this many distinct missing characters are counted with one str.count each; more (text
# in another script) with one Counter pass: 3,000 kinds in 2 M characters took 2.5 s counted
# one by one, 0.2 s in one pass.
FEW_MISSING = 16


class CharTokenizer(Tokenizer):
    """Vocabulary = the sorted set of characters seen in the training text."""

    kind = "char"

    def __init__(self, chars: Sequence[str]):
        if len(set(chars)) != len(chars):
            raise TokenizerError("character vocabulary has duplicate entries")
        if not chars:
            raise TokenizerError("character vocabulary is empty")
        if not all(isinstance(c, str) and len(c) == 1 for c in chars):
            raise TokenizerError("character vocabulary entries must be single characters")
        lone = [c for c in chars if "\ud800" <= c <= "\udfff"]
        if lone:  # (tokenizer.json could not be written: UTF-8 has no spelling for one)
            raise TokenizerError(f"character vocabulary holds a lone surrogate, "
                                 f"U+{ord(lone[0]):04X}: not a character UTF-8 can store (text "
                                 "decoded with errors='surrogateescape'?); decode the text with "
                                 "errors='replace'")
        self.chars = list(chars)
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @classmethod
    def train(cls, text: str) -> CharTokenizer:
        """Build the vocabulary from ``text``."""
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def unknown_count(self, text: str) -> int:
        """How many characters of ``text`` are not in the vocabulary.

        >>> CharTokenizer.train("abc").unknown_count("abcd, ab")  # "d", "," and " "
        3
        """
        missing = set(text).difference(self.stoi)  # one pass in C; mostly empty
        if len(missing) <= FEW_MISSING:
            return sum(text.count(c) for c in missing)  # a pass in C for each
        counts = Counter(text)  # many (another script): one counting pass instead
        return sum(counts[c] for c in missing)

    def _replacement(self) -> int:
        for c in ("?", " ", "_"):
            if c in self.stoi:
                return self.stoi[c]
        return 0

    def encode(self, text: str, unknown: str = "error") -> list[int]:
        check_unknown_policy(unknown)  # (a text without unknown characters too)
        stoi = self.stoi
        try:
            return [stoi[c] for c in text]
        except KeyError:
            pass
        missing = sorted({c for c in text if c not in stoi})
        if unknown == "replace":
            rep = self._replacement()
            return [stoi.get(c, rep) for c in text]
        raise TokenizerError(f"text has {plural(len(missing), 'character')} not in the "
                             f"vocabulary: {first_of([repr(c) for c in missing], 10)}")

    def decode(self, ids: Sequence[int]) -> str:
        chars = self.chars
        try:
            if len(ids) and min(ids) < 0:  # a negative index would silently count from the end
                raise IndexError
            return "".join([chars[i] for i in ids])
        except (IndexError, TypeError):
            bad = [i for i in ids if not (isinstance(i, int) and 0 <= i < len(chars))]
            raise TokenizerError(
                f"token ids out of range 0..{len(chars) - 1}: {bad[:10]}") from None

    def to_dict(self) -> dict[str, Any]:
        return {"chars": self.chars}

    @classmethod
    def from_dict(cls, d: dict[str, Any], directory: Path | None = None) -> CharTokenizer:
        return cls(d["chars"])


# Typographic characters with a plain ASCII spelling (Project Gutenberg texts use both).
_PROSE_MAP = {"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2014": "-",
              "\u2013": "-", "\u2026": "...", "\u00a0": " "}
PROSE_PUNCTUATION = " .,;:!?'\"-()"


def normalize_prose(text: str) -> str:
    """Keep letters, digits, space and basic punctuation (``.,;:!?'"-()``).

    Curly quotes, dashes and the ellipsis become their ASCII forms; every other character
    (newlines, tabs, underscores, symbols) becomes a space, and runs of spaces fold into one, so
    line breaks of a hard-wrapped book vanish. Idempotent: ``normalize_prose`` of its own output
    changes nothing.
    """
    out = []
    for c in text:
        for d in _PROSE_MAP.get(c, c):
            out.append(d if d.isalnum() or d in PROSE_PUNCTUATION else " ")
    return " ".join("".join(out).split())


class ProseCharTokenizer(CharTokenizer):
    """A character tokenizer over prose normalized by :func:`normalize_prose`.

    ``encode`` normalizes first, so ``decode(encode(t)) == normalize_prose(t)``: the folded
    characters are not *unknown*, they are spelled the normalized way. A character that survives
    normalization but is missing from the vocabulary (a rare accented letter seen only in the
    validation text) follows the usual ``unknown`` policy (error, or replace).
    """

    kind = "char-prose"

    @classmethod
    def train(cls, text: str) -> ProseCharTokenizer:
        """Build the vocabulary from the normalized ``text``."""
        return cls(sorted(set(normalize_prose(text))))

    def encode(self, text: str, unknown: str = "error") -> list[int]:
        return super().encode(normalize_prose(text), unknown)

    def unknown_count(self, text: str) -> int:
        """How many characters of ``text``, once normalized, are not in the vocabulary."""
        return super().unknown_count(normalize_prose(text))
