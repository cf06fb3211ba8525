"""Continuous batching: sequences join a running batch between decode steps and leave when done.

A :class:`ContinuousBatch` holds the rows being generated (one per sequence: a request asks
for ``n`` of them) and one shared cache. Every :meth:`~ContinuousBatch.step` feeds each row's
newest token in one forward call, samples each row's next token with its own request's
settings, and removes the rows that stop. :meth:`~ContinuousBatch.admit` brings a new request
in at any time:

1. its prompt is prefilled in a cache of its own (with the other prompts that arrived at the
   same time, left-padded to the longest), and its first token is sampled from that (``n``
   choices: the prompt's cache row is copied ``n`` times);
2. the new rows join the batch (``JoinableCache.append_rows``): the cache lays them out so that
   their next token goes into the same slot as everyone else's. For the GPT's KV cache that is
   left padding: a prompt of 5 tokens joining a batch at slot 9 gets 4 padding slots in front,
   which its attention never sees (``key_mask``), and its position ids start at 0 after them
   (``pos_offset``). A prompt longer than the batch's filled slots pads the *old* rows instead.

A row therefore computes what it would alone: same positions, same visible keys, same
sampling (each request keeps its own random generator; a request's rows draw in choice
order). Greedy output is the same token for token whether a request ran alone or in a busy
batch (up to float rounding in the batched products, far below the gaps between logits of a
trained model).

Slots are reclaimed two ways. When rows leave, the slots that are padding in every remaining
row are dropped (``trim``) once they are a quarter of the filled slots, or when the cache is
full. A row that has filled the model's whole context slides as ``generation.decode`` does:
its newest :func:`~scratchgpt.generation.decode.slide_keep` tokens are prefilled again, alone,
its next token is sampled from that, and it rejoins after the step, so its tokens are the same
as alone. Models without a context limit (bigram, recurrent) never slide; their caches
implement the same interface.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from scratchgpt.errors import GenerationError
from scratchgpt.generation.decode import PAD_ID, context_length, prefill, score, slide_keep
from scratchgpt.generation.sampling import SamplingConfig, next_token
from scratchgpt.generation.stopping import StopRule
from scratchgpt.models.cache import CachedLM, JoinableCache

TopLogprobs = list[tuple[int, float]]  # (token id, log-probability), most likely first


@dataclass
class TokenOut:
    """A choice's next token; ``finish`` ("stop" or "length") is set on its last one.
    ``logprob`` and ``top`` (the most likely alternatives) come under the model's own
    distribution (softmax of the logits, before temperature, top-k or top-p) when the request
    asked for them."""

    choice: int
    token: int
    logprob: float | None = None
    top: TopLogprobs | None = None
    finish: str | None = None


@dataclass
class PromptScores:
    """Log-probabilities of the prompt's tokens (the first has none) and the alternatives."""

    logprobs: list[float | None]
    top: list[TopLogprobs | None]


@dataclass
class Ended:
    """A choice ended without a new token (its request ran out of time, or asked for none)."""

    choice: int
    finish: str


@dataclass
class Failed:
    """The request could not run; ``status`` is the HTTP status that says why."""

    status: int
    message: str


Event = TokenOut | PromptScores | Ended | Failed


def _ignore(events: list[Event]) -> None:
    pass


@dataclass(eq=False)
class Job:
    """One prompt to continue ``n`` times, and where its events go.

    ``top_logprobs`` None: no log-probabilities; k >= 0: each token's and its k most likely
    alternatives. ``prompt_logprobs`` also scores the prompt (the ``echo`` of completions).
    ``deadline`` is a ``time.monotonic()`` time after which the job ends ("length").
    ``sink`` receives the job's events, in order, a list at a time."""

    prompt: list[int]
    rule: StopRule
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(temperature=0))
    n: int = 1
    top_logprobs: int | None = None
    prompt_logprobs: bool = False
    generator: torch.Generator | None = None
    deadline: float = math.inf
    sink: Callable[[list[Event]], None] = _ignore
    created: float = field(default_factory=time.monotonic)
    cancelled: bool = False  # set by any thread; the engine drops the job at its next step
    first_token_at: float | None = None

    def __post_init__(self) -> None:
        if not self.prompt:
            raise GenerationError("a prompt needs at least one token")
        if self.n < 1:
            raise GenerationError(f"n must be >= 1, got {self.n}")


class Deliveries(dict[Job, list[Event]]):
    """Events per job, gathered during one engine iteration (jobs in first-event order)."""

    def add(self, job: Job, events: Sequence[Event]) -> None:
        self.setdefault(job, []).extend(events)


@dataclass(eq=False)
class Row:
    """One sequence being generated: choice ``choice`` of ``job``. ``tokens`` are its new
    tokens; the last one has not been fed to the model yet."""

    job: Job
    choice: int
    tokens: list[int] = field(default_factory=list)


def finish_reason(rule: StopRule, tokens: Sequence[int]) -> str | None:
    """"stop" (end-of-text or a stop string), "length" (max tokens), or None: goes on."""
    if rule.ends(tokens):
        return "stop"
    return "length" if len(tokens) >= rule.max_new_tokens else None


def token_logprobs(logits: Tensor, tokens: Tensor, k: int) -> tuple[list[float], list[TopLogprobs]]:
    """Log-probabilities of ``tokens`` (n,) under ``logits`` (n, V), and each row's ``k`` most
    likely tokens with theirs."""
    logp = torch.log_softmax(logits.float(), dim=-1)  # (n, V)
    chosen = logp.gather(-1, tokens[:, None])[:, 0].tolist()  # (n,)
    top_v, top_i = logp.topk(min(k, logp.size(-1)), dim=-1)  # (n, k) each
    top = [list(zip(i, v, strict=True)) for i, v in zip(top_i.tolist(), top_v.tolist(),
                                                         strict=True)]
    return chosen, top


def prompt_scores(logits: Tensor, ids: Sequence[int], k: int) -> PromptScores:
    """Scores of a prompt's tokens from the logits at every prompt position (T, V)."""
    if len(ids) < 2:
        return PromptScores([None], [None])
    chosen, top = token_logprobs(logits[:-1], torch.tensor(ids[1:]), k)
    return PromptScores([None, *chosen], [None, *top])


class ContinuousBatch:
    """The running rows of every admitted job and their shared cache (see the module doc).
    Not thread-safe: one thread (the engine's) calls it."""

    def __init__(self, model: CachedLM):
        self.model = model
        self.context = context_length(model)
        self.rows: list[Row] = []
        self.aside = 0  # rows a step's slide took out of ``rows`` until they rejoin
        self.cache = self._empty()

    def _empty(self) -> JoinableCache:
        cache = self.model.new_cache(0, self.context)
        if not isinstance(cache, JoinableCache):
            raise GenerationError(f"{type(cache).__name__} cannot batch continuously (it lacks "
                                  "the JoinableCache methods)")
        return cache

    @property
    def size(self) -> int:
        """Rows running, those a step's slide holds out of the batch included (/health and
        /metrics read this from other threads, in the middle of a step)."""
        return len(self.rows) + self.aside

    def jobs(self) -> set[Job]:
        return {r.job for r in self.rows}

    # ---- joining

    def check(self, job: Job) -> None:
        """Raise GenerationError if ``job`` cannot run on this model."""
        if self.context is not None and len(job.prompt) > self.context:
            raise GenerationError(f"prompt of {len(job.prompt)} tokens exceeds the context of "
                                  f"{self.context}")

    def admit(self, jobs: Sequence[Job], out: Deliveries) -> None:
        """Prefill the prompts of ``jobs`` together in a cache of their own (left-padded to
        the longest, as ``generation.decode.prefill_rows`` does), sample each choice's first
        token (reported in ``out``) and let the choices that go on join the batch. A job's
        ``n`` choices share its prompt: its cache row is copied ``n`` times."""
        for job in jobs:
            self.check(job)
        width = max(len(j.prompt) for j in jobs)
        pads = [width - len(j.prompt) for j in jobs]
        cache = self.model.new_cache(len(jobs), width)
        cache.left_pad(torch.tensor(pads))
        idx = torch.tensor([[PAD_ID] * p + j.prompt for j, p in zip(jobs, pads, strict=True)])
        logits = score(self.model, cache, idx)  # (J, width, V)
        for j, job in enumerate(jobs):
            if job.prompt_logprobs:
                out.add(job, [prompt_scores(logits[j, pads[j]:], job.prompt,
                                            job.top_logprobs or 0)])
        going = self._score_only(jobs, out)
        if not going:
            return
        last = logits[:, -1]  # (J, V)
        copies = [j for j in going for _ in range(jobs[j].n)]
        if copies != list(range(len(jobs))):
            cache.select_rows(torch.tensor(copies))
            last = last[copies]  # (rows, V)
        rows = [Row(jobs[j], c) for j in going for c in range(jobs[j].n)]
        self._join(self._sample_new(rows, cache, last, out))

    @staticmethod
    def _score_only(jobs: Sequence[Job], out: Deliveries) -> list[int]:
        """End every choice of the jobs that ask for no new token (``max_tokens`` 0: a
        prompt echoed to be scored) without one ("length"); returns the others' indices."""
        for job in jobs:
            if job.rule.max_new_tokens == 0:
                out.add(job, [Ended(c, "length") for c in range(job.n)])
        return [j for j, job in enumerate(jobs) if job.rule.max_new_tokens > 0]

    def _sample_new(self, rows: list[Row], cache: JoinableCache, logits: Tensor,
                    out: Deliveries) -> tuple[list[Row], JoinableCache]:
        """Sample the next token of rows outside the batch (their cache alone); returns the
        rows that go on and their cache."""
        done = self._sample(rows, logits, out)
        keep = [i for i, d in enumerate(done) if not d]
        if keep and len(keep) < len(rows):
            cache.select_rows(torch.tensor(keep))
        return [rows[i] for i in keep], cache

    def _join(self, new: tuple[list[Row], JoinableCache]) -> None:
        rows, cache = new
        if rows:
            self.cache.append_rows(cache)
            self.rows += rows

    # ---- stepping

    def step(self) -> Deliveries:
        """One decode step for every row: each gets one new token (rows whose window is full
        get theirs from a re-prefill instead). Rows that finish leave."""
        out = Deliveries()
        slid = self._slide(out)
        if self.rows:
            tokens = torch.tensor([r.tokens[-1] for r in self.rows])  # (B,)
            logits = prefill(self.model, self.cache, tokens[:, None])  # (B, V)
            done = self._sample(self.rows, logits, out)
            self._remove([i for i, d in enumerate(done) if d])
        for new in slid:
            self._join(new)
        self.aside = 0
        return out

    def _slide(self, out: Deliveries) -> list[tuple[list[Row], JoinableCache]]:
        """Rows that have filled the context: out of the batch, their newest ``slide_keep``
        tokens prefilled again (all of them in one call: every window is ``slide_keep`` long,
        and rows that start together reach the end together), the next token sampled.
        Returns them, to rejoin after this step."""
        if self.context is None or self.cache.pos < self.context:
            return []
        pads = self.cache.pad_counts().tolist()
        full = [i for i, p in enumerate(pads) if self.cache.pos - p >= self.context]
        rows = [self.rows[i] for i in full]
        self.aside = len(rows)  # still running: out only for their re-prefill
        self._remove(full)
        if not full:  # every row has padding in front: dropping it makes room
            self._compact()
        if not rows:
            return []
        keep = slide_keep(self.context)
        windows = torch.tensor([(r.job.prompt + r.tokens)[-keep:] for r in rows])  # (R, keep)
        cache = self.model.new_cache(len(rows), keep)
        return [self._sample_new(rows, cache, prefill(self.model, cache, windows), out)]

    def _sample(self, rows: list[Row], logits: Tensor, out: Deliveries) -> list[bool]:
        """Sample each row's next token from ``logits`` (len(rows), V) with its job's
        settings, append it, report it; returns which rows are done."""
        done = [False] * len(rows)
        groups: dict[Job, list[int]] = {}
        for i, r in enumerate(rows):
            groups.setdefault(r.job, []).append(i)
        argmax = None  # every greedy row's token, from one call
        for job, idx in groups.items():
            idx.sort(key=lambda i: rows[i].choice)  # a job's rows draw in choice order
            if job.sampling.greedy:
                argmax = logits.argmax(-1).tolist() if argmax is None else argmax
                tokens = [argmax[i] for i in idx]
            else:
                tokens = next_token(logits[idx], job.sampling, job.generator).tolist()
            scores = (None, None)
            if job.top_logprobs is not None:
                scores = token_logprobs(logits[idx], torch.tensor(tokens), job.top_logprobs)
            out.add(job, self._record([rows[i] for i in idx], tokens, scores, done, idx))
        return done

    @staticmethod
    def _record(rows: list[Row], tokens: list[int], scores: tuple, done: list[bool],
                idx: list[int]) -> list[TokenOut]:
        """Append each row's new token; mark in ``done`` the rows it ends."""
        chosen, top = scores
        events = []
        for j, (row, t) in enumerate(zip(rows, tokens, strict=True)):
            row.tokens.append(t)
            finish = finish_reason(row.job.rule, row.tokens)
            done[idx[j]] = finish is not None
            events.append(TokenOut(row.choice, t, None if chosen is None else chosen[j],
                                   None if top is None else top[j], finish))
        return events

    # ---- leaving

    def drop(self, jobs: set[Job]) -> list[Row]:
        """Remove the rows of ``jobs`` (cancelled, out of time); returns them."""
        idx = [i for i, r in enumerate(self.rows) if r.job in jobs]
        rows = [self.rows[i] for i in idx]
        self._remove(idx)
        return rows

    def _remove(self, idx: list[int]) -> None:
        if not idx:
            return
        gone = set(idx)
        keep = [i for i in range(len(self.rows)) if i not in gone]
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self.cache = self._empty()
            return
        self.cache.select_rows(torch.tensor(keep))
        self._compact()

    def _compact(self) -> None:
        """Drop the slots that are padding in every row once they are a quarter of the filled
        slots (attention reads them all every step) or the cache is full."""
        n = int(self.cache.pad_counts().min())
        full = self.context is not None and self.cache.pos >= self.context
        if n and (4 * n >= self.cache.pos or full):
            self.cache.trim(n)
