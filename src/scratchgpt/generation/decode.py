"""The one decode loop: prefill, decode one token, decode n tokens (gpt-fast style).

Every generation path is built from the functions here, which use nothing of a model but
``model(idx, cache=cache)`` and the :class:`~scratchgpt.models.cache.DecodeCache` interface:

    score(model, cache, tokens)                      feed tokens; logits at each of them
    prefill(model, cache, tokens)                    feed tokens; the next-token logits
    decode_one_token(model, cache, token, cfg)       feed one token per row; sample the next
    decode_n_tokens(model, cache, tokens, n, cfg)    n tokens and their distributions (drafts)
    decode(model, prompts, stop, cfg)                the loop: left-padded prefill, then one
                                                     token per step until the StopRule ends
                                                     each row; the window slides when full

``generate.stream`` and ``generate.generate_batch`` are thin views of :func:`decode`;
``beam.beam_search`` and ``speculative`` use the steps directly.

The context rule, in one place (:func:`window_start`): a model with a context limit (the GPT's
``block_size``) sees a sliding window. When the newest token no longer fits, the window jumps
to the newest ``slide_keep(context)`` tokens (3/4 of a context), which are prefilled again;
every token is then predicted from at least 3/4 of a context, and the re-prefill is paid once
every ``context // 4`` tokens. Until the first slide the result is exactly that of a full
recompute.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

from scratchgpt.errors import GenerationError
from scratchgpt.generation.sampling import SamplingConfig, draw, logits_to_probs, next_token
from scratchgpt.generation.stopping import StopRule
from scratchgpt.models.cache import CachedLM, DecodeCache
from scratchgpt.models.gpt import sliding_batch_slots

PAD_ID = 0  # token id written into left padding; masked out, so any valid id works


def context_length(model: CachedLM) -> int | None:
    """The longest sequence the model can attend over (None = unlimited: bigram, recurrent)."""
    from scratchgpt.models.gpt import GPTConfig

    cfg = getattr(model, "config", None)
    return cfg.block_size if isinstance(cfg, GPTConfig) else None


def prompt_rows(prompt: Tensor) -> list[list[int]]:
    """The token ids of a prompt tensor (B, T >= 1), one list a row; anything else (one row
    of shape (T,), a list, float ids) is a GenerationError that says what a prompt is."""
    if not isinstance(prompt, Tensor) or prompt.dim() != 2:
        got = f"shape {tuple(prompt.shape)}" if isinstance(prompt, Tensor) else \
            type(prompt).__name__
        raise GenerationError(f"the prompt is a (batch, length) tensor of token ids, such as "
                              f"torch.tensor([ids]); got {got}")
    if prompt.dtype.is_floating_point or prompt.dtype.is_complex or prompt.dtype == torch.bool:
        raise GenerationError(f"the prompt's token ids are integers, got a {prompt.dtype} "
                              "tensor")
    if prompt.size(1) == 0:
        raise GenerationError("the prompt must contain at least one token")
    return prompt.tolist()


def vocab_size(model: CachedLM) -> int | None:
    """How many token ids the model scores (its logits' width), where its config says."""
    return getattr(getattr(model, "config", None), "vocab_size", None)


def check_ids(model: CachedLM, rows: Sequence[Sequence[int]]) -> None:
    """Every id of ``rows`` is one of the model's (an id beyond its vocabulary failed inside
    torch's embedding)."""
    vocab = vocab_size(model)
    if vocab is None:
        return
    bad = next((t for r in rows for t in r if not 0 <= t < vocab), None)
    if bad is not None:
        raise GenerationError(f"the prompt holds token id {bad}, outside the model's "
                              f"vocabulary of {vocab} ids (0..{vocab - 1})")


def slide_keep(context: int) -> int:
    """How many of the newest tokens a full window keeps when it slides: 3/4 of the context."""
    return context - context // 4


def window_start(start: int, length: int, context: int | None) -> int:
    """Where the window begins when a model must read ``seq[start:length]``: ``start`` while
    that fits the context, else slid to keep the newest :func:`slide_keep` tokens."""
    if context is None or length - start <= context:
        return start
    return length - slide_keep(context)


def score(model: CachedLM, cache: DecodeCache, tokens: Tensor) -> Tensor:
    """Feed ``tokens`` (B, T) after what the cache holds; returns the logits at every one of
    these positions (B, T, V): speculative decoding scores its drafts this way."""
    return model(tokens, cache=cache)


def prefill(model: CachedLM, cache: DecodeCache, tokens: Tensor) -> Tensor:
    """Feed ``tokens`` (B, T) after what the cache holds; returns the next-token logits (B, V)
    (the output head runs on the last position only)."""
    return model(tokens, cache=cache, last_only=True)[:, -1]


def prefill_rows(model: CachedLM, cache: DecodeCache, rows: Sequence[Sequence[int]]) -> Tensor:
    """Empty the cache and prefill ``rows`` (token lists of any lengths), left-padded to the
    longest; returns each row's next-token logits (B, V)."""
    width = max(len(r) for r in rows)
    idx = torch.tensor([[PAD_ID] * (width - len(r)) + list(r) for r in rows])  # (B, width)
    cache.rollback(0)
    cache.left_pad(torch.tensor([width - len(r) for r in rows]))  # (B,)
    return prefill(model, cache, idx)


def decode_one_token(model: CachedLM, cache: DecodeCache, token: Tensor, cfg: SamplingConfig,
                     generator: torch.Generator | None = None) -> Tensor:
    """Feed each row's newest token (B,); sample and return the next one (B,)."""
    return next_token(prefill(model, cache, token[:, None]), cfg, generator)


def decode_n_tokens(model: CachedLM, cache: DecodeCache, tokens: Tensor, n: int,
                    cfg: SamplingConfig, generator: torch.Generator | None = None
                    ) -> tuple[Tensor, Tensor | None]:
    """Feed ``tokens`` (B, T >= 1), then sample ``n`` tokens one by one, feeding each but the
    last. Returns them (B, n) and the distribution each was drawn from (B, n, V) float32, or
    None when greedy (a one-hot says no more than the token)."""
    logits = prefill(model, cache, tokens)  # (B, V)
    out, dists = [], []
    for i in range(n):
        if cfg.greedy:
            token = logits.argmax(-1)  # (B,)
        else:
            probs = logits_to_probs(logits, cfg)  # (B, V)
            token = draw(probs, generator)  # (B,)
            dists.append(probs)
        out.append(token)
        if i < n - 1:
            logits = prefill(model, cache, token[:, None])
    return torch.stack(out, 1), (torch.stack(dists, 1) if dists else None)


@torch.inference_mode()
def decode(model: CachedLM, prompts: Sequence[Sequence[int]], stop: int | StopRule,
           cfg: SamplingConfig, generator: torch.Generator | None = None
           ) -> Iterator[tuple[list[int], Tensor]]:
    """Generate for several prompts at once; yields, each step, ``(rows, tokens)``: the
    indices of the prompts still running and their new tokens (len(rows),).

    The prompts are left-padded to the longest (the cache hides the padding and starts each
    row's positions at 0), so one forward call per step serves every row and row ``b``
    computes what it would alone. A row leaves the batch (and the cache) once ``stop`` says
    so, after yielding the token it stopped on. Each row's window slides (see the module doc)
    when it would alone, at its own length, not the padded batch's: past the context too, row
    ``b`` reads the tokens it would alone (a row that slides is prefilled again from its own
    window and written over its row of the cache; the cache holds a quarter of a context
    more slots than the context, so that the padding this leaves is dropped every many
    steps, not at each). A prompt longer than the context keeps its last ``context`` tokens.
    """
    stop = StopRule.of(stop)
    if not isinstance(cfg, SamplingConfig):  # (None failed at the first step, 'no .greedy')
        raise GenerationError(f"cfg is a SamplingConfig (SamplingConfig(temperature=0.8) or "
                              f"SamplingConfig(temperature=0) for greedy), got "
                              f"{type(cfg).__name__}")
    if any(len(p) == 0 for p in prompts):
        raise GenerationError("every prompt must contain at least one token")
    check_ids(model, prompts)
    if not prompts or stop.max_new_tokens < 1:
        return
    ctx = context_length(model)
    rows_tokens = [list(p[-ctx:] if ctx else p) for p in prompts]
    needed = max(len(p) for p in rows_tokens) + stop.max_new_tokens - 1  # the last is not fed
    cache = model.new_cache(len(prompts), min(needed, ctx) if ctx else None)
    if ctx and needed > ctx and len(prompts) > 1 and hasattr(cache, "reserve"):
        cache.reserve(min(needed, sliding_batch_slots(ctx)))  # room for the padding of slid rows
    rows = list(range(len(prompts)))  # original index of each row still in the batch
    out: list[list[int]] = [[] for _ in prompts]
    starts = [0] * len(prompts)  # where each row's window begins in its prompt + new tokens
    tokens = next_token(prefill_rows(model, cache, rows_tokens), cfg, generator)  # (B,)
    while True:
        yield rows, tokens
        running = []  # positions in the batch of the rows that go on
        for i, (b, t) in enumerate(zip(rows, tokens.tolist(), strict=True)):
            out[b].append(t)
            if not stop.done(out[b]):
                running.append(i)
        if not running:
            return
        if len(running) < len(rows):  # finished rows leave the batch: later steps are cheaper
            keep = torch.tensor(running)
            rows = [rows[i] for i in running]
            cache.select_rows(keep)
            tokens = tokens[keep]
        # every row's newest token goes into slot cache.pos; a row whose own window is full
        # slides, as it would alone, and is prefilled again from its window
        seqs = [rows_tokens[b] + out[b] for b in rows]
        slid = slide_windows(starts, rows, seqs, ctx)
        if not slid and not window_start(0, cache.pos + 1, cache.max_len):
            tokens = decode_one_token(model, cache, tokens, cfg, generator)
            continue
        windows = [seq[starts[b]:] for b, seq in zip(rows, seqs, strict=True)]
        tokens = next_token(step_past_slides(model, cache, tokens, windows, slid), cfg,
                            generator)


def slide_windows(starts: list[int], rows: list[int], seqs: list[list[int]],
                  context: int | None) -> list[int]:
    """Move ``starts[b]``, where row ``b``'s window begins in its tokens (``seqs[i]`` for
    ``b = rows[i]``: prompt and new tokens, the newest not yet fed), as :func:`window_start`
    slides one sequence. Returns the positions ``i`` in the batch of the rows that slid."""
    slid = []
    for i, (b, seq) in enumerate(zip(rows, seqs, strict=True)):
        start = window_start(starts[b], len(seq), context)
        if start != starts[b]:
            slid.append(i)
        starts[b] = start
    return slid


def step_past_slides(model: CachedLM, cache: DecodeCache, tokens: Tensor,
                     windows: list[list[int]], slid: list[int]) -> Tensor:
    """One step of a batch where the rows at positions ``slid`` slid their windows, or the
    cache is full of padding; returns every row's next-token logits (B, V).

    Every row feeds its newest token ``tokens`` (B,) as every step does, the padding that
    fills the cache dropped first; the rows that slid are then prefilled again, apart from
    the others, from their ``windows`` (the newest token last), and put in place of their
    rows of the cache (``replace_rows``): one copy of their windows, none of the other rows.
    (Before the step a row that slid is made all padding, so that its token, whose logits
    are not used, reads nothing and fits the cache.) Where a cache cannot replace rows (the
    NumPy engine's), or all rows slid, every row is prefilled again."""
    if len(slid) == len(windows) or not hasattr(cache, "replace_rows"):
        return prefill_rows(model, cache, windows)
    moved = torch.tensor(slid, dtype=torch.long)
    width = max((len(windows[i]) for i in slid), default=1)  # the longest new window
    if slid:
        pads = cache.pad_counts().clone()
        pads[moved] = cache.pos
        cache.left_pad(pads)
    if window_start(0, cache.pos + 1, cache.max_len):  # (no row left is full: all are padded)
        cache.trim(min(int(cache.pad_counts().min()), cache.pos + 1 - width))
    logits = prefill(model, cache, tokens[:, None])
    if slid:
        fresh = model.new_cache(len(slid), width)
        logits[moved] = prefill_rows(model, fresh, [windows[i] for i in slid])
        cache.replace_rows(moved, fresh)
    return logits
