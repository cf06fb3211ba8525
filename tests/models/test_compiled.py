"""The compiled decode step computes what the eager model computes: the same logits step by
step, the same tokens past the context (where the window slides) and for batches (which run
eager), and the static step's mask on a padded batch is the KV cache's."""

from __future__ import annotations

import pytest
import torch

from scratchgpt.errors import ConfigError
from scratchgpt.generation.decode import prefill_rows
from scratchgpt.generation.generate import generate, generate_batch
from scratchgpt.generation.sampling import SamplingConfig
from scratchgpt.models.bigram import BigramConfig, BigramLM
from scratchgpt.models.compiled import CompiledGPT, compile_available
from scratchgpt.models.fast_decode import quantize_int8
from scratchgpt.models.gpt import GPT
from tests.tiny_gpt import sharp_gpt

pytestmark = pytest.mark.skipif(compile_available() is not None,
                                reason=str(compile_available()))

GREEDY = SamplingConfig(temperature=0)
# every option of the speedrun stack at once: each changes what the step computes
STACK = dict(pos_encoding="rope", qk_norm=True, activation="relu2", value_embeds=1,
             unet_skips=True, logit_softcap=15.0, tie_weights=False)


@pytest.fixture(autouse=True)
def _fresh_compiler():
    """Each test compiles its own models: without a reset, graphs of earlier tests' models
    would fill the compiler's per-function cache and later ones would run eager."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def graphs() -> int:
    """Graphs the compiler has made in this process."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def tiny(**kw) -> GPT:
    return sharp_gpt(**{"n_embd": 32, **kw})


@pytest.mark.parametrize("option", [{}, STACK], ids=["gpt2", "speedrun-stack"])
def test_compiled_steps_give_the_eager_logits(option):
    model = tiny(**option)
    compiled = CompiledGPT(model)
    graphs_before = graphs()
    tokens = torch.randint(0, 29, (1, 14))
    with torch.inference_mode():
        eager_cache, cache = model.new_cache(1), compiled.new_cache(1)
        model(tokens[:, :4], eager_cache), compiled(tokens[:, :4], cache)  # prefill (eager)
        for t in range(4, 14):
            want = model(tokens[:, t:t + 1], eager_cache)
            got = compiled(tokens[:, t:t + 1], cache)
            assert torch.allclose(got, want, atol=1e-4), t
    assert cache.pos == eager_cache.pos == 14
    assert graphs() == graphs_before + 1  # the steps ran compiled: no fallback to eager
    assert cache.max_len == 16  # always the whole context: one graph for every generation


def test_static_step_gives_forward_logits_on_a_padded_batch():
    """decode_static's mask and positions (uncompiled here) are KVCache's: padding hidden,
    each row's positions from its own first token."""
    model = tiny(**STACK)
    rows = [[1, 2, 3], [9], [4, 5, 6, 7, 8]]
    with torch.inference_mode():
        a, b = model.new_cache(3), model.new_cache(3)
        prefill_rows(model, a, rows), prefill_rows(model, b, rows)
        for token in (7, 11, 2):
            idx = torch.full((3, 1), token)
            slot = torch.tensor([b.pos])
            got = model.decode_static(idx, slot, b.pos_offset, b.key_mask, b.k, b.v)
            b.pos += 1
            assert torch.allclose(got, model(idx, a), atol=1e-5)


def test_compiled_generation_matches_eager_past_the_context_and_in_batches():
    model = tiny(**STACK)
    compiled = CompiledGPT(model)
    prompts = [[1, 2, 3], [9], [4, 5, 6, 7, 8]]  # batches run eager on the compiled model
    assert generate_batch(compiled, prompts, 8, GREEDY) == generate_batch(model, prompts, 8,
                                                                          GREEDY)
    prompt = torch.tensor([[5, 6]])
    n = 40  # past the context of 16: the window slides (an eager prefill) and goes on
    assert generate(compiled, prompt, n, GREEDY).tolist() == generate(model, prompt, n,
                                                                      GREEDY).tolist()
    sampled = SamplingConfig(temperature=0.9, top_p=0.95)  # the same draws give the same text
    assert generate(compiled, prompt, n, sampled, torch.Generator().manual_seed(3)).tolist() \
        == generate(model, prompt, n, sampled, torch.Generator().manual_seed(3)).tolist()


def test_compile_refuses_what_it_cannot_run():
    with pytest.raises(ConfigError, match="GPT"):
        CompiledGPT(BigramLM(BigramConfig(vocab_size=10)))
    with pytest.raises(ConfigError, match="fp32"):
        CompiledGPT(quantize_int8(tiny()))
    with pytest.raises(ConfigError, match="fp32"):
        CompiledGPT(tiny().to(torch.bfloat16))


def test_compile_refuses_a_large_model(monkeypatch):
    import scratchgpt.models.compiled as compiled

    model = tiny()
    size = sum(p.numel() * 4 for p in model.parameters())
    monkeypatch.setattr(compiled, "COMPILE_MAX_BYTES", size - 1)
    with pytest.raises(ConfigError, match="small models"):
        CompiledGPT(model)


def test_prepare_compiled_compiles_what_it_can_and_else_says_why():
    from scratchgpt.models.compiled import prepare_compiled
    from scratchgpt.models.fast_decode import Int8Linear

    assert isinstance(prepare_compiled(tiny()), CompiledGPT)
    with pytest.raises(ConfigError, match="fp32"):
        prepare_compiled(tiny(), "int8")
    eager = prepare_compiled(tiny(), "int8", required=False)  # a large target, say: eager
    assert isinstance(eager, GPT) and isinstance(eager.lm_head, Int8Linear)
    bf16 = prepare_compiled(tiny(), "bf16", required=False)
    assert isinstance(bf16, GPT) and bf16.transformer.wte.weight.dtype == torch.bfloat16
