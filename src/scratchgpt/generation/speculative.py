"""Speculative sampling (Chen et al. 2023, "Accelerating Large Language Model Decoding with
Speculative Sampling"): a *drafter* proposes tokens, the large *target* model checks them all
in one forward pass, and a rejection rule keeps the output distributed exactly as if the target
had sampled every token itself.

One round, with ``n`` tokens so far and K draft tokens:

1. The drafter proposes d_1 .. d_K with the distributions p_j they were drawn from: a small
   model decoding with the same SamplingConfig (``decode_n_tokens``), or prompt lookup, which
   copies tokens from the context (a point mass: p_j(d_j) = 1). See :mod:`.drafters`.
2. The target runs ONE forward over the K+1 new positions (the last accepted token, then
   d_1 .. d_K) and gets q_1 .. q_{K+1}, q_j being its distribution for the j-th new token.
3. For j = 1..K: accept d_j with probability min(1, q_j(d_j) / p_j(d_j)). At the first
   rejection, emit a token drawn from normalize(max(0, q_j - p_j)) and end the round. If all K
   are accepted, emit a bonus token drawn from q_{K+1}. A round emits 1 .. K+1 tokens.
4. The target cache rolls back (``cache.rollback``) past the rejected positions, and the
   drafter is told which prefix is final; nothing is recomputed.

Why it is exact: a token x is emitted at step j either as an accepted draft, with probability
p(x) min(1, q(x)/p(x)) = min(p(x), q(x)), or as the residual after a rejection, with probability
(1 - sum_y min(p(y), q(y))) * max(0, q(x) - p(x)) / sum_y max(0, q(y) - p(y)) = max(0, q(x) - p(x))
(the two sums are equal). Together: min(p, q) + max(0, q - p) = q(x). Any p works, including a
point mass and including drafts that depend on the whole context; K may change between rounds
(:class:`.policy.AutoK`) since it never depends on the round's own random draws.

Greedy (temperature 0): p and q are one-hot, so the rule becomes "accept while the draft's
argmax equals the target's; at the first disagreement emit the target's argmax". That is what
the code does for greedy, without drawing random numbers; the output is then token for token
the target's own greedy output.

Policies:

* Batches: refused (``GenerationError``); the caches advance all rows together, while speculative
  rounds accept a different number of tokens per row. Run prompts one at a time.
* Context limit: the target sees exactly the window that the plain decode loop would give it
  (``decode.window_start``). Rounds are shortened so they never straddle a slide, so even long
  outputs equal the target-only ones in distribution (and token for token when greedy). A
  draft model slides its own window the same way (its context may differ); which window the
  draft sees affects speed only, never the output distribution.
* Stopping: the same :class:`~scratchgpt.generation.stopping.StopRule` as every other path;
  tokens accepted beyond the stop are discarded.
* Costs: the decoder does not time itself; it marks its phases on an optional
  :class:`.policy.PhaseTimer` (``draft``, ``prefill``, ``score``), which :class:`.policy.AutoK`
  and the benchmark read.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from scratchgpt.errors import GenerationError
from scratchgpt.generation.decode import (
    check_ids,
    context_length,
    prefill,
    prompt_rows,
    score,
    window_start,
)
from scratchgpt.generation.drafters import Drafter, ModelDrafter
from scratchgpt.generation.policy import FixedK, KPolicy, PhaseTimer
from scratchgpt.generation.sampling import SamplingConfig, draw, logits_to_probs
from scratchgpt.generation.stopping import StopRule
from scratchgpt.models.cache import CachedLM


@dataclass
class SpeculativeStats:
    """What happened during a speculative run (filled in as it goes)."""

    rounds: int = 0
    accepted: list[int] = field(default_factory=list)  # draft tokens accepted, per round
    drafted: list[int] = field(default_factory=list)  # draft tokens proposed, per round
    emitted: int = 0  # tokens produced (accepted drafts + residual/bonus tokens)

    @property
    def mean_accepted(self) -> float:
        """Mean number of draft tokens accepted per round."""
        return sum(self.accepted) / max(len(self.accepted), 1)

    @property
    def mean_drafted(self) -> float:
        """Mean number of draft tokens proposed per round (K, or less near the end, at a
        context slide, when a lookup finds nothing, or with AutoK)."""
        return sum(self.drafted) / max(len(self.drafted), 1)

    @property
    def tokens_per_round(self) -> float:
        """Mean tokens decoded per target scoring call (accepted + 1 per complete round)."""
        return self.emitted / max(self.rounds, 1)

    @property
    def acceptance_rate(self) -> float:
        """Tokens decoded / positions scored: with K drafts every round, tokens per round /
        (K + 1), as in the paper's figures (1.0 = every draft token accepted, plus the bonus
        token)."""
        return self.emitted / max(self.rounds + sum(self.drafted), 1)

    def to_dict(self) -> dict[str, Any]:
        return {"rounds": self.rounds, "emitted": self.emitted,
                "mean_drafted": self.mean_drafted, "mean_accepted": self.mean_accepted,
                "tokens_per_round": self.tokens_per_round,
                "acceptance_rate": self.acceptance_rate}


def check_pair(target: CachedLM, draft: CachedLM, target_tokenizer: Any = None,
               draft_tokenizer: Any = None) -> None:
    """Raise ``GenerationError`` unless draft and target share the vocabulary (and tokenizer)."""
    if (target_tokenizer is None) != (draft_tokenizer is None):
        raise GenerationError("give both tokenizers or neither")
    if target_tokenizer is not None and not target_tokenizer.same_as(draft_tokenizer):
        raise GenerationError("draft and target were trained with different tokenizers; "
                              "speculative sampling needs the same one (train both on the same "
                              "prepared dataset)")
    tv, dv = target.config.vocab_size, draft.config.vocab_size
    if tv != dv:
        raise GenerationError(f"draft and target vocabularies differ ({dv} vs {tv} tokens); "
                              "speculative sampling needs the same tokenizer")


def accept_or_resample(p: Tensor | None, q: Tensor, draft_tokens: list[int], cfg: SamplingConfig,
                       generator: torch.Generator | None = None) -> tuple[int, int]:
    """The verification rule. ``q`` (K+1, V): the target's distributions (for greedy, its
    logits will do); ``p`` (K, V): the drafter's, or None when the drafts are point masses
    (deterministic proposals, or K = 0); ``draft_tokens``: the K proposals. Returns (number
    accepted a, the token emitted after them)."""
    k = len(draft_tokens)
    if cfg.greedy:  # one-hot p and q: accept while the argmaxes agree (see the module doc)
        target_choice = q.argmax(-1).tolist()
        a = next((j for j, d in enumerate(draft_tokens) if d != target_choice[j]), k)
        return a, target_choice[a]
    if k:
        idx = torch.tensor(draft_tokens)[:, None]  # (K, 1)
        qd = q[:k].gather(1, idx)[:, 0]  # (K,) target probability of each proposal
        u = torch.rand(k, generator=generator)
        # accept iff u < q/p, without dividing (p(d) > 0: d was drawn from p)
        rejected = u >= qd if p is None else u * p.gather(1, idx)[:, 0] >= qd  # (K,)
        a = int(torch.cat([rejected, rejected.new_ones(1)]).int().argmax())  # first rejection
        if a < k:
            residual = (q[a] - p[a]).clamp_min(0) if p is not None else q[a].clone()
            if p is None:
                residual[draft_tokens[a]] = 0  # max(0, q - one_hot(d))
            if residual.sum() <= 0:  # q == p up to rounding: rejection had ~0 probability
                residual = q[a]
            return a, int(draw(residual, generator))  # draw normalizes
    return k, int(draw(q[k], generator))


class SpeculativeDecoder:
    """Decoding state for one sequence: the tokens, the target's cache and window, the drafter
    and the K policy.

    ``seq`` holds the whole sequence (prompt + generated). The target cache holds
    ``seq[start : len(seq) - 1]`` (the newest token is fed with the next round's drafts).
    ``draft`` is a small model (same vocabulary) or a :class:`.drafters.Drafter`; ``k`` a
    number or a :class:`.policy.KPolicy`. ``timer`` (optional) gets the phases of each round.
    """

    def __init__(self, target: CachedLM, draft: CachedLM | Drafter, prompt: Tensor,
                 k: int | KPolicy, cfg: SamplingConfig, generator: torch.Generator | None = None,
                 timer: PhaseTimer | None = None):
        rows = prompt_rows(prompt)
        if len(rows) != 1:
            raise GenerationError("speculative sampling takes a single prompt (batch size 1); "
                                  "run several prompts one after another")
        check_ids(target, rows)
        self.policy: KPolicy = FixedK(k) if isinstance(k, int) else k
        if not hasattr(draft, "propose"):  # a model: it drafts by sampling
            check_pair(target, draft)
            draft = ModelDrafter(draft, cfg, generator)
        self.target, self.drafter, self.cfg, self.generator = target, draft, cfg, generator
        self.timer = timer if timer is not None or not self.policy.needs_timer else PhaseTimer()
        self.seq: list[int] = rows[0]
        self.ctx = context_length(target)
        self.cache = target.new_cache(1, self.ctx)
        if not self.cache.rewinds:
            raise GenerationError("speculative sampling needs a target whose cache rolls back "
                                  "(a GPT or bigram, not a recurrent model)")
        self.start = max(0, len(self.seq) - (self.ctx or len(self.seq)))
        self.stats = SpeculativeStats()

    def _phase(self, name: str) -> AbstractContextManager:
        return self.timer.phase(name) if self.timer is not None else nullcontext()

    def _room(self, n: int) -> int:
        """Slide the target window if predicting token ``n`` needs it (the rule of the plain
        loop); returns how many drafts fit before the next slide."""
        if self.ctx is None:
            return n + 1  # no limit; any K fits
        start = window_start(self.start, n, self.ctx)
        if start != self.start:
            self.start = start
            self.cache.rollback(0)
        return self.ctx + self.start - n

    @torch.inference_mode()
    def round(self, max_tokens: int) -> list[int]:
        """Run one round emitting at most ``max_tokens`` (>= 1) tokens; returns them."""
        seq = self.seq
        n = len(seq)
        k = max(0, min(self.policy.choose(), max_tokens - 1, self._room(n)))
        drafts: list[int] = []
        p = None
        if k:
            with self._phase("draft"):
                drafts, p = self.drafter.propose(seq, k)
        behind = seq[self.start + self.cache.pos: n - 1]  # after the prompt or a slide
        if behind:
            with self._phase("prefill"):
                prefill(self.target, self.cache, torch.tensor([behind]))
        with self._phase("score"):
            logits = score(self.target, self.cache, torch.tensor([[seq[n - 1], *drafts]]))[0]
            q = logits if self.cfg.greedy else logits_to_probs(logits, self.cfg)  # (k+1, V)
            accepted, extra = accept_or_resample(p, q, drafts, self.cfg, self.generator)
            self.cache.rollback(n + accepted - self.start)
        self.drafter.keep(n + accepted)
        new = drafts[:accepted] + [extra]
        seq.extend(new)
        st = self.stats
        st.rounds += 1
        st.drafted.append(len(drafts))
        st.accepted.append(accepted)
        st.emitted += len(new)
        self.policy.observe(len(drafts), accepted, self.timer)
        return new

    def stream(self, stop: int | StopRule) -> Iterator[int]:
        """Yield new tokens, round after round, until ``stop`` ends the sequence (the token it
        stops on is yielded; the rest of that round is discarded)."""
        stop = StopRule.of(stop)
        new: list[int] = []
        while not stop.done(new):
            for token in self.round(stop.max_new_tokens - len(new)):
                new.append(token)
                yield token
                if stop.done(new):
                    return


def speculative_stream(target: CachedLM, draft: CachedLM | Drafter, prompt: Tensor,
                       stop: int | StopRule, k: int | KPolicy, cfg: SamplingConfig,
                       generator: torch.Generator | None = None) -> Iterator[Tensor]:
    """Yield tokens until ``stop``, each as a (1,) tensor like :func:`generate.stream`,
    distributed as the target's own samples."""
    for token in SpeculativeDecoder(target, draft, prompt, k, cfg, generator).stream(stop):
        yield torch.tensor([token])


def speculative_generate(target: CachedLM, draft: CachedLM | Drafter, prompt: Tensor,
                         stop: int | StopRule, k: int | KPolicy, cfg: SamplingConfig,
                         generator: torch.Generator | None = None
                         ) -> tuple[Tensor, SpeculativeStats]:
    """Like :func:`generate.generate` with speculative sampling: returns ((1, T + n), stats)."""
    dec = SpeculativeDecoder(target, draft, prompt, k, cfg, generator)
    new = list(dec.stream(stop))
    return torch.cat([prompt, torch.tensor([new], dtype=prompt.dtype)], dim=1), dec.stats
