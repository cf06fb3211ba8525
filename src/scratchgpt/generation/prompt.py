"""What a model is given when the user gives no prompt (unconditional generation).

A model trained on documents joined by an end-of-text token learned what text looks like after
that token, so starting from it samples a fresh document: GPT-2 and our GPT-2/BPE tokenizers
have ``<|endoftext|>``. Character models have no such token; their training text separates
passages with newlines, so they start from a newline (or a space, in a vocabulary without
newlines, such as ``char-prose``; else from token 0)::

    ids, text = start_of_text(tokenizer)   # GPT-2: ([50256], "")   char: ([0], "\\n")
"""

from __future__ import annotations

from typing import Any

from scratchgpt.errors import TokenizerError

DEFAULT_CHAR_STARTS = ("\n", " ")  # tried in order when the tokenizer has no end-of-text


def start_of_text(tokenizer: Any) -> tuple[list[int], str]:
    """The prompt of unconditional generation: its token ids, and the text to show for it
    (empty for an end-of-text token, which is not part of the generated text)."""
    eot = getattr(tokenizer, "eot_id", None)
    if eot is not None:
        return [eot], ""
    for text in DEFAULT_CHAR_STARTS:
        try:
            ids = tokenizer.encode(text)
        except TokenizerError:  # not in the vocabulary: try the next
            continue
        if len(ids) == 1:
            return ids, text
    return [0], tokenizer.decode([0])
