"""Speculative sampling: exactness (greedy and in distribution), cache rollback, errors."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch

from scratchgpt.errors import ScratchGPTError
from scratchgpt.generation.drafters import NgramDrafter
from scratchgpt.generation.generate import generate
from scratchgpt.generation.policy import AutoK, PhaseTimer
from scratchgpt.generation.sampling import SamplingConfig, logits_to_probs
from scratchgpt.generation.speculative import (
    SpeculativeDecoder,
    accept_or_resample,
    check_pair,
    speculative_generate,
)
from scratchgpt.generation.stopping import StopRule
from scratchgpt.models.gpt import GPT, GPTConfig
from scratchgpt.tokenizers.char import CharTokenizer


def tiny_gpt(seed: int, vocab: int = 8, n_layer: int = 1, n_embd: int = 16, block: int = 32,
             std: float = 0.5) -> GPT:
    """A random GPT whose next-token distributions are far from uniform (weights std ``std``),
    so that different seeds give clearly different models."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=vocab, block_size=block, n_layer=n_layer, n_head=2,
                          n_embd=n_embd))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, std)
    return model.eval()


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny models run far faster on one thread (no spin-waiting between small ops)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def pair() -> tuple[GPT, GPT]:
    return tiny_gpt(1, n_layer=2), tiny_gpt(2)


PROMPT = torch.tensor([[3, 1, 4]])
GREEDY = SamplingConfig(temperature=0)


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_greedy_equals_target_greedy_token_for_token(pair, k):
    target, draft = pair
    greedy = SamplingConfig(temperature=0)
    n = 70  # past the context of 32: the window slides as in generate.stream
    ref = generate(target, PROMPT, n, greedy)
    out, stats = speculative_generate(target, draft, PROMPT, n, k, greedy)
    assert out.tolist() == ref.tolist()
    assert stats.emitted == n and sum(stats.accepted) < sum(stats.drafted)  # drafts do differ


def test_identical_draft_accepts_everything(pair):
    target, _ = pair
    for cfg in (SamplingConfig(temperature=0), SamplingConfig(temperature=1.0)):
        gen = torch.Generator().manual_seed(0)
        _, stats = speculative_generate(target, copy.deepcopy(target), PROMPT, 25, 4, cfg, gen)
        assert stats.accepted == stats.drafted  # p == q: min(1, q/p) = 1 for every proposal
        assert stats.rounds == 5 and stats.acceptance_rate == 1.0


def test_stop_rule_and_stats(pair):
    target, draft = pair
    free, _ = speculative_generate(target, draft, PROMPT, 50, 4, SamplingConfig(0.8),
                                   torch.Generator().manual_seed(1))
    eos = free[0, 3 + 6].item()
    out, stats = speculative_generate(target, draft, PROMPT, StopRule(50, eos_id=eos),
                                      4, SamplingConfig(0.8), torch.Generator().manual_seed(1))
    new = out[0, 3:].tolist()
    assert new == free[0, 3:3 + len(new)].tolist() and new[-1] == eos and eos not in new[:-1]
    assert stats.emitted >= len(new) and stats.rounds == len(stats.drafted)
    assert all(0 <= a <= d <= 4 for a, d in zip(stats.accepted, stats.drafted, strict=True))


def test_seeded_runs_are_reproducible(pair):
    target, draft = pair
    cfg = SamplingConfig(temperature=0.9, top_k=5)
    a, _ = speculative_generate(target, draft, PROMPT, 30, 3, cfg, torch.Generator().manual_seed(7))
    b, _ = speculative_generate(target, draft, PROMPT, 30, 3, cfg, torch.Generator().manual_seed(7))
    assert torch.equal(a, b)


@torch.no_grad()
def test_cache_rollback_matches_fresh_forward(pair):
    """After every round both caches hold exactly what a fresh prefill of the kept tokens gives,
    and continuing from them gives the logits of a full forward pass."""
    target, draft = pair
    dec = SpeculativeDecoder(target, draft, PROMPT, 4, SamplingConfig(1.0),
                             torch.Generator().manual_seed(3))
    rejected_rounds = 0
    while len(dec.seq) < 28:  # stay inside the context: windows start at 0
        dec.round(28 - len(dec.seq))
        rejected_rounds += dec.stats.accepted[-1] < dec.stats.drafted[-1]
        seq = torch.tensor([dec.seq])
        draft_cache = dec.drafter.cache
        for model, cache, kept in ((target, dec.cache, seq[:, :-1]),
                                   (draft, draft_cache, seq[:, :draft_cache.pos])):
            assert cache.pos == kept.size(1)
            fresh = model.new_cache(1)
            model(kept, cache=fresh)
            n = cache.pos
            assert torch.allclose(cache.k[:, :, :, :n], fresh.k[:, :, :, :n], atol=1e-5)
            assert torch.allclose(cache.v[:, :, :, :n], fresh.v[:, :, :, :n], atol=1e-5)
            # continue from the rolled-back cache, then undo
            logits = model(seq[:, n:], cache=cache)[0, -1]
            cache.rollback(n)
            assert torch.allclose(logits, model(seq)[0, -1], atol=1e-4)
    assert rejected_rounds > 0  # rollback was exercised


def test_mismatched_pair_is_refused(pair):
    target, _ = pair
    with pytest.raises(ScratchGPTError, match="vocabularies differ"):
        check_pair(target, tiny_gpt(3, vocab=9))
    with pytest.raises(ScratchGPTError, match="different tokenizers"):
        check_pair(target, target, CharTokenizer(list("abcdefgh")), CharTokenizer(list("abcdefgx")))
    check_pair(target, target, CharTokenizer(list("abcdefgh")), CharTokenizer(list("abcdefgh")))
    with pytest.raises(ScratchGPTError, match="vocabularies differ"):
        speculative_generate(target, tiny_gpt(3, vocab=9), PROMPT, 5, 2, SamplingConfig())
    with pytest.raises(ScratchGPTError, match="single prompt"):
        speculative_generate(target, target, PROMPT.expand(2, -1), 5, 2, SamplingConfig())
    with pytest.raises(ScratchGPTError, match=">= 1"):
        speculative_generate(target, target, PROMPT, 5, 0, SamplingConfig())


def test_one_hot_rule_is_accept_while_argmax_agrees():
    """The general rule on one-hot p and q gives exactly the greedy special case."""
    V = 6
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        k = int(torch.randint(1, 5, (1,), generator=gen))
        drafts = torch.randint(0, 3, (k,), generator=gen).tolist()
        target_choice = torch.randint(0, 3, (k + 1,), generator=gen)
        p = torch.nn.functional.one_hot(torch.tensor(drafts), V).float()
        q = torch.nn.functional.one_hot(target_choice, V).float()
        general = accept_or_resample(p, q, drafts, SamplingConfig(1.0), gen)
        assert general == accept_or_resample(p, q, drafts, SamplingConfig(0.0))


# ---- the output distribution equals the target's, exactly ----

def test_single_step_rule_emits_q():
    """K = 1, hand-made p and q: the first emitted token is distributed as q (10000 draws,
    chi-square at alpha = 1e-3, fixed seed). Mass where p > q must be moved by the residual."""
    p = torch.tensor([0.5, 0.3, 0.1, 0.1, 0.0])
    q = torch.tensor([[0.1, 0.2, 0.3, 0.15, 0.25], [0.2, 0.2, 0.2, 0.2, 0.2]])
    gen = torch.Generator().manual_seed(99)
    n, counts = 10000, {}
    for _ in range(n):
        d = int(torch.multinomial(p, 1, generator=gen))
        accepted, extra = accept_or_resample(p[None], q, [d], SamplingConfig(1.0), gen)
        first = (d,) if accepted else (extra,)
        counts[first] = counts.get(first, 0) + 1
    expected = {(v,): q[0, v].item() for v in range(5)}
    assert chi_square_p_value(counts, expected, n) > 1e-3
    assert chi_square_p_value(counts, {(v,): p[v].item() for v in range(5)}, n) < 1e-9


@torch.no_grad()
def exact_target_distribution(model: GPT, prompt: torch.Tensor, n: int,
                              cfg: SamplingConfig) -> dict[tuple[int, ...], float]:
    """P(x_1 .. x_n | prompt) under the target's sampling distribution, by enumeration."""
    V = model.config.vocab_size
    probs: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(n):
        prefixes = list(probs)
        batch = torch.cat([prompt.expand(len(prefixes), -1),
                           torch.tensor(prefixes, dtype=torch.long).view(len(prefixes), -1)], 1)
        nxt = logits_to_probs(model(batch)[:, -1], cfg)  # (prefixes, V)
        probs = {(*pre, v): probs[pre] * nxt[i, v].item()
                 for i, pre in enumerate(prefixes) for v in range(V)}
    return probs


def chi_square_p_value(counts: dict, expected_probs: dict, n: int) -> float:
    """Pearson's chi-square goodness-of-fit p-value; cells expecting < 5 are pooled into one."""
    stat, df, pool_obs, pool_exp = 0.0, -1, 0.0, 0.0
    for cell, prob in expected_probs.items():
        e, o = prob * n, counts.get(cell, 0)
        if e >= 5:
            stat, df = stat + (o - e) ** 2 / e, df + 1
        else:
            pool_obs, pool_exp = pool_obs + o, pool_exp + e
    if pool_exp == 0 and pool_obs > 0:
        return 0.0  # an impossible outcome was observed
    if pool_exp > 0:
        stat, df = stat + (pool_obs - pool_exp) ** 2 / pool_exp, df + 1
    # chi2 survival function = regularized upper incomplete gamma Q(df/2, stat/2)
    return torch.special.gammaincc(torch.tensor(df / 2), torch.tensor(stat / 2)).item()


# Not fewer, to save time: a sampler that redraws from q after a rejection (the residual
# max(0, q - p) forgotten) gets p = 1.8e-8 at temperature 1 from these 2000 runs, but 0.003
# (0.02 at temperature 0.7) from 1000, which a test of 1000 runs would let pass.
N_RUNS = 2000  # the draft's own distribution still gets p = 0.0 (float32), far below 1e-9
ALPHA = 1e-3  # per test; each test makes 2 checks at ALPHA / 2 (Bonferroni)


def sample_counts(target, make_draft, prompt, k, cfg, runs: int = N_RUNS):
    """Counts of the first two tokens (joint) and the third of ``runs`` 3-token samples."""
    gen = torch.Generator().manual_seed(12345)
    first_two: dict[tuple[int, ...], int] = {}
    third: dict[tuple[int, ...], int] = {}
    P = prompt.size(1)
    for _ in range(runs):
        out, _ = speculative_generate(target, make_draft(), prompt, 3, k(), cfg, gen)
        x = tuple(out[0, P:].tolist())
        first_two[x[:2]] = first_two.get(x[:2], 0) + 1
        third[x[2:]] = third.get(x[2:], 0) + 1
    return first_two, third


def assert_distributed_as_target(target, prompt, cfg, first_two, third):
    exact = exact_target_distribution(target, prompt, 3, cfg)
    exact_two: dict[tuple[int, ...], float] = {}
    exact_third: dict[tuple[int, ...], float] = {}
    for x, p in exact.items():
        exact_two[x[:2]] = exact_two.get(x[:2], 0.0) + p
        exact_third[x[2:]] = exact_third.get(x[2:], 0.0) + p
    assert chi_square_p_value(first_two, exact_two, N_RUNS) > ALPHA / 2
    assert chi_square_p_value(third, exact_third, N_RUNS) > ALPHA / 2


@pytest.mark.parametrize("cfg", [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7),
                                 SamplingConfig(temperature=1.0, top_p=0.9)],
                         ids=["t1", "t0.7", "top_p0.9"])
def test_distribution_matches_target_exactly(pair, cfg):
    """N_RUNS seeded runs of 3 tokens with K = 2 (so the first round's accepted drafts, residual
    draws and bonus token are all exercised). Chi-square goodness of fit against the target's
    exact distribution, computed by enumeration: the joint of tokens 1-2 (64 cells) and the
    marginal of token 3. A correct sampler fails this with probability <= ALPHA = 1e-3 for a
    random seed; the seed is fixed, so the test is deterministic. The same statistic rejects the
    draft's distribution (the test has power)."""
    target, draft = pair
    prompt = PROMPT[:, :2]
    first_two, third = sample_counts(target, lambda: draft, prompt, lambda: 2, cfg)
    assert_distributed_as_target(target, prompt, cfg, first_two, third)
    # power: the draft's own distribution is decisively rejected by the same statistic
    draft_two = exact_target_distribution(draft, prompt, 2, cfg)
    assert chi_square_p_value(first_two, draft_two, N_RUNS) < 1e-9


def test_prompt_lookup_drafts_keep_the_distribution(pair):
    """Point-mass drafts copied from the context (prompt 3 1 3: the lookup proposes 1 3, then
    whatever followed the latest match), same test as above."""
    target, _ = pair
    prompt = torch.tensor([[3, 1, 3]])
    cfg = SamplingConfig(temperature=1.0)
    first_two, third = sample_counts(target, NgramDrafter, prompt, lambda: 2, cfg)
    assert_distributed_as_target(target, prompt, cfg, first_two, third)
    # power: always accepting the lookup's proposal (1, 3) would be far off
    assert first_two.get((1, 3), 0) < 0.9 * N_RUNS


def test_auto_k_keeps_the_distribution(pair):
    """K chosen per round from the running acceptance (fixed costs: a deterministic test)."""
    target, draft = pair
    prompt = PROMPT[:, :2]
    cfg = SamplingConfig(temperature=1.0)
    policies = []

    def policy():
        policies.append(AutoK(costs=(0.1, 1.0, 0.05)))
        return policies[-1]

    first_two, third = sample_counts(target, lambda: draft, prompt, policy, cfg)
    assert_distributed_as_target(target, prompt, cfg, first_two, third)
    assert len({k for p in policies for k in p.history}) > 1  # K did change between rounds


@pytest.mark.parametrize("drafter", ["ngram", "auto", "auto-ngram"])
def test_greedy_equals_target_greedy_for_every_drafter(pair, drafter):
    target, draft = pair
    prompt = torch.tensor([[3, 1, 4, 1, 5, 3, 1, 4]])
    n = 70  # past the context of 32: the window slides as in the plain loop
    ref = generate(target, prompt, n, GREEDY)
    make = NgramDrafter() if drafter.endswith("ngram") else draft
    k = AutoK() if drafter.startswith("auto") else 3
    out, stats = speculative_generate(target, make, prompt, n, k, GREEDY)
    assert out.tolist() == ref.tolist() and stats.emitted == n
    assert sum(stats.drafted) > 0


def test_prompt_lookup_proposes_what_followed_the_latest_match():
    d = NgramDrafter(max_n=3)  # one drafter follows one growing sequence
    assert d.propose([5, 6, 7, 1, 5, 6], 3) == ([7, 1, 5], None)  # "5 6" seen at 0-1
    assert d.propose([5, 6, 7, 1, 5, 6, 9], 2) == ([], None)  # 9 never seen before
    assert d.propose([5, 6, 7, 1, 5, 6, 9, 1, 5], 4) == ([6, 9, 1, 5], None)  # latest "1 5"
    assert NgramDrafter().propose([1, 2, 1], 5) == ([2, 1], None)  # up to the end at most


def test_auto_k_follows_acceptance_and_costs():
    cheap_draft = (0.01, 1.0, 0.02)
    good = AutoK(costs=cheap_draft)
    for _ in range(30):
        k = good.choose()
        good.observe(k, k, None)  # everything accepted
    assert good.history[-1] == good.k_max
    bad = AutoK(costs=cheap_draft)
    for _ in range(40):
        k = bad.choose()
        bad.observe(k, 0, None)  # nothing accepted
    assert bad.history[-10:].count(0) >= 9  # plain decoding, with rare exploration
    assert 1 in bad.history[-bad.explore_every - 1:]
    pricey = AutoK(costs=(1.0, 1.0, 0.0))  # a draft step costs a target call
    pricey.accepted_w, pricey.rejected_w = 1.0, 1.0
    assert pricey.choose() == 0


def test_timer_hook_sees_the_phases(pair):
    target, draft = pair
    timer = PhaseTimer()
    dec = SpeculativeDecoder(target, draft, PROMPT, 3, GREEDY, timer=timer)
    list(dec.stream(20))
    assert timer.count["score"] == dec.stats.rounds and timer.count["prefill"] == 1
    assert timer.count["draft"] == sum(1 for d in dec.stats.drafted if d)
    assert all(timer.total[name] > 0 for name in ("draft", "score", "prefill"))


def test_recurrent_target_is_refused(pair):
    from scratchgpt.models import build_model, model_config

    lstm = build_model(model_config("lstm", vocab_size=8, hidden=8, n_layer=1)).eval()
    with pytest.raises(ScratchGPTError, match="rolls back"):
        speculative_generate(lstm, NgramDrafter(), PROMPT, 5, 2, GREEDY)


def test_single_step_rule_with_point_mass_emits_q():
    """The rule with p = None (a deterministic proposal d): the first token is distributed as
    q whatever d is."""
    q = torch.tensor([[0.1, 0.2, 0.3, 0.15, 0.25], [0.2, 0.2, 0.2, 0.2, 0.2]])
    gen = torch.Generator().manual_seed(5)
    n, counts = 10000, {}
    for _ in range(n):
        accepted, extra = accept_or_resample(None, q, [2], SamplingConfig(1.0), gen)
        first = (2,) if accepted else (extra,)
        counts[first] = counts.get(first, 0) + 1
    assert chi_square_p_value(counts, {(v,): q[0, v].item() for v in range(5)}, n) > 1e-3


def test_enumeration_helper_sums_to_one(pair):
    probs = exact_target_distribution(pair[0], PROMPT, 2, SamplingConfig(0.7, top_p=0.9))
    assert abs(sum(probs.values()) - 1) < 1e-5
    assert len(probs) == 64 and set(probs) == set(itertools.product(range(8), repeat=2))


def test_bpe_pairs_are_told_apart_by_their_merges_not_their_names(pair):
    """Two BPEs of one size learned from other texts differ (their to_dict() did not: it names
    the merges file, it does not hold it); GPT-2's vocabulary read from two Hugging Face
    directories (gpt2 and distilgpt2 from the hub, named after their snapshots) is the same."""
    from scratchgpt.tokenizers import BPETokenizer

    target, _ = pair
    mine, other = (BPETokenizer.train(t * 20, 260) for t in ("the cat sat. ", "a dog ran. "))
    with pytest.raises(ScratchGPTError, match="different tokenizers"):
        check_pair(target, target, mine, other)
    renamed = BPETokenizer(mine.merges, mine.special_tokens, name="607a30d7")
    check_pair(target, target, mine, renamed)
