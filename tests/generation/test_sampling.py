import math
import subprocess
import sys

import pytest
import torch

from scratchgpt.errors import ScratchGPTError
from scratchgpt.generation.beam import beam_search
from scratchgpt.generation.generate import generate
from scratchgpt.generation.sampling import (
    SamplingConfig,
    logits_to_probs,
    sample,
    top_k_mask,
    top_p_mask,
)
from scratchgpt.models.gpt import GPT, GPTConfig


def test_top_k_keeps_exactly_k_largest():
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0]])
    kept = torch.isfinite(top_k_mask(logits, 2))
    assert kept.tolist() == [[False, True, False, True, False]]


def test_top_p_on_hand_made_distribution():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    assert torch.isfinite(top_p_mask(logits, 0.5)).tolist() == [[True, False, False, False]]
    assert torch.isfinite(top_p_mask(logits, 0.8)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(top_p_mask(logits, 0.81)).tolist() == [[True, True, True, False]]
    assert torch.isfinite(top_p_mask(logits, 1.0)).all()
    # shuffled vocabulary order gives the same kept set
    perm = torch.tensor([2, 0, 3, 1])
    assert torch.isfinite(top_p_mask(logits[:, perm], 0.8)).tolist() == \
        [[False, True, False, True]]


@pytest.mark.parametrize("scale", [0.3, 3.0, 8.0])  # nuclei of ~40k, ~hundreds, a few tokens
def test_top_p_keeps_the_set_a_full_sort_keeps(scale):
    """Ranking only the most likely tokens first (and the whole vocabulary when their mass is
    short of p) keeps exactly the tokens a sort of the whole vocabulary keeps, row by row,
    including a batch that mixes a flat row with peaked ones."""
    torch.manual_seed(0)
    logits = torch.randn(3, 50257) * scale
    logits[1] *= 0.1  # a flat row among them
    for p in (0.3, 0.9, 0.99):
        probs = torch.softmax(logits, -1)
        ranked, order = torch.sort(probs, -1, descending=True)
        want = torch.zeros_like(probs, dtype=torch.bool).scatter(
            -1, order, ranked.cumsum(-1) - ranked < p)
        assert torch.equal(torch.isfinite(top_p_mask(logits, p)), want)
        for row in range(3):  # and each row alone
            assert torch.equal(torch.isfinite(top_p_mask(logits[row], p)), want[row])


def test_top_p_renormalizes_and_combines_with_temperature():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    p = logits_to_probs(logits, SamplingConfig(temperature=0.5, top_p=0.9))
    ref = torch.softmax(logits / 0.5, -1)
    kept = ref[0] .cumsum(0) - ref[0] < 0.9
    assert torch.allclose(p[0][kept], ref[0][kept] / ref[0][kept].sum())
    assert torch.all(p[0][~kept] == 0)
    assert math.isclose(p.sum().item(), 1.0, rel_tol=1e-6)


def test_greedy_is_argmax():
    logits = torch.randn(4, 50)
    token, probs = sample(logits, SamplingConfig(temperature=0))
    assert torch.equal(token, logits.argmax(-1))
    assert torch.equal(probs.argmax(-1), token) and torch.all(probs.sum(-1) == 1)


@pytest.mark.parametrize("settings", [dict(temperature=1e-300), dict(temperature=1e-40),
                                      dict(temperature=1e-20), dict(top_p=1e-300),
                                      dict(top_p=1e-40)])
def test_the_smallest_settings_sample_the_most_likely_token(settings):
    """A temperature or top-p as small as a float allows is the limit it tends to: the most
    likely tokens (ties shared) by temperature, the first of them by top-p. Scaled naively,
    1e-300 overflowed float32 (or rounded to 0 in it) and gave NaN, which drew a token one
    past the vocabulary."""
    torch.manual_seed(0)
    logits = torch.randn(4, 50) * 5
    logits[0, 7] = logits[0, 9] = logits[0].max() + 1  # a tie for the first place
    probs = logits_to_probs(logits, SamplingConfig(**settings))
    assert torch.isfinite(probs).all() and torch.allclose(probs.sum(-1), torch.ones(4))
    best = logits.max(-1, keepdim=True).values
    assert torch.all(probs[logits < best] == 0)
    if "temperature" in settings:  # the tie shared, the other rows one-hot
        assert probs[0, 7] == probs[0, 9] == 0.5
    token, _ = sample(logits, SamplingConfig(**settings), torch.Generator().manual_seed(0))
    assert torch.all(logits.gather(-1, token[:, None]) == best)


@pytest.mark.parametrize("bad", [dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5),
                                 dict(top_k=-1)])
def test_invalid_sampling_settings(bad):
    with pytest.raises(ScratchGPTError):
        SamplingConfig(**bad)


def test_a_sampling_config_imports_no_torch():
    """A SamplingConfig is plain data: it lived beside the sampling code, so naming one (the
    Python API's scratchgpt.SamplingConfig, its checks included) imported torch."""
    code = ("import sys, scratchgpt\n"
            "cfg = scratchgpt.SamplingConfig(temperature=0.8, top_k=40, top_p=0.9)\n"
            "try:\n"
            "    scratchgpt.SamplingConfig(top_k=-1)\n"
            "except scratchgpt.ScratchGPTError as e:\n"
            "    print(e)\n"
            "print(cfg.top_k, [m for m in sys.modules if m.split('.')[0] == 'torch'][:5])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.splitlines() == ["top_k must be >= 0, got -1", "40 []"], out


def test_the_sampling_modules_config_is_the_same_class():
    """Code that imports SamplingConfig from the sampling code keeps working."""
    import scratchgpt
    from scratchgpt.generation import sampling_config

    assert SamplingConfig is sampling_config.SamplingConfig is scratchgpt.SamplingConfig


def _model() -> GPT:
    torch.manual_seed(1)
    return GPT(GPTConfig(vocab_size=23, block_size=64, n_layer=2, n_head=2, n_embd=16)).eval()


def test_greedy_generation_equals_argmax_of_full_forward():
    model = _model()
    prompt = torch.tensor([[1, 2, 3]])
    out = generate(model, prompt, 20, SamplingConfig(temperature=0))
    seq = prompt
    with torch.no_grad():
        for _ in range(20):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, seq)


@pytest.mark.parametrize("setting,value", [("temperature", "0.8"), ("top_k", 2.5),
                                           ("top_k", True), ("top_p", "0.9")])
def test_sampling_settings_of_the_wrong_type_are_refused_by_name(setting, value):
    """top_k 2.5 was accepted and failed inside torch.topk at the first token; a string
    failed in a comparison."""
    with pytest.raises(ScratchGPTError, match=f"{setting} must be .*, got {value!r}"):
        SamplingConfig(**{setting: value})


def test_beam_one_equals_greedy():
    model = _model()
    prompt = torch.tensor([[4, 5]])
    greedy = generate(model, prompt, 15, SamplingConfig(temperature=0))[0, 2:].tolist()
    (best, _), = beam_search(model, prompt, 1, 15)
    assert best == greedy


@pytest.mark.parametrize("prompt_len,past", [(2, 0), (2, 1), (2, 40), (40, 30)])
def test_beam_search_slides_its_window_as_sampling_does(prompt_len, past):
    """Up to the whole context (the last new token is never fed), then ``past`` tokens
    beyond it, from a prompt shorter or longer than the context: beam 1 equals greedy
    sampling's tokens, window slides included; wider beams run as far and score finitely."""
    model = _model()
    ctx = model.config.block_size
    prompt = torch.randint(0, model.config.vocab_size, (1, prompt_len),
                           generator=torch.Generator().manual_seed(prompt_len))
    n = max(ctx - prompt_len + 1, 1) + past
    greedy = generate(model, prompt, n, SamplingConfig(temperature=0))[0, prompt_len:].tolist()
    (best, _), = beam_search(model, prompt, 1, n)
    assert best == greedy and len(best) == n
    hyps = beam_search(model, prompt, 3, n)
    assert len(hyps) == 3 and all(len(t) == n and math.isfinite(sc) for t, sc in hyps)


def test_beam_search_returns_only_whole_texts():
    """A search that stops because ``beam`` hypotheses ended returns those, not the live beams
    it cut short (which could outscore them); one that runs to max_new_tokens returns both."""
    from scratchgpt.generation.stopping import StopRule
    from tests.tiny_gpt import sharp_gpt

    model, n = sharp_gpt(scale=3), 12
    torch.manual_seed(0)
    prompt = torch.randint(0, 29, (1, 3))
    stopped_early = 0
    for eos in range(29):
        hyps = beam_search(model, prompt, 3, StopRule(n, eos_id=eos))
        assert all(h[-1] == eos or len(h) == n for h, _ in hyps), eos
        stopped_early += sum(h[-1] == eos for h, _ in hyps) >= 3
    assert stopped_early  # (the case in question arose)


def test_a_search_stopped_after_k_steps_leaves_its_hypotheses_in_out(monkeypatch):
    """Ctrl-C during the step after k: ``out`` holds every hypothesis of a search of exactly k
    steps, its ended ones first, best first, then its live beams, best first: an ended one
    comes first even where a live beam outscores it (a live beam is cut short, not a text)."""
    from scratchgpt.generation import beam
    from scratchgpt.generation.stopping import StopRule
    from tests.tiny_gpt import sharp_gpt

    model, real_prefill = sharp_gpt(scale=3), beam.prefill
    torch.manual_seed(0)
    prompt = torch.randint(0, 29, (1, 3))
    seen = {"live": 0, "ended": 0, "ended below a live beam": 0, "ended and live": 0}
    for eos in range(29):
        for k in range(1, 7):
            calls = []

            def prefill(*args, k=k, calls=calls):
                calls.append(1)
                if len(calls) > k:  # the prompt's feed, then one a step
                    raise KeyboardInterrupt
                return real_prefill(*args)

            monkeypatch.setattr(beam, "prefill", prefill)
            out: list = []
            try:
                beam.beam_search(model, prompt, 3, StopRule(12, eos_id=eos), out=out)
                continue  # three hypotheses ended before step k: the search was over
            except KeyboardInterrupt:
                pass
            monkeypatch.setattr(beam, "prefill", real_prefill)
            hyps = beam.beam_search(model, prompt, 3, StopRule(k, eos_id=eos))
            ended = [h for h in hyps if h[0][-1] == eos]
            live = [h for h in hyps if h[0][-1] != eos]
            assert len(hyps) > 1 and out == ended + live, (eos, k)
            seen["ended" if ended else "live"] += 1
            seen["ended and live"] += bool(ended and live)
            seen["ended below a live beam"] += bool(ended) and ended[0] != hyps[0]
    assert all(seen.values()), seen  # (every case arose)


@pytest.mark.parametrize("penalty", [math.nan, math.inf])
def test_beam_search_refuses_a_length_penalty_that_ranks_nothing(penalty):
    with pytest.raises(ScratchGPTError, match="finite"):
        beam_search(_model(), torch.tensor([[4, 5]]), 2, 5, length_penalty=penalty)


@pytest.mark.parametrize("penalty", [1e308, -1e308, 20.5, -21])
def test_beam_search_refuses_a_length_penalty_past_the_limit(penalty):
    """length ** 1e308 is past the largest float and length ** -1e308 rounds to 0: the search
    failed dividing by them (OverflowError, ZeroDivisionError)."""
    with pytest.raises(ScratchGPTError, match="from -20 to 20"):
        beam_search(_model(), torch.tensor([[4, 5]]), 2, 5, length_penalty=penalty)


@pytest.mark.parametrize("penalty", [20, -20])
def test_beam_search_takes_a_length_penalty_at_the_limit(penalty):
    """At the limit the scores stay finite, each length's hypotheses ranked among
    themselves."""
    hyps = beam_search(_model(), torch.tensor([[4, 5]]), 3, 6, length_penalty=penalty)
    assert hyps and all(math.isfinite(score) for _, score in hyps)


@pytest.mark.parametrize("stop", [0, "rule"])
def test_beam_search_of_no_new_tokens_is_the_empty_continuation(stop):
    """As generate returns the prompt alone: the search failed to prefill a cache sized for
    the tokens it would feed (one fewer than the prompt), then had no step to report."""
    from scratchgpt.generation.stopping import StopRule

    rule = StopRule(0, eos_id=3) if stop == "rule" else stop
    assert beam_search(_model(), torch.tensor([[4, 5, 6]]), 2, rule) == [([], 0.0)]


@pytest.mark.parametrize("beam", [2.0, True, "2"])
def test_beam_search_refuses_a_beam_that_is_not_a_whole_number(beam):
    with pytest.raises(ScratchGPTError, match=f"beam must be a whole number >= 1, got {beam!r}"):
        beam_search(_model(), torch.tensor([[4, 5]]), beam, 5)


def test_beam_search_finds_at_least_greedy_likelihood():
    model = _model()
    prompt = torch.tensor([[4, 5]])

    def logprob(new):
        seq = torch.tensor([[4, 5, *new]])
        with torch.no_grad():
            lp = torch.log_softmax(model(seq)[0, 1:-1], -1)
        return lp.gather(-1, seq[0, 2:, None]).sum().item()

    greedy = generate(model, prompt, 8, SamplingConfig(temperature=0))[0, 2:].tolist()
    hyps = beam_search(model, prompt, 4, 8, length_penalty=0.0)
    assert len(hyps) == 4
    assert logprob(hyps[0][0]) >= logprob(greedy) - 1e-5
    assert math.isclose(hyps[0][1], logprob(hyps[0][0]), rel_tol=1e-4)


def test_same_seed_same_sample_and_different_seed_differs():
    model = _model()
    prompt = torch.tensor([[1]])
    cfg = SamplingConfig(temperature=1.0, top_k=10)
    a = generate(model, prompt, 30, cfg, torch.Generator().manual_seed(7))
    b = generate(model, prompt, 30, cfg, torch.Generator().manual_seed(7))
    c = generate(model, prompt, 30, cfg, torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_generation_past_context_slides_window():
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=1, n_embd=8)).eval()
    out = generate(model, torch.tensor([[1, 2, 3]]), 30, SamplingConfig(temperature=0))
    assert out.shape == (1, 33)


def test_draw_follows_the_weights_and_never_picks_a_zero():
    """Inverse-CDF draws against unnormalized weights with zeros (first, inside, last), per
    row: frequencies within 4 standard errors of the weights, zeros never drawn."""
    from scratchgpt.generation.sampling import draw

    w = torch.tensor([[0.0, 2.0, 0.0, 1.0, 5.0, 0.0], [3.0, 0.0, 0.0, 0.0, 0.0, 1.0]])
    gen = torch.Generator().manual_seed(0)
    n = 20000
    picks = torch.stack([draw(w, gen) for _ in range(n)])  # (n, 2)
    for row in range(2):
        freq = torch.bincount(picks[:, row], minlength=6).double() / n
        p = w[row].double() / w[row].sum()
        assert torch.all(freq[p == 0] == 0)
        assert torch.all((freq - p).abs() <= 4 * (p * (1 - p) / n).sqrt() + 1e-12), (freq, p)
    assert draw(torch.tensor([0.0, 0.0, 7.0]), gen).item() == 2  # one row (V,) -> scalar


@pytest.mark.parametrize("k", [23, 24, 10**9])
def test_a_top_k_of_the_vocabulary_or_more_is_no_top_k(k):
    """A top_k of the model's 23 tokens or more keeps every token, as top_k 0 does (the CLI
    says so in a note, serve takes it as OpenAI-style clients send it): the distribution, and
    so every seeded sample, is top_k None's, while a top_k below the vocabulary cuts it."""
    model = _model()
    prompt = torch.tensor([[1, 2]])
    with torch.no_grad():
        logits = model(prompt)[:, -1]
    wide, off = SamplingConfig(temperature=1.3, top_k=k), SamplingConfig(temperature=1.3)
    assert torch.equal(logits_to_probs(logits, wide), logits_to_probs(logits, off))
    assert int((logits_to_probs(logits, SamplingConfig(top_k=22)) > 0).sum()) == 22

    def sampled(cfg: SamplingConfig) -> torch.Tensor:
        return generate(model, prompt, 40, cfg, torch.Generator().manual_seed(3))

    assert torch.equal(sampled(wide), sampled(off))
    assert not torch.equal(sampled(SamplingConfig(temperature=1.3, top_k=2)), sampled(off))
