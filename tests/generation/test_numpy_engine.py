"""The NumPy engine generates what the torch engine does, and what the model starts from when
there is no prompt."""

from __future__ import annotations

import pytest
import torch

from scratchgpt.errors import ScratchGPTError
from scratchgpt.generation.beam import beam_search
from scratchgpt.generation.generate import generate, generate_batch
from scratchgpt.generation.numpy_engine import NumpyGPT
from scratchgpt.generation.prompt import start_of_text
from scratchgpt.generation.sampling import SamplingConfig
from scratchgpt.generation.speculative import speculative_generate
from scratchgpt.tokenizers.bpe import BPETokenizer
from scratchgpt.tokenizers.char import CharTokenizer
from tests.tiny_gpt import sharp_gpt as tiny

GREEDY = SamplingConfig(temperature=0)


def test_numpy_greedy_equals_torch_greedy_past_the_context():
    model = tiny()
    engine = NumpyGPT(model)
    prompt = torch.tensor([[1, 2, 3, 4]])
    n = 40  # past the context of 16: both slide the same window
    assert generate(engine, prompt, n, GREEDY).tolist() == generate(model, prompt, n,
                                                                    GREEDY).tolist()


def test_numpy_engine_serves_batches_beams_and_speculation():
    model = tiny()
    engine = NumpyGPT(model)
    prompts = [[1, 2, 3], [9], [4, 5, 6, 7, 8]]
    assert generate_batch(engine, prompts, 8, GREEDY) == generate_batch(model, prompts, 8, GREEDY)
    prompt = torch.tensor([[5, 6]])
    ours, theirs = beam_search(engine, prompt, 3, 6), beam_search(model, prompt, 3, 6)
    assert [h[0] for h in ours] == [h[0] for h in theirs]
    assert [h[1] for h in ours] == pytest.approx([h[1] for h in theirs], abs=1e-4)
    spec, _ = speculative_generate(engine, tiny(n_layer=1), prompt, 20, 3, GREEDY)
    assert spec.tolist() == generate(model, prompt, 20, GREEDY).tolist()


@pytest.mark.parametrize("option", [dict(pos_encoding="sinusoidal"), dict(pos_encoding="rope"),
                                    dict(qk_norm=True, activation="relu2", logit_softcap=15.0)])
def test_numpy_engine_runs_every_architecture_option(option):
    model = tiny(**option)
    prompt = torch.tensor([[1, 2, 3, 4]])
    assert generate(NumpyGPT(model), prompt, 20, GREEDY).tolist() == \
        generate(model, prompt, 20, GREEDY).tolist()


def test_numpy_engine_refuses_a_model_it_would_compute_differently(monkeypatch):
    import scratchgpt.generation.numpy_engine as engine

    real = engine.gpt
    monkeypatch.setattr(engine, "gpt", lambda ids, p, cfg: real(ids, p, cfg) + 1.0)
    with pytest.raises(ScratchGPTError, match="NumPy engine"):
        NumpyGPT(tiny())


def test_start_of_text():
    bpe = BPETokenizer.train("hello world, hello there " * 20, 300)
    assert start_of_text(bpe) == ([bpe.eot_id], "")
    chars = CharTokenizer(list("\n abc"))
    assert start_of_text(chars) == ([0], "\n")
    prose = CharTokenizer(list(" abc"))  # no newline: a space
    assert start_of_text(prose) == ([0], " ")
    assert start_of_text(CharTokenizer(list("xyz"))) == ([0], "x")
