"""GGUF files for llama.cpp: our GPT as llama.cpp's ``gpt2`` architecture, with its tokenizer.

A GGUF file is one binary holding key-value metadata (architecture, shapes, the tokenizer) and
named tensors, each stored as f32, f16 or a block-quantized type. It is written here with the
``gguf`` package (llama.cpp's own Python writer). Our GPT is GPT-2, so the mapping is the one
llama.cpp's converter uses for GPT-2:

    ours (state_dict)                  GGUF tensor               ggml shape {ne0, ne1}
    transformer.wte.weight             token_embd.weight         {n_embd, n_vocab}
    transformer.wpe.weight             position_embd.weight      {n_embd, n_ctx}
    transformer.h.N.ln_1.*             blk.N.attn_norm.*         {n_embd}
    transformer.h.N.attn.c_attn.*      blk.N.attn_qkv.*          {n_embd, 3 n_embd}
    transformer.h.N.attn.c_proj.*      blk.N.attn_output.*       {n_embd, n_embd}
    transformer.h.N.ln_2.*             blk.N.ffn_norm.*          {n_embd}
    transformer.h.N.mlp.c_fc.*         blk.N.ffn_up.*            {n_embd, 4 n_embd}
    transformer.h.N.mlp.c_proj.*       blk.N.ffn_down.*          {4 n_embd, n_embd}
    transformer.ln_f.*                 output_norm.*             {n_embd}
    lm_head.weight (untied only)       output.weight             {n_embd, n_vocab}

ggml lists dimensions innermost first, so an ``nn.Linear`` weight (out, in), row-major, is
``{in, out}`` as it is: no transpose (Hugging Face's Conv1D (in, out) needs one). A tied head
writes no ``output`` tensor; llama.cpp then reuses ``token_embd``.

``--type``: ``f32`` (exact weights), ``f16`` (2-D weights in half precision) or ``q8_0`` (2-D
weights in blocks of 32 int8 values with one f16 scale, 8.5 bits per weight). As llama.cpp's
converter does, 1-D tensors (biases, LayerNorms) and the position table stay f32, and a matrix
whose rows are not a multiple of 32 long is written f16 under q8_0 (one note names them all).
Where that is every matrix,
the file is an f16 one: ``general.file_type`` says so, and the export's summary says why.

llama.cpp reads a position past GPT-2's learned table with an assertion that ends the process
(llama-cpp-python's too), whatever its own context size: prompt and output together must stay
within the model's ``block_size``, which the export's notes say.

What llama.cpp's ``gpt2`` cannot compute is refused with a one-line :class:`CheckpointError`:
no biases (it requires them), sinusoidal positions (it reads a learned table), exact GELU (its
GELU is GPT-2's tanh approximation).

**Tokenizers** (``tokenizer.ggml.model = "gpt2"``, pre-tokenizer ``"gpt-2"``: GPT-2's regex):

* byte-level BPE (GPT-2's own or one trained by ``prepare --tokenizer bpe``): tokens as GPT-2's
  printable byte alphabet, special tokens as control tokens, end-of-text as BOS/EOS. llama.cpp
  merges by a list of pairs, lowest rank first; we (like tiktoken) merge any adjacent pair whose
  joined bytes are a token, lowest token id first. So the merge list written here has, for each
  token in id order, every split of it into two tokens, not only the merge that created it:
  ranks then follow token ids and both merge the same pairs. Two corner cases can still differ:
  a chunk that is itself a token, which tiktoken returns whole even where merging would not
  reach it, and two different pairs making the same token side by side (we take the leftmost,
  llama.cpp the one listed first). Neither occurred in 4 MB of English and Python text, with
  GPT-2's vocabulary and two trained ones.
* character level: one token per character, plus merges that rebuild each multi-byte UTF-8
  character from its bytes. Text made of the vocabulary's characters tokenizes to the same ids;
  a character outside it is an error for us, and silently dropped by llama.cpp. Such a
  vocabulary has no end-of-text token, and llama.cpp then takes id 11 as end of generation
  (GPT-2's default): pass ``--ignore-eos`` to llama.cpp's tools.
* ``char-prose`` is refused: it rewrites text (quotes, dashes, line breaks) before encoding,
  which llama.cpp's tokenizer cannot do.

**Chat**: an instruction-tuned model's template is written as ``tokenizer.chat_template``, in
Jinja (:attr:`scratchgpt.chat.ChatTemplate.jinja`), which llama.cpp's chat tools and
llama-cpp-python's ``create_chat_completion`` render prompts with. A reply ends at the
template's markers (:attr:`~scratchgpt.chat.ChatTemplate.reply_stops`: its end of turn, and
any role's marker line a model goes on to write), which are text, not tokens llama.cpp knows
to stop at: the export's notes list them, to pass as stop strings (:func:`stop_note`).

Tested against llama.cpp itself (``tests/checkpoints/test_gguf.py``): logits of the same tokens
and the tokenization of a test text.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from scratchgpt.errors import CheckpointError
from scratchgpt.wording import first_of

if TYPE_CHECKING:
    from torch import Tensor, nn

    from scratchgpt.chat import ChatTemplate

GGUF_TYPES = ("f32", "f16", "q8_0")
Q8_0_BLOCK = 32  # weights per q8_0 block: a row's length must be a multiple of it
NO_MERGE = "\u2400 \u2400"  # "␀ ␀": two characters no byte maps to (see _write_metadata)


def _gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise CheckpointError("writing GGUF files needs the gguf package "
                              "(pip install gguf, or scratchgpt[gguf])") from None
    return gguf


# ---- what llama.cpp's gpt2 can express

def check_exportable(cfg: dict[str, Any]) -> None:
    """Raise :class:`CheckpointError` naming the setting llama.cpp's gpt2 cannot compute:
    anything GPT-2 cannot express (:func:`~scratchgpt.models.gpt.gpt2_incompatibility`, as the
    Hugging Face export refuses), and the exact GELU, which GPT-2's config can name but
    llama.cpp's gpt2 does not compute."""
    from scratchgpt.models.gpt import gpt2_incompatibility

    why = gpt2_incompatibility(cfg)
    if why is not None:
        raise CheckpointError(f"cannot export to GGUF (llama.cpp's gpt2): {why}")
    if cfg.get("activation", "gelu_tanh") != "gelu_tanh":
        raise CheckpointError(f"cannot export to GGUF (llama.cpp's gpt2): --activation "
                              f"{cfg['activation']}: llama.cpp computes GPT-2's "
                              "tanh-approximated GELU; train with --activation gelu_tanh")


# ---- tokenizer

@dataclass
class GGUFVocab:
    """A tokenizer as GGUF's ``tokenizer.ggml.*`` arrays."""

    tokens: list[str]  # each id's text: GPT-2's printable byte alphabet, or a special token
    types: list[int]  # gguf.TokenType per id
    merges: list[str] = field(default_factory=list)  # "left right", rank order
    eos_id: int | None = None
    notes: list[str] = field(default_factory=list)  # what a user of the file should know


def _byte_text(data: bytes, alphabet: dict[int, str]) -> str:
    return "".join(alphabet[b] for b in data)


def bpe_merges(token_bytes: list[bytes]) -> list[tuple[bytes, bytes]]:
    """Every split of every token into two tokens, tokens in id order (the merge ranks).

    ``token_bytes``: the regular tokens' bytes by id (no special tokens). A merge list with
    only the merges that created tokens would miss pairs that tiktoken-style encoding merges
    (``a`` + ``bc`` when ``abc`` was learned as ``ab`` + ``c``).

    >>> bpe_merges([b"a", b"b", b"c", b"ab", b"bc", b"abc"])
    [(b'a', b'b'), (b'b', b'c'), (b'a', b'bc'), (b'ab', b'c')]
    """
    known = set(token_bytes)
    return [(t[:j], t[j:]) for t in token_bytes if len(t) > 1
            for j in range(1, len(t)) if t[:j] in known and t[j:] in known]


def bpe_vocab(tok: Any) -> GGUFVocab:
    """GGUF arrays for a byte-level BPE tokenizer (``scratchgpt.tokenizers.BPETokenizer``)."""
    from scratchgpt.tokenizers.bpe_files import bytes_to_unicode
    from scratchgpt.tokenizers.pretokenize import GPT2_PATTERN

    gguf = _gguf()
    if tok.pattern != GPT2_PATTERN:
        raise CheckpointError("this BPE tokenizer has its own pre-tokenizer pattern; llama.cpp's "
                              "gpt2 tokenizer splits text with GPT-2's")
    alphabet = bytes_to_unicode()
    special_ids = set(tok.special_tokens.values())
    regular = [tok.token_bytes(i) for i in range(tok.vocab_size) if i not in special_ids]
    tokens, types = [], []
    for i in range(tok.vocab_size):
        if i in special_ids:
            tokens.append(tok.token_bytes(i).decode("utf-8"))
            types.append(int(gguf.TokenType.CONTROL))
        else:
            tokens.append(_byte_text(tok.token_bytes(i), alphabet))
            types.append(int(gguf.TokenType.NORMAL))
    merges = [f"{_byte_text(a, alphabet)} {_byte_text(b, alphabet)}"
              for a, b in bpe_merges(regular)]
    return GGUFVocab(tokens, types, merges, tok.eot_id)


def char_vocab(tok: Any) -> GGUFVocab:
    """GGUF arrays for a character tokenizer: one token per character, and merges that join
    the bytes of each multi-byte character (only ever inside one character: a merge's right
    side is a UTF-8 continuation byte, which never starts a character)."""
    from scratchgpt.tokenizers.bpe_files import bytes_to_unicode

    gguf = _gguf()
    alphabet = bytes_to_unicode()
    merges: dict[str, None] = {}  # ordered set
    for c in tok.chars:
        data = c.encode("utf-8")
        for j in range(1, len(data)):
            merges[f"{_byte_text(data[:j], alphabet)} {_byte_text(data[j:j + 1], alphabet)}"] = None
    eleven = repr(tok.chars[11]) if len(tok.chars) > 11 else None
    notes = [] if eleven is None else [
        f"a character vocabulary has no end-of-text token, so llama.cpp ends generation at id "
        f"11 ({eleven}), GPT-2's default: run llama.cpp with --ignore-eos"]
    return GGUFVocab([_byte_text(c.encode("utf-8"), alphabet) for c in tok.chars],
                     [int(gguf.TokenType.NORMAL)] * len(tok.chars), list(merges), None, notes)


def gguf_vocab(tok: Any) -> GGUFVocab:
    """GGUF arrays for ``tok``, or a :class:`CheckpointError` when llama.cpp cannot tokenize
    like it."""
    kind = getattr(tok, "kind", None)
    if kind == "bpe":
        return bpe_vocab(tok)
    if kind == "char":
        return char_vocab(tok)
    if kind == "char-prose":
        raise CheckpointError("a char-prose tokenizer cannot be exported to GGUF: it rewrites "
                              "text (quotes, dashes, line breaks) before encoding, which "
                              "llama.cpp's tokenizer cannot do")
    raise CheckpointError(f"a {kind!r} tokenizer cannot be exported to GGUF (byte-level BPE or "
                          "char only)")


# ---- tensors

def gguf_tensor_names(cfg: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(our state_dict key, GGUF tensor name) for every tensor of a GPT with config ``cfg``."""
    gguf = _gguf()
    T, names = gguf.MODEL_TENSOR, gguf.TENSOR_NAMES
    yield "transformer.wte.weight", names[T.TOKEN_EMBD] + ".weight"
    yield "transformer.wpe.weight", names[T.POS_EMBD] + ".weight"
    per_layer = (("ln_1", T.ATTN_NORM), ("attn.c_attn", T.ATTN_QKV), ("attn.c_proj", T.ATTN_OUT),
                 ("ln_2", T.FFN_NORM), ("mlp.c_fc", T.FFN_UP), ("mlp.c_proj", T.FFN_DOWN))
    for i in range(cfg["n_layer"]):
        for ours, theirs in per_layer:
            for kind in ("weight", "bias"):
                yield (f"transformer.h.{i}.{ours}.{kind}",
                       names[theirs].format(bid=i) + f".{kind}")
    for kind in ("weight", "bias"):
        yield f"transformer.ln_f.{kind}", names[T.OUTPUT_NORM] + f".{kind}"
    if not cfg.get("tie_weights", True):
        yield "lm_head.weight", names[T.OUTPUT] + ".weight"


def encode_tensor(name: str, t: Tensor, qtype: str) -> tuple[np.ndarray, Any, str | None]:
    """(data, ggml type, a note or None) for one tensor under ``--type qtype``: 1-D tensors and
    the position table f32; matrices f32, f16 or q8_0 (f16, with a note, when a row is not a
    multiple of 32 long)."""
    gguf = _gguf()
    Q = gguf.GGMLQuantizationType
    data = t.detach().float().cpu().contiguous().numpy()
    if qtype == "f32" or data.ndim == 1 or name.startswith("position_embd"):
        return data, Q.F32, None
    if qtype == "f16":
        return data.astype(np.float16), Q.F16, None
    if data.shape[-1] % Q8_0_BLOCK:
        return (data.astype(np.float16), Q.F16,
                f"{name} written f16: its rows are not a multiple of {Q8_0_BLOCK} long")
    return gguf.quants.quantize(data, Q.Q8_0), Q.Q8_0, None


@dataclass
class GGUFExport:
    """What :func:`save_gguf` wrote."""

    path: Path
    type: str  # the file's type: what was written, which --type q8_0 may not be
    n_tensors: int
    notes: list[str]
    instead: str | None = None  # why the type is not the one asked for


# (name, data, ggml type, a note or None) of each tensor, as encode_tensor makes them
Encoded = list[tuple[str, np.ndarray, Any, str | None]]


def encode_tensors(model: nn.Module, cfg: dict[str, Any], qtype: str) -> Encoded:
    """Every tensor of ``model`` under ``--type qtype``, by its GGUF name."""
    state = model.state_dict()
    return [(theirs, *encode_tensor(theirs, state[ours], qtype))
            for ours, theirs in gguf_tensor_names(cfg)]


def written_type(qtype: str, tensors: Encoded) -> tuple[str, str | None, list[str]]:
    """(the file's type, why it is not ``qtype`` or None, the notes on it). ``q8_0`` where
    no matrix could be quantized (no row a multiple of 32 long) wrote f16 only: the file is
    f16 then, and one line says why; where some could, one note names those kept in f16 (a
    note for each was a screenful for a small model)."""
    Q = _gguf().GGMLQuantizationType
    kept = [(name, data.shape[-1]) for name, data, t, _ in tensors if t == Q.F16]
    if qtype != "q8_0" or not kept:
        return qtype, None, [note for *_, note in tensors if note]
    lengths = " or ".join(map(str, sorted({n for _, n in kept})))
    why = f"q8_0 needs rows a multiple of {Q8_0_BLOCK} long and these are {lengths} long"
    quantized = sum(t == Q.Q8_0 for _, _, t, _ in tensors)
    if not quantized:
        return "f16", f"q8_0 requested, every matrix kept in f16 because {why}", []
    names = first_of([name for name, _ in kept], 3)
    return qtype, None, [f"{len(kept)} of {len(kept) + quantized} matrices written f16 "
                         f"({names}): {why}"]


FILE_TYPES = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "q8_0": "MOSTLY_Q8_0"}


def _write_metadata(w: Any, cfg: dict[str, Any], vocab: GGUFVocab, qtype: str,
                    name: str, chat_template: ChatTemplate | None) -> None:
    gguf = _gguf()
    w.add_name(name)
    w.add_context_length(cfg["block_size"])
    w.add_embedding_length(cfg["n_embd"])
    w.add_feed_forward_length(4 * cfg["n_embd"])
    w.add_block_count(cfg["n_layer"])
    w.add_head_count(cfg["n_head"])
    w.add_layer_norm_eps(float(cfg.get("layer_norm_eps", 1e-5)))
    w.add_file_type(int(getattr(gguf.LlamaFileType, FILE_TYPES[qtype])))
    if qtype == "q8_0":
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(vocab.tokens)
    w.add_token_types(vocab.types)
    # llama.cpp requires a merge list and the writer refuses an empty one: a vocabulary without
    # merges (ASCII characters, bare bytes) gets one merge of two characters outside GPT-2's
    # byte alphabet, which tokenized text never contains, so it never applies
    w.add_token_merges(vocab.merges or [NO_MERGE])
    if vocab.eos_id is not None:
        w.add_bos_token_id(vocab.eos_id)
        w.add_eos_token_id(vocab.eos_id)
    w.add_add_bos_token(False)
    if chat_template is not None:
        w.add_chat_template(chat_template.jinja)


def save_gguf(model: nn.Module, path: str | Path, tokenizer: Any, qtype: str = "f32",
              name: str = "scratchgpt", chat_template: ChatTemplate | None = None
              ) -> GGUFExport:
    """Write ``model`` (our GPT) and ``tokenizer`` as a GGUF file that llama.cpp loads as its
    ``gpt2`` architecture; ``qtype`` is one of :data:`GGUF_TYPES`; an instruction-tuned
    model's ``chat_template`` goes in as Jinja (``tokenizer.chat_template``). The file is
    written to a temporary name and renamed, so a failure leaves no partial file at ``path``;
    the name holds the process id (``.NAME.PID.X.tmp``), so that the next export to ``path``
    removes the temporary of one killed outright (never a live export's), and one an older
    scratchgpt left without the id (``.NAME.tmp``) once a day old.

    ``q8_0`` quantizes the matrices whose rows are a multiple of 32 long and writes the rest
    f16; where that is every matrix, the file is an f16 one (``general.file_type``),
    :attr:`GGUFExport.type` says ``f16`` and :attr:`GGUFExport.instead` why."""
    from scratchgpt.checkpoints.hf import check_gpt_to_export
    from scratchgpt.checkpoints.io import (
        TEMP_SUFFIX,
        missing_folders,
        remove_dead_temporaries,
        remove_folders,
        temporary_name,
        write_failure,
    )

    check_gpt_to_export(model, "GGUF")
    if qtype not in GGUF_TYPES:
        raise CheckpointError(f"GGUF type {qtype!r} is not supported; choose one of "
                              f"{', '.join(GGUF_TYPES)}")
    cfg = model.config.to_dict()
    check_exportable(cfg)
    if tokenizer is None:
        raise CheckpointError("a GGUF file must hold the tokenizer, and this checkpoint has none")
    vocab = padded(gguf_vocab(tokenizer), cfg["vocab_size"])
    tensors = encode_tensors(model, cfg, qtype)
    written, instead, notes = written_type(qtype, tensors)
    path = Path(path)
    created = missing_folders(path.parent)
    path.parent.mkdir(parents=True, exist_ok=True)
    # an export killed outright left them (an older scratchgpt's without its process id)
    remove_dead_temporaries(path.parent, path.name, re.escape(f".{path.name}{TEMP_SUFFIX}"))
    tmp = path.with_name(temporary_name(path.name))
    w = _gguf().GGUFWriter(tmp, "gpt2")
    try:
        _write_metadata(w, cfg, vocab, written, name, chat_template)
        for theirs, data, ggml_type, _ in tensors:
            w.add_tensor(theirs, data, raw_dtype=ggml_type)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        tmp.replace(path)
    except BaseException as e:  # Ctrl-C and SIGTERM too: no temporary file stays
        w.close()
        tmp.unlink(missing_ok=True)
        remove_folders(created)
        if isinstance(e, OSError):  # a full disk: numpy's short write names no file
            raise write_failure(path, e) from None
        raise
    chat = [] if chat_template is None else [stop_note(chat_template)]
    return GGUFExport(path, written, len(tensors),
                      [*chat, *vocab.notes, context_note(cfg["block_size"]), *notes], instead)


def stop_note(template: ChatTemplate) -> str:
    """Where a chat model's replies end for llama.cpp: its end-of-text token, not the
    template's markers, which scratchgpt's replies end at (``reply_stops``) and which a user
    passes as stop strings."""
    return (f"llama.cpp stops at end of text, not where this template's replies end: pass "
            f"stop={list(template.reply_stops)!r} (llama-cpp-python, llama-server), or one "
            "--reverse-prompt each (llama-cli)")


def context_note(block_size: int) -> str:
    """What llama.cpp does past the model's context: GPT-2 learns one position embedding per
    place, and llama.cpp reads a position past the table with an assertion that ends the
    process (llama-cpp-python's too), whatever its own context size (``-c``, ``n_ctx``)."""
    return (f"the model has {block_size} learned positions: keep llama.cpp's prompt and output "
            f"within {block_size} tokens, as llama.cpp ends the process with an assertion "
            "past them (GGML_ASSERT ... i01 < ne01)")


def padded(vocab: GGUFVocab, vocab_size: int) -> GGUFVocab:
    """``vocab`` with unused ``[PADn]`` tokens up to the model's ``vocab_size`` rows (a model
    may have more embeddings than its tokenizer has tokens, never fewer)."""
    n = len(vocab.tokens)
    if n > vocab_size:
        raise CheckpointError(f"the tokenizer has {n} tokens but the model only {vocab_size} "
                              "embeddings")
    vocab.tokens += [f"[PAD{i}]" for i in range(n, vocab_size)]
    vocab.types += [int(_gguf().TokenType.UNUSED)] * (vocab_size - n)
    return vocab
