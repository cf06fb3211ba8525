"""Autoregressive generation: prefill the prompt once, then one-token decode steps.

The model keeps its own memory of the past in a cache object (a KV cache for the GPT, the hidden
state for recurrent models), so each step feeds only the newest token. All three functions
here are views of the one loop, :func:`scratchgpt.generation.decode.decode`::

    for piece in stream_text(model, prompt, 100, SamplingConfig(0.8), decode=tok.decode):
        print(piece, end="")                                         # prompt (1, T)
    rule = StopRule(100, eos_id=tok.eot_id)
    outs = generate_batch(model, [ids_a, ids_b], rule, SamplingConfig(0))  # new tokens per row
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor

from scratchgpt.errors import GenerationError
from scratchgpt.generation.decode import decode, prompt_rows
from scratchgpt.generation.sampling import SamplingConfig
from scratchgpt.generation.stopping import StopRule, StreamText
from scratchgpt.models.cache import CachedLM


def stream(model: CachedLM, prompt: Tensor, stop: int | StopRule, cfg: SamplingConfig,
           generator: torch.Generator | None = None) -> Iterator[Tensor]:
    """Yield the next token of every row, (B,) int64, until ``stop`` (a number of new tokens
    or a :class:`StopRule`) ends them; the token a rule stops on is yielded.

    prompt: (B, T) token ids, T >= 1; all rows advance together, so a rule under which rows
    may stop at different steps (end-of-text, stop strings) needs B = 1 (use
    :func:`generate_batch` for a batch). Context overflow slides the window (see
    :mod:`scratchgpt.generation.decode`).
    """
    stop = StopRule.of(stop)
    rows = prompt_rows(prompt)
    if len(rows) > 1 and stop.per_row:
        raise GenerationError("rows that stop on their own (end-of-text, stop strings) "
                              "go through generate_batch")
    for _, tokens in decode(model, rows, stop, cfg, generator):
        yield tokens


def stream_text(model: CachedLM, prompt: Tensor, stop: int | StopRule, cfg: SamplingConfig,
                generator: torch.Generator | None = None, *,
                decode: Callable[[Sequence[int]], str] | None = None) -> Iterator[str]:
    """Yield the new text of one prompt (1, T) piece by piece as it is generated; the pieces
    join to ``decode`` of all the new tokens (without an end-of-text token, cut before a stop
    string: :meth:`StopRule.text`).

    Decoding token by token is wrong for byte-level BPE, where a token may hold part of a
    character's UTF-8 bytes: each piece here ends where the text is final, holding back a
    character whose bytes are still arriving and what could still become a stop string
    (:class:`~scratchgpt.generation.stopping.StreamText`, as ``scratchgpt sample`` and
    ``serve`` stream). ``decode`` (token ids -> text, ``tok.decode``) may be left out when
    ``stop`` is a rule that carries one.
    """
    rule = StopRule.of(stop)
    if decode is not None:
        rule = dataclasses.replace(rule, decode=decode)
    if rule.decode is None:
        raise GenerationError("stream_text needs a decode function (token ids -> text), "
                              "such as decode=tok.decode")
    if len(prompt_rows(prompt)) != 1:
        raise GenerationError("stream_text takes one prompt (1, T); several go through "
                              "generate_batch")
    text = StreamText(rule)
    for token in stream(model, prompt, rule, cfg, generator):
        piece = text.add(int(token[0]))[0]
        if piece:
            yield piece
    piece = text.finish()[0]
    if piece:
        yield piece


def generate(model: CachedLM, prompt: Tensor, stop: int | StopRule, cfg: SamplingConfig,
             generator: torch.Generator | None = None) -> Tensor:
    """:func:`stream` collected: returns (B, T + n) with the prompt."""
    return torch.cat([prompt, *(t[:, None] for t in stream(model, prompt, stop, cfg,
                                                             generator))], dim=1)


def generate_batch(model: CachedLM, prompts: Sequence[Sequence[int]], stop: int | StopRule,
                   cfg: SamplingConfig, generator: torch.Generator | None = None,
                   out: list[list[int]] | None = None) -> list[list[int]]:
    """Generate for several prompts of different lengths at once; returns each one's new tokens.

    One left-padded batch (see :func:`scratchgpt.generation.decode.decode`): row ``b`` computes
    what it would alone (greedy output is the same, token for token) and stops on its own when
    ``stop`` says so (the token it stopped on is kept as its last). Finished rows leave the
    batch, so the steps after that are cheaper. ``out``: empty lists, one a prompt, that the
    tokens are appended to as they come, so that a caller stopped by Ctrl-C keeps them.
    """
    if isinstance(prompts, Tensor):  # (B, T): rows of one length
        prompts = prompt_rows(prompts)
    out = [[] for _ in prompts] if out is None else out
    for rows, tokens in decode(model, prompts, stop, cfg, generator):
        for b, t in zip(rows, tokens.tolist(), strict=True):
            out[b].append(t)
    return out
