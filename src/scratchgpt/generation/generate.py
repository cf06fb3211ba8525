"""Autoregressive generation: prefill the prompt once, then one-token decode steps.

The model keeps its own memory of the past in a cache object (a KV cache for the GPT, the hidden
state for recurrent models), so each step feeds only the newest token.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import Tensor, nn

from scratchgpt.errors import GenerationError
from scratchgpt.generation.sampling import SamplingConfig, sample

PAD_ID = 0  # token id written into left padding; masked out, so any valid id works


def context_length(model: nn.Module) -> int | None:
    """The longest sequence the model can attend over (None = unlimited)."""
    from scratchgpt.models.gpt import GPT

    return model.config.block_size if isinstance(model, GPT) else None


@torch.inference_mode()
def stream(model: nn.Module, prompt: Tensor, max_new_tokens: int, cfg: SamplingConfig,
           generator: torch.Generator | None = None) -> Iterator[Tensor]:
    """Yield the next token for every row, (B,) int64, ``max_new_tokens`` times.

    prompt: (B, T) token ids, T >= 1. A prompt longer than the context keeps its last
    ``context`` tokens. Context overflow policy, a sliding window: when the cache is full
    (``context`` tokens), the last 3/4 of the context (``context - context // 4`` tokens) is
    prefilled again into the emptied cache and decoding continues, so every token sees at least
    3/4 of a full context and the cost of a re-prefill is paid once every ``context // 4``
    tokens. Until the first overflow the result is exactly that of a full recompute.
    """
    if prompt.dim() != 2 or prompt.size(1) == 0:
        raise GenerationError("the prompt must contain at least one token")
    ctx = context_length(model)
    B = prompt.size(0)
    if ctx is not None and prompt.size(1) > ctx:
        prompt = prompt[:, -ctx:]  # only the last full context can be seen
    cache = model.new_cache(B, ctx)
    logits = model(prompt, cache=cache)[:, -1]  # prefill -> (B, V)
    tokens = prompt
    for i in range(max_new_tokens):
        next_token, _ = sample(logits, cfg, generator)  # (B,)
        yield next_token
        if i == max_new_tokens - 1:
            break
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        if ctx is not None and cache.pos >= ctx:
            keep = ctx - ctx // 4
            cache.rollback(0)
            logits = model(tokens[:, -keep:], cache=cache)[:, -1]
        else:
            logits = model(next_token[:, None], cache=cache)[:, -1]  # decode step -> (B, V)


def generate(model: nn.Module, prompt: Tensor, max_new_tokens: int, cfg: SamplingConfig,
             generator: torch.Generator | None = None,
             on_token: Callable[[Tensor], bool | None] | None = None) -> Tensor:
    """Generate ``max_new_tokens`` for each row; returns (B, T + n) with the prompt.

    ``on_token(token (B,))`` is called after each step; returning True stops early.
    """
    out = [prompt]
    for token in stream(model, prompt, max_new_tokens, cfg, generator):
        out.append(token[:, None])
        if on_token is not None and on_token(token):
            break
    return torch.cat(out, dim=1)


@torch.inference_mode()
def generate_batch(model: nn.Module, prompts: list[list[int]], max_new_tokens: int,
                   cfg: SamplingConfig, generator: torch.Generator | None = None,
                   eos_id: int | None = None,
                   stop_check: Callable[[int, list[int]], bool] | None = None
                   ) -> list[list[int]]:
    """Generate for several prompts of different lengths at once; returns each one's new tokens.

    The prompts are left-padded to the longest, so every row's newest token sits in the same
    cache slot and one forward call per step serves the whole batch. The cache's ``key_mask``
    hides the padding and its ``pos_offset`` starts each row's position ids at 0, so row ``b``
    computes what it would alone (greedy output is the same, token for token).

    Row ``b`` stops after ``max_new_tokens``, after emitting ``eos_id`` (kept as its last token)
    or when ``stop_check(b, new_tokens_of_b)`` returns True. Finished rows leave the batch, so
    the steps after that are cheaper. Context overflow slides as in :func:`stream` (each row
    keeps its last 3/4 context of tokens); rows that share a batch slide at the same step, so
    the same-as-alone guarantee holds while the longest prompt plus ``max_new_tokens`` fits.
    """
    if any(len(p) == 0 for p in prompts):
        raise GenerationError("every prompt must contain at least one token")
    if not prompts or max_new_tokens < 1:
        return [[] for _ in prompts]
    ctx = context_length(model)
    if ctx is not None:
        prompts = [list(p[-ctx:]) for p in prompts]
    longest = max(len(p) for p in prompts)
    cache_len = longest + max_new_tokens - 1  # the last token is sampled, never fed
    cache = model.new_cache(len(prompts), min(cache_len, ctx) if ctx else cache_len)
    out: list[list[int]] = [[] for _ in prompts]
    alive = list(range(len(prompts)))  # original index of each row still in the batch

    def prefill(rows: list[list[int]]) -> Tensor:
        """Left-pad ``rows`` into an emptied cache; returns each row's next-token logits."""
        width = max(len(r) for r in rows)
        n_pad = torch.tensor([width - len(r) for r in rows])  # (B,)
        idx = torch.tensor([[PAD_ID] * (width - len(r)) + r for r in rows])  # (B, width)
        cache.rollback(0)
        cache.left_pad(n_pad)
        return model(idx, cache=cache)[:, -1]  # (B, V)

    logits = prefill(prompts)
    for step in range(max_new_tokens):
        tokens, _ = sample(logits, cfg, generator)  # (B,)
        finished = []
        for row, (b, t) in enumerate(zip(alive, tokens.tolist(), strict=True)):
            out[b].append(t)
            if t == eos_id or (stop_check is not None and stop_check(b, out[b])):
                finished.append(row)
        if len(finished) == len(alive) or step == max_new_tokens - 1:
            break
        if finished:  # drop finished rows from the batch (and the cache)
            keep = [r for r in range(len(alive)) if r not in finished]
            alive = [alive[r] for r in keep]
            cache.select_rows(torch.tensor(keep))
            tokens = tokens[keep]
        if cache.pos >= cache.max_len:  # context full: slide the window (see ``stream``)
            keep_len = cache.max_len - cache.max_len // 4
            logits = prefill([(prompts[b] + out[b])[-keep_len:] for b in alive])
        else:
            logits = model(tokens[:, None], cache=cache)[:, -1]  # decode step -> (B, V)
    return out


@torch.inference_mode()
def beam_search(model: nn.Module, prompt: Tensor, beam: int, max_new_tokens: int,
                length_penalty: float = 1.0, eos_id: int | None = None
                ) -> list[tuple[list[int], float]]:
    """Beam search from one prompt (1, T). Returns hypotheses (new tokens, score), best first.

    The score is the summed log-probability divided by ``len ** length_penalty`` (as in
    Hugging Face's ``generate``). A beam that emits ``eos_id`` is finished. Beam 1 is greedy.
    """
    if beam < 1:
        raise GenerationError(f"beam must be >= 1, got {beam}")
    if prompt.size(0) != 1:
        raise GenerationError("beam search takes a single prompt")
    ctx = context_length(model)
    if ctx is not None and prompt.size(1) + max_new_tokens > ctx:
        raise GenerationError(
            f"prompt + max_new_tokens ({prompt.size(1) + max_new_tokens}) exceeds "
                        f"the model's context of {ctx} tokens (beam search does not slide)")
    cache = model.new_cache(beam, ctx)
    logits = model(prompt.expand(beam, -1).contiguous(), cache=cache)[:, -1]  # (beam, V)
    scores = torch.zeros(beam)
    scores[1:] = float("-inf")  # all beams start identical: only the first one may expand
    seqs: list[list[int]] = [[] for _ in range(beam)]
    finished: list[tuple[list[int], float]] = []

    def normalized(score: float, length: int) -> float:
        return score / (max(length, 1) ** length_penalty)

    for step in range(max_new_tokens):
        logprobs = torch.log_softmax(logits.float(), dim=-1)  # (beam, V)
        V = logprobs.size(-1)
        total = (scores[:, None] + logprobs).view(-1)  # (beam * V,)
        cand_scores, cand = torch.topk(total, min(2 * beam, total.numel()))
        new_parents, new_tokens, new_scores = [], [], []
        for s, c in zip(cand_scores.tolist(), cand.tolist(), strict=True):
            parent, token = divmod(c, V)
            if s == float("-inf"):
                break
            if eos_id is not None and token == eos_id:
                finished.append((seqs[parent] + [token], normalized(s, step + 1)))
                continue
            new_parents.append(parent)
            new_tokens.append(token)
            new_scores.append(s)
            if len(new_parents) == beam:
                break
        if len(finished) >= beam or not new_parents or step == max_new_tokens - 1:
            seqs = [seqs[p] + [t] for p, t in zip(new_parents, new_tokens, strict=True)]
            scores = torch.tensor(new_scores)
            break
        while len(new_parents) < beam:  # keep the batch shape; dead beams never win
            new_parents.append(new_parents[0])
            new_tokens.append(new_tokens[0])
            new_scores.append(float("-inf"))
        parents = torch.tensor(new_parents)
        cache_reorder(cache, parents)
        seqs = [seqs[p] + [t] for p, t in zip(new_parents, new_tokens, strict=True)]
        scores = torch.tensor(new_scores)
        logits = model(torch.tensor(new_tokens)[:, None], cache=cache)[:, -1]
    alive = [(s, normalized(sc, len(s))) for s, sc in zip(seqs, scores.tolist(), strict=False)
             if sc != float("-inf")]
    return sorted(finished + alive, key=lambda h: h[1], reverse=True)


def cache_reorder(cache, parents: Tensor) -> None:
    """Make row i of the cache a copy of row ``parents[i]`` (beam search bookkeeping)."""
    if hasattr(cache, "reorder"):
        cache.reorder(parents)
    elif hasattr(cache, "k"):
        cache.k = cache.k[:, parents]
        cache.v = cache.v[:, parents]
