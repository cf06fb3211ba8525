"""Generation with a recurrent LM carries the hidden state forward, and matches recomputing the
whole sequence at every step."""

from __future__ import annotations

import pytest
import torch

from scratchgpt.generation.beam import beam_search
from scratchgpt.generation.generate import generate, stream
from scratchgpt.generation.sampling import SamplingConfig
from scratchgpt.models import build_model, model_config


def _model(cell: str, seed: int = 0):
    torch.manual_seed(seed)
    # Large init scale so the untrained model has a peaked, prompt-dependent distribution.
    model = build_model(model_config(cell, vocab_size=13, hidden=16, n_layer=2)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    return model


@pytest.mark.parametrize("cell", ["rnn", "lstm", "gru"])
def test_greedy_with_state_equals_recompute(cell):
    model = _model(cell)
    prompt = torch.tensor([[1, 5, 2, 7], [3, 3, 0, 12]])
    fed: list[int] = []
    forward = model.forward
    model.forward = lambda idx, cache=None, last_only=False: (fed.append(idx.size(1)),
                                                              forward(idx, cache, last_only))[1]
    out = generate(model, prompt, 20, SamplingConfig(temperature=0.0))
    assert fed == [4] + [1] * 19  # the prompt is read once, then one token per step
    model.forward = forward
    seq = prompt
    with torch.no_grad():
        for _ in range(20):
            nxt = model(seq)[:, -1].argmax(-1)  # recompute everything from a zero state
            seq = torch.cat([seq, nxt[:, None]], dim=1)
    assert torch.equal(out, seq)


def test_sampled_tokens_equal_recompute_with_same_generator():
    model = _model("lstm", seed=1)
    prompt = torch.tensor([[2, 4]])
    cfg = SamplingConfig(temperature=0.9, top_k=6, top_p=0.95)
    got = torch.cat(list(stream(model, prompt, 15, cfg, torch.Generator().manual_seed(3))))
    from scratchgpt.generation.sampling import sample

    gen, seq = torch.Generator().manual_seed(3), prompt
    with torch.no_grad():
        for _ in range(15):
            nxt, _ = sample(model(seq)[:, -1], cfg, gen)
            seq = torch.cat([seq, nxt[:, None]], dim=1)
    assert torch.equal(got, seq[0, 2:])


def test_beam_one_is_greedy_and_scores_are_true_logprobs():
    model = _model("lstm", seed=2)
    prompt = torch.tensor([[3, 1, 4]])
    greedy = generate(model, prompt, 12, SamplingConfig(temperature=0.0))[0, 3:].tolist()
    assert beam_search(model, prompt, 1, 12)[0][0] == greedy
    # With beams reordered every step, each hypothesis' score must be its real log-probability.
    for tokens, score in beam_search(model, prompt, 4, 8, length_penalty=0.0):
        seq = torch.cat([prompt, torch.tensor([tokens])], dim=1)
        with torch.no_grad():
            logp = torch.log_softmax(model(seq)[0, 2:-1], dim=-1)
        assert score == pytest.approx(float(logp.gather(1, seq[0, 3:, None]).sum()), abs=1e-4)


def test_state_pos_rollback_and_select_rows():
    model = _model("gru")
    cache = model.new_cache(3)
    model(torch.tensor([[1, 2], [3, 4], [5, 6]]), cache=cache)
    assert cache.pos == 2
    h = cache.h.clone()
    cache.select_rows(torch.tensor([2, 2, 0]))
    assert torch.equal(cache.h[:, 0], h[:, 2]) and torch.equal(cache.h[:, 2], h[:, 0])
    cache.rollback(2)  # no-op
    with pytest.raises(ValueError, match="roll back"):
        cache.rollback(1)
    cache.rollback(0)
    assert cache.pos == 0 and not cache.h.any()
    assert model.new_cache(2, dtype=torch.float64).h.dtype == torch.float64
