"""generation/next_token.py: settings written as text, and the distributions sample draws from."""

import doctest
import math

import pytest
import torch

from scratchgpt.errors import GenerationError
from scratchgpt.generation import next_token
from scratchgpt.generation.next_token import (
    distributions,
    entropy,
    next_token_logits,
    parse_setting,
    setting_label,
)
from scratchgpt.generation.sampling import SamplingConfig, sample
from scratchgpt.models.gpt import GPT, GPTConfig


def test_docstring_examples_run():
    assert doctest.testmod(next_token, raise_on_error=True).attempted > 0


@pytest.mark.parametrize("text, cfg, label", [
    ("T=0.7", SamplingConfig(0.7), "T=0.7"),
    ("k=40", SamplingConfig(top_k=40), "top-k=40"),
    ("top-p=0.9", SamplingConfig(top_p=0.9), "top-p=0.9"),
    (" t=0.8 , K=40, p=0.95", SamplingConfig(0.8, 40, 0.95), "T=0.8 top-k=40 top-p=0.95"),
    ("greedy", SamplingConfig(0.0), "greedy"),
    ("T=1", SamplingConfig(), "T=1"),
])
def test_parse_setting(text, cfg, label):
    assert parse_setting(text) == cfg
    assert setting_label(cfg) == label
    assert parse_setting(label.replace(" ", ",")) == cfg  # a label reads back as its setting


@pytest.mark.parametrize("bad", ["", "T", "T=", "q=1", "k=2.5", "T=0.5;k=3", "p=0",
                                 "T=1,T=2", "k=5,top-k=9"])
def test_parse_setting_rejects(bad):
    with pytest.raises(GenerationError):
        parse_setting(bad)


def test_distributions_are_what_sample_draws_from():
    torch.manual_seed(0)
    logits = torch.randn(50) * 3
    settings = [SamplingConfig(0.5), SamplingConfig(1.0, 5), SamplingConfig(1.3, None, 0.8)]
    probs = distributions(logits, settings)
    for row, cfg in zip(probs, settings, strict=True):
        _, drawn_from = sample(logits[None], cfg)
        torch.testing.assert_close(row, drawn_from[0])


def test_entropy():
    assert entropy(torch.full((8,), 1 / 8)) == pytest.approx(math.log(8))
    assert entropy(torch.tensor([0.0, 1.0, 0.0])) == 0.0


def test_next_token_logits_reads_the_last_context_of_a_gpt():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8)).eval()
    ids = list(range(11)) + [3, 4]
    logits, used = next_token_logits(model, ids)
    assert used == 8
    torch.testing.assert_close(logits, model(torch.tensor([ids[-8:]]))[0, -1])
    with pytest.raises(GenerationError):
        next_token_logits(model, [])
