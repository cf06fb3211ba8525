"""Prompts, as the generating commands (``sample``, ``chat``, ``bench speculative``) read
them and tell the user how the model will, and the sampling flags they refuse or note alike."""

from __future__ import annotations

import argparse
import sys

from scratchgpt.errors import ConfigError, ScratchGPTError


def read_prompt(args: argparse.Namespace) -> str | None:
    """The prompt text (None when none was given): ``--prompt``, or ``--prompt-file`` (``-``:
    standard input, as ``classify --file -`` reads it), read as every file a user names is
    (:func:`~scratchgpt.data.sources.read_text_file`: a byte-order mark that opens it is
    dropped, UTF-16 is refused naming the file, and so is a file that is missing or cannot be
    read, in the words fine-tuning data is refused in)."""
    from scratchgpt.data.sources import read_text_file

    if not args.prompt_file:
        return args.prompt
    return read_text_file(args.prompt_file, "prompt file")[0]  # (with universal newlines)


def prompt_source(prompt_file: str) -> str:
    """``--prompt-file`` as a message names it: ``prompt file FILE``, or ``standard input``."""
    return "standard input" if prompt_file == "-" else f"prompt file {prompt_file}"


def note_long_prompts(model, lengths: list[int]) -> None:
    """Say on stderr when a prompt is longer than the model's context: the model reads only its
    last context-length tokens (the whole prompt is still printed)."""
    from scratchgpt.generation.decode import context_length

    ctx = context_length(model)
    if ctx is not None and max(lengths) > ctx:
        which = "the prompt has" if len(lengths) == 1 else "the longest prompt has"
        print(f"note: {which} {max(lengths)} tokens, the model's context {ctx}: it reads the "
              f"last {ctx}", file=sys.stderr)


def refuse_greedy_filters(temperature: float | None, top_k: int | None,
                          top_p: float | None) -> None:
    """--temperature 0 takes the likeliest token: a --top-k or --top-p given with it would be
    ignored, so it is refused (--top-k 0 is "off", as its default)."""
    if temperature == 0 and (top_k or top_p is not None):
        raise ConfigError("--temperature 0 decodes greedily (the likeliest token each time) and "
                          "draws nothing: --top-k and --top-p do not apply to it")


def note_same_samples(temperature: float | None, num_samples: int) -> None:
    """Say on stderr when --num-samples asks for several greedy samples: --temperature 0 takes
    the likeliest token each time, so every sample of a prompt is the same text (not refused:
    a script may compare greedy with sampled runs of one command line)."""
    if temperature == 0 and num_samples > 1:
        print(f"note: --temperature 0 decodes greedily: the {num_samples} samples of a prompt "
              "are the same text (a temperature above 0 draws different ones)",
              file=sys.stderr)


def note_wide_top_k(model, top_k: int | None) -> None:
    """Say on stderr when --top-k is more than the model's vocabulary: it then keeps every
    token, as --top-k 0 does (clamped, as Hugging Face's top-k is; the same flag can serve
    models of any vocabulary, so it is not refused)."""
    from scratchgpt.generation.decode import vocab_size

    vocab = vocab_size(model)
    if top_k and vocab is not None and top_k > vocab:
        print(f"note: --top-k {top_k} is more than the model's vocabulary of {vocab} tokens: "
              "it keeps every token (as --top-k 0 does)", file=sys.stderr)


def unknown_characters(tokenizer, text: str) -> str | None:
    """What is wrong with ``text`` when the model's tokenizer cannot write all of it (a
    character vocabulary lacks some of its characters), found as ``serve`` finds it, or None:
    ``cannot be encoded: text has 1 character not in the vocabulary: 'é'; write the text in
    characters the model knows``."""
    from scratchgpt.data.prepare import encode_corpus

    try:
        encode_corpus(tokenizer, text, "error")
    except ScratchGPTError as e:
        return f"cannot be encoded: {e}; write the text in characters the model knows"
    return None
