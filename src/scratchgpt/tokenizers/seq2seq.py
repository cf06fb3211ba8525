"""The character tokenizer of seq2seq models: four special tokens, then the characters.

``<pad>`` (0) fills batches to one length, ``<bos>`` (1) starts every target, ``<eos>`` (2) ends
every source and target, ``<unk>`` (3) stands for a character never seen in training (a
translation must accept any user text). The seq2seq model's config records these ids.

>>> tok = Seq2SeqTokenizer.train(["abc", "cab"])
>>> tok.encode("cat")
[6, 4, 3]
>>> tok.decode([BOS_ID, 4, 5, EOS_ID, 6])
'ab'
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from scratchgpt.errors import TokenizerError
from scratchgpt.tokenizers.base import Tokenizer

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)


class Seq2SeqTokenizer(Tokenizer):
    """Character-level tokenizer; ids ``<pad>=0, <bos>=1, <eos>=2, <unk>=3`` come first."""

    kind = "char-seq2seq"

    def __init__(self, chars: Sequence[str]):
        if len(set(chars)) != len(chars):
            raise TokenizerError("character vocabulary has duplicate entries")
        self.chars = list(chars)
        self.itos = list(SPECIALS) + self.chars
        self.stoi = {c: i + len(SPECIALS) for i, c in enumerate(self.chars)}

    @classmethod
    def train(cls, texts: Iterable[str]) -> Seq2SeqTokenizer:
        """Vocabulary = the sorted set of characters in ``texts``."""
        return cls(sorted(set().union(*map(set, texts))))

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    @property
    def eot_id(self) -> int:
        return EOS_ID

    @property
    def special_ids(self) -> dict[str, int]:
        """The ids a seq2seq model's config records (``pad_id``, ``bos_id``, ``eos_id``,
        ``unk_id``)."""
        return {"pad_id": PAD_ID, "bos_id": BOS_ID, "eos_id": EOS_ID, "unk_id": UNK_ID}

    def encode(self, text: str, unknown: str = "replace") -> list[int]:
        """Characters -> ids; unseen characters become ``<unk>`` (``unknown="error"`` raises)."""
        ids = [self.stoi.get(c, UNK_ID) for c in text]
        if unknown == "error" and UNK_ID in ids:
            missing = sorted({c for c in text if c not in self.stoi})
            raise TokenizerError("characters not in the vocabulary: "
                                 + ", ".join(map(repr, missing)))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Ids -> text, stopping at ``<eos>`` and dropping ``<pad>``/``<bos>``; ``<unk>`` shows."""
        out = []
        for i in ids:
            if i == EOS_ID:
                break
            if i in (PAD_ID, BOS_ID):
                continue
            out.append(self.itos[i])
        return "".join(out)

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        """One printable label per id (for attention plots)."""
        return [self.itos[i] for i in ids]

    def to_dict(self) -> dict[str, Any]:
        return {"chars": self.chars}

    @classmethod
    def from_dict(cls, d: dict[str, Any], directory: Path | None = None) -> Seq2SeqTokenizer:
        return cls(d["chars"])
