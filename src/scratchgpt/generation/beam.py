"""Beam search: keep the ``beam`` most likely continuations, one cache row each.

Built from the decode steps (:func:`~scratchgpt.generation.decode.prefill`, one feed per step)
and the cache's ``select_rows`` (its ``reorder_beams`` where it has one: the GPT's, in place):
after each step, row ``i`` of the cache becomes a copy of the beam it extends. A
:class:`~scratchgpt.generation.stopping.StopRule` finishes a hypothesis (end-of-text, a stop
string) or, at ``max_new_tokens``, ends the search::

    hyps = beam_search(model, prompt, 4, StopRule(50, eos_id=tok.eot_id))
    best_tokens, best_score = hyps[0]

A search stopped part-way (Ctrl-C) keeps its hypotheses so far where the caller can read them:
``beam_search(..., out=so_far)`` puts them in the list ``so_far`` after every step, the ended
ones first.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from scratchgpt.errors import GenerationError
from scratchgpt.generation.decode import (
    check_ids,
    context_length,
    prefill,
    prefill_rows,
    prompt_rows,
    window_start,
)
from scratchgpt.generation.stopping import StopRule
from scratchgpt.models.cache import CachedLM
from scratchgpt.models.seq2seq import search_settled

Hypothesis = tuple[list[int], float]  # new tokens, score


class _Beams:
    """The live beams of a search: new tokens and summed log-probability of each."""

    def __init__(self, beam: int, length_penalty: float, stop: StopRule):
        self.beam, self.length_penalty, self.stop = beam, length_penalty, stop
        self.seqs: list[list[int]] = [[] for _ in range(beam)]
        self.scores = [0.0] + [float("-inf")] * (beam - 1)  # all start equal: expand one
        self.finished: list[Hypothesis] = []

    def normalized(self, score: float, length: int) -> float:
        return score / (max(length, 1) ** self.length_penalty)

    def extend(self, logits: Tensor) -> tuple[list[int], list[int]]:
        """Score every (beam, token) extension; keep the best ``beam`` that go on, move those
        that end to ``finished``. Returns (parent row of each kept beam, its new token)."""
        logprobs = torch.log_softmax(logits.float(), dim=-1)  # (beam, V)
        V = logprobs.size(-1)
        total = (torch.tensor(self.scores)[:, None] + logprobs).view(-1)  # (beam * V,)
        cand_scores, cand = torch.topk(total, min(2 * self.beam, total.numel()))
        parents, tokens, seqs, scores = [], [], [], []
        for rank, (s, c) in enumerate(zip(cand_scores.tolist(), cand.tolist(), strict=True)):
            parent, token = divmod(c, V)
            if s == float("-inf"):
                break
            seq = self.seqs[parent] + [token]
            if self.stop.ends(seq):
                # an ending ranked below the best ``beam`` would not have been kept as a beam
                # either: counting it would fill ``finished`` with weak texts and end the
                # search early (Hugging Face's rule too)
                if rank < self.beam:
                    self.finished.append((seq, self.normalized(s, len(seq))))
                continue
            parents.append(parent)
            tokens.append(token)
            seqs.append(seq)
            scores.append(s)
            if len(parents) == self.beam:
                break
        self.seqs, self.scores = seqs, scores
        return parents, tokens

    def settled(self) -> bool:
        """The search is over (:func:`~scratchgpt.models.seq2seq.search_settled`), its live
        beams as :meth:`extend` left them."""
        length = len(self.seqs[0]) if self.seqs else 0
        return search_settled([score for _, score in self.finished], self.beam,
                              max(self.scores, default=float("-inf")), length,
                              self.length_penalty)

    def pad(self, parents: list[int], tokens: list[int]) -> None:
        """Keep the batch shape: repeat the first beam as dead beams (score -inf) that never
        win."""
        while len(parents) < self.beam:
            parents.append(parents[0])
            tokens.append(tokens[0])
            self.seqs.append(self.seqs[0])
            self.scores.append(float("-inf"))

    def so_far(self) -> list[Hypothesis]:
        """What a search stopped now has: its ended hypotheses, best first (by the score the
        search ranks by), then its live beams, cut short, best first; none before the first
        step. An ended one comes before every live beam: a live beam is not a text."""
        live = [(s, self.normalized(sc, len(s))) for s, sc in zip(self.seqs, self.scores,
                                                                    strict=True)
                if sc != float("-inf")]
        return [*sorted(self.finished, key=lambda h: h[1], reverse=True),
                *sorted(live, key=lambda h: h[1], reverse=True)]

    def best(self, out_of_tokens: bool) -> list[Hypothesis]:
        """Every hypothesis, best first: the finished ones, and the live ones when the search
        ran ``out_of_tokens`` or fewer than ``beam`` finished (a search that stops early has
        cut them short: they are not texts)."""
        cut_short = len(self.finished) >= self.beam and not out_of_tokens
        alive = [(s, self.normalized(sc, len(s))) for s, sc in zip(self.seqs, self.scores,
                                                                     strict=True)
                 if sc != float("-inf") and not cut_short]
        return sorted(self.finished + alive, key=lambda h: h[1], reverse=True)


LENGTH_PENALTY_LIMIT = 20.0  # |penalty|: a usual one is 0.6 to 2


def check_length_penalty(length_penalty: float, name: str = "length_penalty") -> None:
    """A GenerationError unless ``length_penalty`` (``name`` in the message) is a finite
    number of at most ``LENGTH_PENALTY_LIMIT`` either way: NaN would rank no hypothesis above
    another, and ``length ** penalty`` of a huge one is past the largest float or rounds to 0
    (the search failed dividing by it). Every beam search checks it: this one and
    seq2seq's."""
    if not math.isfinite(length_penalty):
        raise GenerationError(f"{name} must be a finite number, got {length_penalty}")
    if abs(length_penalty) > LENGTH_PENALTY_LIMIT:
        limit = f"{LENGTH_PENALTY_LIMIT:g}"
        raise GenerationError(f"{name} must be from -{limit} to {limit} (a usual one is 0.6 to "
                              f"2: a score is the log-probability / length ** penalty), got "
                              f"{length_penalty:g}")


@torch.inference_mode()
def beam_search(model: CachedLM, prompt: Tensor, beam: int, stop: int | StopRule,
                length_penalty: float = 1.0,
                out: list[Hypothesis] | None = None) -> list[Hypothesis]:
    """Beam search from one prompt (1, T). Returns hypotheses (new tokens, score), best first.

    The score is the summed log-probability divided by ``len ** length_penalty`` (as in
    Hugging Face's ``generate``). A beam whose newest token ends it under ``stop`` (the
    end-of-text token, a completed stop string: kept in its tokens) is finished; the search
    ends once ``beam`` hypotheses are finished and no live beam, scored as it stands, beats
    the worst of the best ``beam`` of them (Hugging Face's rule, which seq2seq's search
    shares: :func:`~scratchgpt.models.seq2seq.search_settled`; then only finished ones are
    returned), or after ``stop.max_new_tokens`` (then the live beams compete too). An
    ending counts only among the best ``beam`` extensions of a step. The first ``beam``
    hypotheses are those of Hugging Face's ``generate(num_beams=beam)`` (tested) while the
    prompt and the new tokens fit the context; past it the window slides as sampling's does
    (:func:`~scratchgpt.generation.decode.window_start`; a prompt longer than the context
    keeps its last ``context`` tokens). Beam 1 is greedy, sliding included. No new tokens
    (``stop`` 0) is one hypothesis, the empty continuation, of log-probability 0.

    ``out``: a list that holds, after every step, the hypotheses so far (the ended ones, best
    first, then the live beams, best first: ``out[0]`` is the best ended one, else the best
    live beam), so that a caller stopped by Ctrl-C keeps them.
    """
    stop = StopRule.of(stop)
    if isinstance(beam, bool) or not isinstance(beam, int) or beam < 1:
        raise GenerationError(f"beam must be a whole number >= 1, got {beam!r}")
    check_length_penalty(length_penalty)
    rows = prompt_rows(prompt)
    if len(rows) != 1:
        raise GenerationError("beam search takes a single prompt")
    check_ids(model, rows)
    n = stop.max_new_tokens
    if n == 0:
        return [([], 0.0)]
    ctx = context_length(model)
    prompt_tokens = rows[0][-ctx:] if ctx else rows[0]
    needed = len(prompt_tokens) + n - 1  # the model reads every new token but the last
    cache = model.new_cache(beam, min(needed, ctx) if ctx else None)
    logits = prefill(model, cache, torch.tensor([prompt_tokens] * beam))  # (beam, V)
    beams = _Beams(beam, length_penalty, stop)
    # in place, only the rows whose beam changes, where the cache can (the GPT's)
    reorder = getattr(cache, "reorder_beams", cache.select_rows)
    for step in range(n):
        parents, tokens = beams.extend(logits)
        if out is not None:
            out[:] = beams.so_far()
        if beams.settled() or not parents or step == n - 1:
            break
        beams.pad(parents, tokens)
        # the newest tokens go into slot cache.pos: past the window, it slides (decode's rule)
        start = window_start(0, cache.pos + 1, cache.max_len)
        if start:
            keep = cache.pos + 1 - start
            logits = prefill_rows(model, cache, [(prompt_tokens + seq)[-keep:]
                                                 for seq in beams.seqs])  # (beam, V)
        else:
            reorder(torch.tensor(parents))  # row i continues beam parents[i]
            logits = prefill(model, cache, torch.tensor(tokens)[:, None])  # (beam, V)
    return beams.best(out_of_tokens=step == n - 1)
