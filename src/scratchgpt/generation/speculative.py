"""Speculative sampling (Chen et al. 2023, "Accelerating Large Language Model Decoding with
Speculative Sampling"): a small *draft* model proposes tokens, the large *target* model checks
them all in one forward pass, and a rejection rule keeps the output distributed exactly as if
the target had sampled every token itself.

One round, with ``n`` tokens so far and K draft tokens:

1. The draft decodes d_1 .. d_K autoregressively (its KV cache, one token per call), keeping
   each token's sampling distribution p_j (``logits_to_probs``, the same SamplingConfig).
2. The target runs ONE forward over the K+1 new positions (the last accepted token, then
   d_1 .. d_K) and gets q_1 .. q_{K+1}, q_j being its distribution for the j-th new token.
3. For j = 1..K: accept d_j with probability min(1, q_j(d_j) / p_j(d_j)). At the first
   rejection, emit a token drawn from normalize(max(0, q_j - p_j)) and end the round. If all K
   are accepted, emit a bonus token drawn from q_{K+1}. A round emits 1 .. K+1 tokens.
4. Both KV caches roll back (``cache.rollback``) past the rejected positions; nothing is
   recomputed.

Why it is exact: a token x is emitted at step j either as an accepted draft, with probability
p(x) min(1, q(x)/p(x)) = min(p(x), q(x)), or as the residual after a rejection, with probability
(1 - sum_y min(p(y), q(y))) * max(0, q(x) - p(x)) / sum_y max(0, q(y) - p(y)) = max(0, q(x) - p(x))
(the two sums are equal). Together: min(p, q) + max(0, q - p) = q(x).

Greedy (temperature 0): p and q are one-hot, so the rule becomes "accept while the draft's
argmax equals the target's; at the first disagreement emit the target's argmax". That is what
the code does for greedy, without drawing random numbers; the output is then token for token
the target's own greedy output.

Policies:

* Batches: refused (``GenerationError``); the caches advance all rows together, while speculative
  rounds accept a different number of tokens per row. Run prompts one at a time.
* Context limit: the target sees exactly the window that :func:`generate.stream` would give it
  (the prompt's last ``block_size`` tokens; when a token would need more than ``block_size``
  positions, the window slides to the last 3/4 of the context). Rounds are shortened so they
  never straddle a slide, so even long outputs equal the target-only ones in distribution (and
  token for token when greedy). The draft slides its own window the same way (its context may
  differ); which window the draft sees affects speed only, never the output distribution.
* Stop conditions: the caller stops a :func:`speculative_stream` (or returns True from
  ``on_token`` in :func:`speculative_generate`); tokens accepted beyond that are discarded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from scratchgpt.errors import GenerationError
from scratchgpt.generation.generate import context_length
from scratchgpt.generation.sampling import SamplingConfig, logits_to_probs


@dataclass
class SpeculativeStats:
    """What happened during a speculative run (filled in as it goes)."""

    k: int
    rounds: int = 0
    accepted: list[int] = field(default_factory=list)  # draft tokens accepted, per round
    drafted: list[int] = field(default_factory=list)  # draft tokens proposed, per round
    emitted: int = 0  # tokens produced (accepted drafts + residual/bonus tokens)
    draft_forwards: int = 0  # one-token draft decode calls (and its prefills)
    draft_time_s: float = 0.0
    target_forwards: int = 0  # scoring calls, one per round (prefills are counted apart)
    target_time_s: float = 0.0
    target_prefills: int = 0  # target prompt prefills and re-prefills after a context slide
    target_prefill_time_s: float = 0.0

    @property
    def mean_accepted(self) -> float:
        """Mean number of draft tokens accepted per round."""
        return sum(self.accepted) / max(len(self.accepted), 1)

    @property
    def tokens_per_round(self) -> float:
        """Mean tokens decoded per target scoring call (accepted + 1 per complete round)."""
        return self.emitted / max(self.rounds, 1)

    @property
    def acceptance_rate(self) -> float:
        """Tokens decoded per round / (K + 1), as in the paper's figures (1.0 = every draft
        token accepted plus the bonus token)."""
        return self.tokens_per_round / (self.k + 1)

    def to_dict(self) -> dict[str, Any]:
        return {"k": self.k, "rounds": self.rounds, "emitted": self.emitted,
                "mean_accepted": self.mean_accepted, "tokens_per_round": self.tokens_per_round,
                "acceptance_rate": self.acceptance_rate,
                "draft_forwards": self.draft_forwards, "draft_time_s": self.draft_time_s,
                "target_forwards": self.target_forwards, "target_time_s": self.target_time_s,
                "target_prefills": self.target_prefills,
                "target_prefill_time_s": self.target_prefill_time_s}


def check_pair(target: nn.Module, draft: nn.Module, target_tokenizer: Any = None,
               draft_tokenizer: Any = None) -> None:
    """Raise ``GenerationError`` unless draft and target share the vocabulary (and tokenizer)."""
    if (target_tokenizer is None) != (draft_tokenizer is None):
        raise GenerationError("give both tokenizers or neither")
    if target_tokenizer is not None and target_tokenizer.to_dict() != draft_tokenizer.to_dict():
        raise GenerationError("draft and target were trained with different tokenizers; "
                        "speculative sampling needs the same one (train both on the same "
                        "prepared dataset)")
    tv, dv = target.config.vocab_size, draft.config.vocab_size
    if tv != dv:
        raise GenerationError(f"draft and target vocabularies differ ({dv} vs {tv} tokens); "
                        "speculative sampling needs the same tokenizer")


def _draw(probs: Tensor, generator: torch.Generator | None) -> int:
    """One token from a distribution (V,)."""
    return int(torch.multinomial(probs, 1, generator=generator))


def accept_or_resample(p: Tensor | None, q: Tensor, draft_tokens: list[int], cfg: SamplingConfig,
                       generator: torch.Generator | None = None) -> tuple[int, int]:
    """The verification rule. p: (K, V) draft distributions (None when K = 0), q: (K+1, V)
    target distributions, ``draft_tokens``: the K proposals. Returns (number accepted a, the
    token emitted after them)."""
    k = len(draft_tokens)
    if cfg.greedy:  # one-hot p and q: accept while the argmaxes agree (see the module doc)
        target_choice = q.argmax(-1).tolist()
        for j, d in enumerate(draft_tokens):
            if d != target_choice[j]:
                return j, target_choice[j]
        return k, target_choice[k]
    if k:
        idx = torch.tensor(draft_tokens)
        rows = torch.arange(k)
        pd, qd = p[rows, idx], q[rows, idx]  # (K,) probability of each proposal
        u = torch.rand(k, generator=generator)
        accept = (u * pd < qd).tolist()  # u < q/p without dividing (p(d) > 0: d was drawn)
        for j in range(k):
            if not accept[j]:
                residual = (q[j] - p[j]).clamp_min(0)
                if residual.sum() <= 0:  # q == p up to rounding: rejection had ~0 probability
                    residual = q[j]
                return j, _draw(residual / residual.sum(), generator)
    return k, _draw(q[k], generator)


class SpeculativeDecoder:
    """Decoding state for one sequence: the tokens, both KV caches and their windows.

    ``seq`` holds the whole sequence (prompt + generated). The target cache holds
    ``seq[target_start : len(seq) - 1]`` (the newest token is fed with the next round's drafts);
    the draft cache holds ``seq[draft_start : draft_start + draft_cache.pos]``.
    """

    def __init__(self, target: nn.Module, draft: nn.Module, prompt: Tensor, k: int,
                 cfg: SamplingConfig, generator: torch.Generator | None = None):
        if k < 1:
            raise GenerationError(f"the number of speculated tokens must be >= 1, got {k}")
        if prompt.dim() != 2 or prompt.size(1) == 0:
            raise GenerationError("the prompt must contain at least one token")
        if prompt.size(0) != 1:
            raise GenerationError("speculative sampling takes a single prompt (batch size 1); "
                            "run several prompts one after another")
        check_pair(target, draft)
        self.target, self.draft, self.k, self.cfg, self.generator = target, draft, k, cfg, generator
        self.seq: list[int] = prompt[0].tolist()
        self.target_ctx = context_length(target)
        self.draft_ctx = context_length(draft)
        self.target_cache = target.new_cache(1, self.target_ctx)
        self.draft_cache = draft.new_cache(1, self.draft_ctx)
        self.target_start = max(0, len(self.seq) - (self.target_ctx or len(self.seq)))
        self.draft_start = max(0, len(self.seq) - (self.draft_ctx or len(self.seq)))
        self.stats = SpeculativeStats(k)

    def _forward(self, model: nn.Module, tokens: list[int], cache: Any) -> tuple[Tensor, float]:
        t0 = time.perf_counter()
        logits = model(torch.tensor([tokens], dtype=torch.long), cache=cache)[0]  # (T, V)
        return logits, time.perf_counter() - t0

    def _target_room(self, n: int) -> int:
        """How many drafts this round may have so the target window need not slide mid-round.

        Predicting the token at index m needs the window seq[target_start : m] to fit in the
        context; if even index n does not fit, slide first (the rule of ``generate.stream``).
        """
        if self.target_ctx is None:
            return self.k
        if n - self.target_start > self.target_ctx:
            self.target_start = n - (self.target_ctx - self.target_ctx // 4)
            self.target_cache.rollback(0)
        return self.target_ctx + self.target_start - n

    def _draft_room(self, n: int, k: int) -> int:
        """Slide the draft window if k proposals would not fit; returns the usable k."""
        if self.draft_ctx is None:
            return k
        if n + k - 1 - self.draft_start > self.draft_ctx:
            self.draft_start = n - (self.draft_ctx - self.draft_ctx // 4)
            self.draft_cache.rollback(0)
            k = min(k, self.draft_ctx + self.draft_start - n + 1)
        return k

    @torch.no_grad()
    def round(self, max_tokens: int) -> list[int]:
        """Run one round emitting at most ``max_tokens`` (>= 1) tokens; returns them."""
        seq, cfg, st = self.seq, self.cfg, self.stats
        n = len(seq)
        k = min(self.k, max_tokens - 1, self._target_room(n))
        k = self._draft_room(n, k) if k > 0 else 0

        # 1. Draft: catch up on the tokens it has not seen, then propose k tokens.
        drafts: list[int] = []
        p_rows: list[Tensor] = []
        if k > 0:
            feed = seq[self.draft_start + self.draft_cache.pos: n]
            for j in range(k):
                logits, dt = self._forward(self.draft, feed, self.draft_cache)
                st.draft_forwards += 1
                st.draft_time_s += dt
                p = logits_to_probs(logits[-1], cfg)  # (V,)
                d = int(p.argmax()) if cfg.greedy else _draw(p, self.generator)
                drafts.append(d)
                p_rows.append(p)
                feed = [d]
                if j == k - 1:
                    break  # the last proposal is fed next round, only if it is accepted
        p_all = torch.stack(p_rows) if p_rows else None

        # 2. Target: (re)prefill if needed, then score the newest token + k drafts at once.
        behind = seq[self.target_start + self.target_cache.pos: n - 1]
        if behind:
            _, dt = self._forward(self.target, behind, self.target_cache)
            st.target_prefills += 1
            st.target_prefill_time_s += dt
        logits, dt = self._forward(self.target, [seq[n - 1], *drafts], self.target_cache)
        st.target_forwards += 1
        st.target_time_s += dt
        q_all = logits_to_probs(logits, cfg)  # (k+1, V)

        # 3. Verify, then 4. roll both caches back to the accepted prefix.
        accepted, extra = accept_or_resample(p_all, q_all, drafts, cfg, self.generator)
        new = drafts[:accepted] + [extra]
        self.target_cache.rollback(n + accepted - self.target_start)
        keep = n + accepted - self.draft_start  # draft slots valid: up to the last accepted
        if k > 0 and self.draft_cache.pos > keep:
            self.draft_cache.rollback(keep)
        seq.extend(new)
        st.rounds += 1
        st.drafted.append(k)
        st.accepted.append(accepted)
        st.emitted += len(new)
        return new


def speculative_stream(target: nn.Module, draft: nn.Module, prompt: Tensor,
                       max_new_tokens: int, k: int, cfg: SamplingConfig,
                       generator: torch.Generator | None = None,
                       stats: SpeculativeStats | None = None) -> Iterator[Tensor]:
    """Yield ``max_new_tokens`` tokens, each as a (1,) tensor like :func:`generate.stream`,
    distributed as the target's own samples. ``stats``, if given, is updated in place."""
    dec = SpeculativeDecoder(target, draft, prompt, k, cfg, generator)
    if stats is not None:
        dec.stats = stats
        stats.k = k
    produced = 0
    while produced < max_new_tokens:
        for token in dec.round(max_new_tokens - produced):
            produced += 1
            yield torch.tensor([token])


def speculative_generate(target: nn.Module, draft: nn.Module, prompt: Tensor,
                         max_new_tokens: int, k: int, cfg: SamplingConfig,
                         generator: torch.Generator | None = None,
                         on_token: Callable[[Tensor], bool | None] | None = None
                         ) -> tuple[Tensor, SpeculativeStats]:
    """Like :func:`generate.generate` with speculative sampling: returns ((1, T + n), stats).

    ``on_token(token (1,))`` is called after each token; returning True stops early.
    """
    stats = SpeculativeStats(k)
    out = [prompt]
    for token in speculative_stream(target, draft, prompt, max_new_tokens, k, cfg, generator,
                                    stats):
        out.append(token[None, :])
        if on_token is not None and on_token(token):
            break
    return torch.cat(out, dim=1), stats
