"""Continuous batching: every request gets the tokens it would get alone, however busy the
batch it runs in, whenever it joins and leaves; the cache joins, trims and slides."""

from __future__ import annotations

import pytest
import torch

from scratchgpt.generation.generate import generate_batch
from scratchgpt.generation.sampling import SamplingConfig
from scratchgpt.generation.stopping import StopRule
from scratchgpt.serve.batch import ContinuousBatch, Deliveries, Ended, Job, PromptScores, TokenOut
from tests.generation.test_decode import MODELS

GREEDY = SamplingConfig(temperature=0)


def collect(out: Deliveries, got: dict) -> None:
    for job, events in out.items():
        for e in events:
            if isinstance(e, TokenOut):
                got.setdefault(job, {}).setdefault(e.choice, []).append(e.token)


class CountingBatch(ContinuousBatch):
    """Counts slides and joins that pad the rows already running."""

    def __init__(self, model):
        super().__init__(model)
        self.slides = self.old_rows_padded = 0
        self.slid_jobs: list[int] = []  # how many jobs each slide re-prefilled together

    def _slide(self, out):
        slid = super()._slide(out)
        self.slides += len(slid)
        self.slid_jobs += [len({r.job for r in rows}) for rows, _ in slid]
        return slid

    def _join(self, new):
        self.old_rows_padded += bool(self.rows) and new[1].pos > self.cache.pos
        super()._join(new)


def run(model, schedule: dict[int, list[Job]]) -> tuple[dict, CountingBatch]:
    """Admit ``schedule[step]``'s jobs before decode step ``step``; step until all are done.
    Returns each job's tokens per choice, and the batch."""
    batch, got, step, widest = CountingBatch(model), {}, 0, 0
    while batch.rows or any(s >= step for s in schedule):
        out = Deliveries()
        if schedule.get(step):
            batch.admit(schedule[step], out)
        collect(out, got)
        widest = max(widest, batch.size)
        if batch.rows:
            collect(batch.step(), got)
        step += 1
    assert batch.size == 0 and batch.cache.pos == 0 and batch.cache.batch_size == 0
    batch.widest = widest
    return got, batch


def alone(model, prompt, rule, cfg=GREEDY, n=1, seed=None):
    gen = None if seed is None else torch.Generator().manual_seed(seed)
    return generate_batch(model, [prompt] * n, rule, cfg, gen)


@pytest.mark.parametrize("name", list(MODELS))
def test_requests_joining_and_leaving_a_busy_batch_get_what_they_get_alone(name):
    """Jobs join mid-decode with prompts shorter and longer than the batch's filled slots
    (the old rows are then padded), leave early (end-of-text, few tokens), and n > 1; the GPT's
    long ones outgrow its context of 24 and slide while others run."""
    model = MODELS[name]
    specs = {  # step: [(prompt, max new tokens, end-of-text id, n)]
        0: [([1, 2, 3], 40, None, 1), ([5], 3, None, 1)],
        2: [(list(range(2, 16)), 12, None, 1)],  # longer than the batch: pads the old rows
        3: [([7, 8], 30, 4, 3)],  # three choices of one prompt; may end at token 4
        6: [([9, 9, 9, 9], 1, None, 1), ([11, 3], 25, None, 1)],
        9: [([16] * 20, 10, None, 2)],  # near the context: slides soon
    }
    schedule = {s: [Job(list(p), StopRule(m, eos_id=e), n=n) for p, m, e, n in jobs]
                for s, jobs in specs.items()}
    got, batch = run(model, schedule)
    assert batch.widest >= 5 and batch.old_rows_padded >= 1
    assert (batch.slides >= 2) == (name == "gpt")
    for jobs in schedule.values():
        for job in jobs:
            want = alone(model, job.prompt, job.rule, n=job.n)
            assert [got[job][c] for c in range(job.n)] == want


def test_requests_that_fill_the_context_together_slide_in_one_call():
    """Jobs admitted together reach the context together; their windows are prefilled again
    in one call, and each still gets its tokens alone."""
    model = MODELS["gpt"]
    jobs = [Job([1 + i, 2, 3], StopRule(40), n=1 + i % 2) for i in range(3)]
    got, batch = run(model, {0: jobs})
    assert batch.slides >= 1 and max(batch.slid_jobs) == 3
    for job in jobs:
        assert [got[job][c] for c in range(job.n)] == alone(model, job.prompt, job.rule, n=job.n)


def test_rows_out_for_their_slide_still_count_as_running(monkeypatch):
    """/health and /metrics read the batch's size from other threads, during a step: rows
    that a slide took out of the batch for their re-prefill read as gone (three rows
    streaming, a batch of 0)."""
    from scratchgpt.serve import batch as batch_module

    model = MODELS["gpt"]
    batch, seen = ContinuousBatch(model), []
    real = batch_module.prefill

    def watched(*args, **kwargs):
        seen.append(batch.size)  # (as the server's other threads may read it)
        return real(*args, **kwargs)

    monkeypatch.setattr(batch_module, "prefill", watched)
    batch.admit([Job([1, 2, 3], StopRule(40), n=3)], Deliveries())
    seen.clear()
    steps = 0
    while batch.size == 3 and steps < 60:
        batch.step()
        steps += 1
    assert steps == 39 and batch.size == 0  # 40 tokens, the first sampled at admission
    assert batch.context < 3 + 40  # so the rows slid (a step that slides them all calls
    assert len(seen) == steps  # prefill for their windows alone)
    assert set(seen) == {3}


def test_seeded_sampling_of_n_choices_equals_generate_batch_and_ignores_neighbours():
    model = MODELS["gpt"]
    cfg = SamplingConfig(temperature=1.0, top_k=8)
    rule = StopRule(30)

    def job(seed):
        return Job([3, 1, 4], rule, cfg, n=3, generator=torch.Generator().manual_seed(seed))

    quiet = job(7)
    got_quiet, _ = run(model, {0: [quiet]})
    busy = job(7)
    others = [Job([2, 2], StopRule(20), cfg, generator=torch.Generator().manual_seed(1))
              for _ in range(3)]
    got_busy, _ = run(model, {0: others[:2], 4: [busy], 6: others[2:]})
    want = alone(model, [3, 1, 4], rule, cfg, n=3, seed=7)
    assert [got_quiet[quiet][c] for c in range(3)] == want
    assert [got_busy[busy][c] for c in range(3)] == want
    assert len({tuple(t) for t in want}) > 1  # the choices differ


def test_logprobs_are_the_models_own_distribution():
    model = MODELS["gpt"]
    job = Job([1, 2, 3], StopRule(5), SamplingConfig(temperature=0.7), top_logprobs=3,
              prompt_logprobs=True, generator=torch.Generator().manual_seed(0))
    batch, out = ContinuousBatch(model), Deliveries()
    batch.admit([job], out)
    while batch.rows:
        for j, ev in batch.step().items():
            out.add(j, ev)
    scores, *tokens = out[job]
    assert isinstance(scores, PromptScores) and scores.logprobs[0] is None
    seq = job.prompt + [e.token for e in tokens]
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([seq]))[0].float(), -1)  # (T, V)
    for t in range(1, len(seq)):
        lp = scores.logprobs[t] if t < 3 else tokens[t - 3].logprob
        top = scores.top[t] if t < 3 else tokens[t - 3].top
        assert lp == pytest.approx(logp[t - 1, seq[t]].item(), abs=1e-5)
        assert [i for i, _ in top] == logp[t - 1].topk(3).indices.tolist()
    assert [e.finish for e in tokens] == [None] * 4 + ["length"]


@pytest.mark.parametrize("name", list(MODELS))
def test_a_job_of_no_new_tokens_is_scored_and_ends_beside_the_others(name):
    """max_tokens 0 (a prompt echoed to be scored): prefilled with the prompts that came with
    it, its choices end ("length") without a token, and theirs go on as alone."""
    model = MODELS[name]
    score = Job([4, 2, 9, 1], StopRule(0), n=2, top_logprobs=1, prompt_logprobs=True)
    others = [Job([1, 2, 3], StopRule(6), n=2), Job([5, 6, 7, 8, 9], StopRule(4))]
    out, batch = Deliveries(), ContinuousBatch(model)
    batch.admit([others[0], score, others[1]], out)
    scores, *ended = out[score]
    assert isinstance(scores, PromptScores) and len(scores.logprobs) == 4
    assert ended == [Ended(0, "length"), Ended(1, "length")]
    assert batch.size == 3 and score not in batch.jobs()
    got: dict = {}
    collect(out, got)
    while batch.rows:
        collect(batch.step(), got)
    assert score not in got
    for job in others:
        assert [got[job][c] for c in range(job.n)] == alone(model, job.prompt, job.rule,
                                                            n=job.n)


def test_dropping_a_job_frees_its_rows_and_the_others_go_on_unchanged():
    model = MODELS["gpt"]
    a, b = Job([1, 2, 3, 4, 5, 6], StopRule(15)), Job([7], StopRule(15), n=2)
    batch, got = ContinuousBatch(model), {}
    out = Deliveries()
    batch.admit([a], out)
    batch.admit([b], out)
    collect(out, got)
    for _ in range(3):
        collect(batch.step(), got)
    assert batch.size == 3
    batch.drop({a})
    assert batch.size == 2 and int(batch.cache.pad_counts().min()) == 0
    assert batch.cache.pos == 4  # b's 5 slots of padding were dropped with a
    while batch.rows:
        collect(batch.step(), got)
    assert [got[b][0], got[b][1]] == alone(model, [7], StopRule(15), n=2)
