"""Tokenizers: character level and byte-level BPE, saved as a directory with tokenizer.json.

One concept per module:

- ``base``: the :class:`Tokenizer` interface; ``char``: one id per character, and
  :class:`ProseCharTokenizer` (``char-prose``) over prose folded to letters, digits and basic
  punctuation; ``seq2seq``: characters after four special tokens (pad, bos, eos, unk).
- ``bpe``: :class:`BPETokenizer`, byte-level BPE as GPT-2 has it: training, encoding, decoding,
  the special-token policy, saving.
- ``bpe_algorithm``: BPE itself, on lists of ids: pair counts, merges, learning them, and
  applying them to one chunk.
- ``pretokenize``: the regex that cuts text into chunks first, with letters and numbers pinned to
  Unicode 16.0 (``unicode_tables``) so every backend cuts alike.
- ``bpe_files``: vocabulary files: ours, GPT-2's ``encoder.json``/``vocab.bpe``, Hugging Face's.
- ``tiktoken_backend``: the same vocabulary run by tiktoken's Rust core.
"""

from __future__ import annotations

from pathlib import Path

import regex

from scratchgpt.errors import TokenizerError
from scratchgpt.tokenizers.base import TOKENIZER_FILE, Tokenizer
from scratchgpt.tokenizers.bpe import BPETokenizer
from scratchgpt.tokenizers.char import CharTokenizer, ProseCharTokenizer
from scratchgpt.tokenizers.seq2seq import Seq2SeqTokenizer
from scratchgpt.validation import json_loads

# kind -> class; a new tokenizer registers itself here.
TOKENIZERS: dict[str, type[Tokenizer]] = {
    CharTokenizer.kind: CharTokenizer,
    ProseCharTokenizer.kind: ProseCharTokenizer,
    BPETokenizer.kind: BPETokenizer,
    Seq2SeqTokenizer.kind: Seq2SeqTokenizer,
}

# What build_tokenizer accepts: the registered kinds plus "gpt2" (BPE with GPT-2's vocabulary).
BUILD_KINDS = ("char", "char-prose", "bpe", "gpt2")
DEFAULT_BPE_VOCAB = 4096
GPT2_VOCAB = 50257


def build_tokenizer(kind: str, text: str, vocab_size: int | None = None,
                    progress: bool = False) -> Tokenizer:
    """A tokenizer of ``kind`` for ``text``: ``"char"`` (its characters), ``"bpe"`` (trained on
    it, ``vocab_size`` ids, default 4096) or ``"gpt2"`` (GPT-2's fixed 50257-id vocabulary);
    ``"char-prose"`` is ``"char"`` over text folded by
    :func:`~scratchgpt.tokenizers.char.normalize_prose`. ``progress``: bars on stderr while a
    BPE trains, once it has run for a second (:meth:`BPETokenizer.train`)."""
    if kind in ("char", "char-prose"):
        if vocab_size is not None:
            raise TokenizerError("a char tokenizer's vocabulary size is set by the text; "
                            "drop the vocabulary size")
        if not text:
            raise TokenizerError("cannot build a char tokenizer from empty text")
        return (CharTokenizer if kind == "char" else ProseCharTokenizer).train(text)
    if kind == "bpe":
        vocab_size = DEFAULT_BPE_VOCAB if vocab_size is None else vocab_size
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size <= 256:
            raise TokenizerError(
                f"BPE vocabulary size must be an integer above 256 (the byte tokens), "
                            f"got {vocab_size!r}")
        if not text:
            raise TokenizerError("cannot train a BPE tokenizer on empty text")
        return BPETokenizer.train(text, vocab_size, progress=progress)
    if kind == "gpt2":
        if vocab_size is not None and vocab_size != GPT2_VOCAB:
            raise TokenizerError(f"the GPT-2 vocabulary has {GPT2_VOCAB} ids, not "
                                 f"{vocab_size!r}")
        return BPETokenizer.gpt2()
    raise TokenizerError(f"unknown tokenizer kind {kind!r}; choose one of {', '.join(BUILD_KINDS)}")


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """Load the tokenizer saved in ``directory`` (a dataset or checkpoint directory).

    Also reads a Hugging Face ``tokenizer.json`` (byte-level BPE) or GPT-2's ``encoder.json`` +
    ``vocab.bpe``, so a downloaded GPT-2 checkpoint directory loads as it is. The path of a
    ``tokenizer.json`` itself reads its directory."""
    directory = Path(directory)
    if directory.is_file():  # (it was "FILE/tokenizer.json does not exist")
        if directory.name != TOKENIZER_FILE:
            raise TokenizerError(f"{directory} is a file, not the directory of a tokenizer "
                                 f"(the folder that holds its {TOKENIZER_FILE})")
        directory = directory.parent  # (its merges.txt, if any, is beside it)
    path = directory / TOKENIZER_FILE
    if not path.is_file():
        if (directory / "encoder.json").is_file() or (directory / "vocab.bpe").is_file():
            return BPETokenizer.from_gpt2_dir(directory)  # (one alone: the other is named)
        raise TokenizerError(f"no tokenizer found: {path} does not exist")
    try:
        state = json_loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise TokenizerError(f"{path} is not a valid tokenizer file ({e})") from None
    if isinstance(state, dict) and "kind" not in state and "model" in state:
        return BPETokenizer.from_hf_json(path)  # a Hugging Face tokenizer.json
    return tokenizer_from_dict(state, directory, where=str(path))


def tokenizer_from_dict(state: dict, directory: Path | None = None, where: str = "") -> Tokenizer:
    """Rebuild a tokenizer from its saved state (``{"kind": ..., **to_dict()}``)."""
    if not isinstance(state, dict):
        raise TokenizerError(f"{where or 'tokenizer'} is not a valid tokenizer state")
    state = dict(state)
    kind = state.pop("kind", None)
    if kind not in TOKENIZERS:
        raise TokenizerError(f"{where or 'tokenizer'}: unknown tokenizer kind {kind!r}")
    try:
        return TOKENIZERS[kind].from_dict(state, directory)
    except (KeyError, TypeError, ValueError, regex.error) as e:  # a damaged or edited file
        reason = f"no {e.args[0]!r} entry" if isinstance(e, KeyError) else str(e)
        raise TokenizerError(f"{where or 'tokenizer'}: not a valid {kind} tokenizer "
                             f"({reason})") from None


__all__ = [
    "Tokenizer",
    "CharTokenizer",
    "ProseCharTokenizer",
    "BPETokenizer",
    "Seq2SeqTokenizer",
    "TOKENIZERS",
    "build_tokenizer",
    "load_tokenizer",
    "tokenizer_from_dict",
]
