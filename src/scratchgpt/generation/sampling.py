"""Turning logits into the next token: temperature, top-k, top-p (nucleus), greedy.

Each function is pure. ``logits_to_probs`` gives the exact distribution that ``sample`` draws
from, so speculative decoding can apply the same transform to draft and target.
"""

from __future__ import annotations

import torch
from torch import Tensor

# (SamplingConfig is plain data, in a module without torch; it is imported from here too)
from scratchgpt.generation.sampling_config import SamplingConfig


def top_k_mask(logits: Tensor, k: int) -> Tensor:
    """Set every logit below the k-th largest (per row) to -inf. logits: (..., V)."""
    if k <= 0 or k >= logits.size(-1):
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (..., 1)
    return logits.masked_fill(logits < kth, float("-inf"))


# How many of the most likely tokens top_p_mask ranks, in turn, before it ranks them all.
# A trained model's nucleus is usually far smaller than its vocabulary. One row of 50,257 on a
# CPU core: the top 256 take ~0.1 ms, the top 4,096 ~0.5 ms, a sort of all ~4 ms.
NUCLEUS_CANDIDATES = (256, 4096)


def top_p_mask(logits: Tensor, p: float) -> Tensor:
    """Keep the smallest set of most likely tokens whose probability mass reaches ``p``.

    A token is dropped when the mass of the tokens ranked strictly above it already reaches
    ``p``; the most likely token is always kept.

    Ranking the whole vocabulary (a sort of 50,257 logits: ~4 ms a token on a CPU) is needed
    only when the nucleus is that large: on a CPU the top 256, then 4,096
    (:data:`NUCLEUS_CANDIDATES`) are ranked first (``torch.topk``), and the whole vocabulary
    only when their mass falls short of ``p``; the kept set is the same either way. (On other
    devices the whole vocabulary is ranked at once: checking the mass would wait for the
    device at every token.)

    >>> logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    >>> torch.isfinite(top_p_mask(logits, 0.8)).tolist()
    [True, True, False, False]
    """
    if p >= 1.0:
        return logits
    probs = torch.softmax(logits.float(), dim=-1)  # (..., V)
    ranked, order, mass_with = _ranked_nucleus_candidates(probs, p)  # (..., k), most likely first
    mass_above = mass_with - ranked  # mass of the tokens ranked above each (0 for the first)
    # every token not ranked is dropped; the ranked ones by the mass above them. A p below
    # float32's smallest normal number would round to 0 in the comparison and drop the first
    # token too: any such p keeps the first alone, as the smallest normal number does.
    at_least = max(p, torch.finfo(probs.dtype).tiny)
    drop = torch.ones_like(probs, dtype=torch.bool).scatter(-1, order, mass_above >= at_least)
    return logits.masked_fill(drop, float("-inf"))


def _ranked_nucleus_candidates(probs: Tensor, p: float) -> tuple[Tensor, Tensor, Tensor]:
    """The most likely tokens, ranked (values, indices, running sum of the values), enough of
    them to hold every row's nucleus: the first of :data:`NUCLEUS_CANDIDATES` whose mass
    reaches ``p`` (on a CPU), else all."""
    for k in NUCLEUS_CANDIDATES if probs.device.type == "cpu" else ():
        if k >= probs.size(-1):
            break
        top, order = torch.topk(probs, k, dim=-1)
        mass_with = torch.cumsum(top, dim=-1)
        # the mass ranked above the first token left out reaches p: it and all after drop
        if bool((mass_with[..., -1] >= p).all()):
            return top, order, mass_with
    ranked, order = torch.sort(probs, dim=-1, descending=True)
    return ranked, order, torch.cumsum(ranked, dim=-1)


# Below this temperature logits are scaled in float64 (see logits_to_probs): |logit| / T stays
# inside float32 for any logit under ~3e8 above it.
TINY_TEMPERATURE = 1e-30


def logits_to_probs(logits: Tensor, cfg: SamplingConfig) -> Tensor:
    """The sampling distribution (..., V) in float32. Greedy gives a one-hot of the argmax."""
    logits = logits.float()
    if cfg.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.size(-1)).float()
    if cfg.temperature < TINY_TEMPERATURE:
        # logits / T would overflow float32 (inf - inf is NaN in the softmax), or T itself
        # round to 0 in it: shifted by their maximum in float64 first, they become 0 for the
        # most likely tokens and -inf for the rest, the same distribution, T's limit
        logits = logits.double()
        logits = ((logits - logits.amax(-1, keepdim=True)) / cfg.temperature).float()
    else:
        logits = logits / cfg.temperature
    if cfg.top_k:
        logits = top_k_mask(logits, cfg.top_k)
    if cfg.top_p is not None:
        logits = top_p_mask(logits, cfg.top_p)
    return torch.softmax(logits, dim=-1)


def sample(logits: Tensor, cfg: SamplingConfig,
           generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """Draw one token per row. logits: (B, V) -> (token (B,), probs (B, V))."""
    probs = logits_to_probs(logits, cfg)
    if cfg.greedy:
        return logits.argmax(-1), probs
    return draw(probs, generator), probs


def next_token(logits: Tensor, cfg: SamplingConfig,
               generator: torch.Generator | None = None) -> Tensor:
    """The token :func:`sample` draws, (B, V) -> (B,), without building a greedy one-hot."""
    if cfg.greedy:
        return logits.argmax(-1)
    return draw(logits_to_probs(logits, cfg), generator)


def draw(weights: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """One index per row with probability proportional to ``weights`` (..., V) >= 0 (they
    need not sum to 1) -> (...).

    Inverse-CDF sampling: one uniform number per row, located in the running sum of the
    weights. ``torch.multinomial`` draws one exponential number per vocabulary entry instead
    (V = 50257: ~1.2 ms a draw on a CPU, against ~0.1 ms here)."""
    cdf = weights.double().cumsum(-1)  # (..., V); float64 keeps the rounding far below 1/V
    total = cdf[..., -1:].contiguous()  # (..., 1)
    u = torch.rand(total.shape, dtype=torch.float64, generator=generator, device=cdf.device)
    idx = torch.searchsorted(cdf, u * total, right=True)  # first entry whose cdf exceeds u*total
    # u * total may round up to the total: then the last entry that has any weight
    return torch.minimum(idx, torch.searchsorted(cdf, total)).squeeze(-1)
