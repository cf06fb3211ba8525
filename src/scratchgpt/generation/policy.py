"""How many draft tokens to speculate per round: a fixed K, or chosen as decoding goes.

With per-token acceptance probability ``a``, a round that drafts K tokens emits on average
``E(K) = 1 + a + ... + a^K = (1 - a^(K+1)) / (1 - a)`` tokens and costs ``K * t_draft +
t_score(K)`` (K draft steps, one target call scoring K + 1 positions). :class:`AutoK` estimates
``a`` from the running acceptance (recent rounds weigh more) and the two costs from the
measured phases of recent rounds, and picks the K (0 = plain decoding) with the most tokens
per second. K changes only between rounds and never looks at the current round's random draws,
so every round stays exact and so does the output (greedy: token for token).

:class:`PhaseTimer` is the clock it reads: the speculative decoder marks its phases
(``draft``, ``prefill``, ``score``) with ``timer.phase(name)``; benchmarks pass one to read the
same figures.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from scratchgpt.errors import GenerationError


class PhaseTimer:
    """Wall time of named phases: ``total``/``count`` per name, and the ``last`` duration."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self.count: dict[str, int] = defaultdict(int)
        self.last: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        dt = time.perf_counter() - t0
        self.total[name] += dt
        self.count[name] += 1
        self.last[name] = dt

    def mean(self, name: str) -> float:
        return self.total[name] / max(self.count[name], 1)


class KPolicy(Protocol):
    """Chooses the number of draft tokens of each round and learns from the round's result."""

    needs_timer: bool

    def choose(self) -> int:
        ...

    def observe(self, drafted: int, accepted: int, timer: PhaseTimer | None) -> None:
        ...


class FixedK:
    """Always K draft tokens (rounds near the end or a context slide may draft fewer)."""

    needs_timer = False

    def __init__(self, k: int):
        if k < 1:
            raise GenerationError(f"the number of speculated tokens must be >= 1, got {k}")
        self.k = k

    def choose(self) -> int:
        return self.k

    def observe(self, drafted: int, accepted: int, timer: PhaseTimer | None) -> None:
        pass


class AutoK:
    """K chosen each round to maximize expected tokens per second (see the module doc).

    ``costs=(t_draft, s0, s1)`` fixes the cost model (seconds per draft token, and a scoring
    call costing ``s0 + s1 * K``) instead of measuring it, which makes runs deterministic.
    ``history`` lists the K chosen for every round.
    """

    def __init__(self, k_max: int = 8, start: int = 4, decay: float = 0.9,
                 costs: tuple[float, float, float] | None = None, explore_every: int = 16):
        if not 1 <= start <= k_max:
            raise GenerationError(f"need 1 <= start <= k_max, got {start}, {k_max}")
        self.k_max, self.start, self.decay, self.explore_every = k_max, start, decay, explore_every
        self.needs_timer = costs is None
        self.fixed_costs = costs
        self.accepted_w = self.rejected_w = 1.0  # prior: acceptance 1/2
        self.draft_s: float | None = None  # per draft token
        self.score_s: dict[int, float] = {}  # K -> recent scoring time of K + 1 positions
        self.history: list[int] = []
        self._zero_run = 0  # rounds in a row that chose K = 0

    @property
    def acceptance(self) -> float:
        """Estimated probability that a draft token is accepted (recent rounds weigh more)."""
        return self.accepted_w / (self.accepted_w + self.rejected_w)

    def costs(self) -> tuple[float, float, float] | None:
        """(t_draft, s0, s1) of the cost model, or None before anything was measured."""
        if self.fixed_costs is not None:
            return self.fixed_costs
        if self.draft_s is None or not self.score_s:
            return None
        ks = sorted(self.score_s)
        if len(ks) == 1:  # one K seen: assume each extra position costs 5% of a call
            s = self.score_s[ks[0]] / (1 + 0.05 * ks[0])
            return self.draft_s, s, 0.05 * s
        mk = sum(ks) / len(ks)
        ms = sum(self.score_s[k] for k in ks) / len(ks)
        slope = (sum((k - mk) * (self.score_s[k] - ms) for k in ks)
                 / sum((k - mk) ** 2 for k in ks))
        slope = max(slope, 0.0)
        return self.draft_s, max(ms - slope * mk, 1e-9), slope

    def expected_rate(self, k: int, costs: tuple[float, float, float]) -> float:
        """Expected tokens per second of rounds drafting ``k`` tokens."""
        t_draft, s0, s1 = costs
        a = min(self.acceptance, 1 - 1e-9)
        return (1 - a ** (k + 1)) / (1 - a) / (k * t_draft + s0 + s1 * k)

    def choose(self) -> int:
        costs = self.costs()
        if costs is None:
            k = self.start
        else:
            k = max(range(self.k_max + 1), key=lambda j: self.expected_rate(j, costs))
            self._zero_run = self._zero_run + 1 if k == 0 else 0
            if k == 0 and self._zero_run % self.explore_every == 0:
                k = 1  # now and then, draft one token to keep the acceptance estimate fresh
        self.history.append(k)
        return k

    def observe(self, drafted: int, accepted: int, timer: PhaseTimer | None) -> None:
        if drafted:
            self.accepted_w = self.decay * self.accepted_w + accepted
            self.rejected_w = self.decay * self.rejected_w + (accepted < drafted)
        if timer is None or self.fixed_costs is not None:
            return
        if drafted and "draft" in timer.last:
            self.draft_s = self._ema(self.draft_s, timer.last["draft"] / drafted)
        self.score_s[drafted] = self._ema(self.score_s.get(drafted), timer.last["score"])

    def _ema(self, old: float | None, new: float) -> float:
        return new if old is None else self.decay * old + (1 - self.decay) * new
