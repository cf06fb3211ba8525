"""The C decode step computes what the eager model computes: the same logits and KV cache step by
step (fp32, int8), the fp32 model's logits within bf16's rounding (bf16), the same tokens past
the context (where the window slides), with left padding, on any thread count, and as the
target and draft of speculative decoding; models it does not implement stay eager."""

from __future__ import annotations

import copy

import pytest
import torch

from scratchgpt.generation.decode import prefill_rows
from scratchgpt.generation.generate import generate, generate_batch
from scratchgpt.generation.sampling import SamplingConfig
from scratchgpt.generation.speculative import speculative_generate
from scratchgpt.models import native
from scratchgpt.models.fast_decode import prepare_for_decode, quantize_int8
from scratchgpt.models.gpt import GPT
from scratchgpt.models.lora import LoRAConfig, add_lora
from scratchgpt.models.native import NativeGPT, native_refusal
from tests.tiny_gpt import sharp_gpt

pytestmark = pytest.mark.skipif(native.load() is None,
                                reason="the C decode step needs AVX-512 and a C compiler")

GREEDY = SamplingConfig(temperature=0)
# options the C step implements, each changing what a step computes; n_embd 40 and head width
# 20 are not multiples of 16 (the kernel's masked tails)
OPTIONS = {
    "gpt2": {},
    "exact-gelu-no-bias": dict(activation="gelu", bias=False),
    "relu2-untied-softcap": dict(activation="relu2", tie_weights=False, logit_softcap=15.0),
    "relu-sinusoidal": dict(activation="relu", pos_encoding="sinusoidal"),
    "odd-widths": dict(n_embd=40, n_head=2),
    # every option of the speedrun stack at once (cpu-speedrun's model)
    "speedrun-stack": dict(pos_encoding="rope", qk_norm=True, activation="relu2",
                           value_embeds=1, unet_skips=True, logit_softcap=15.0,
                           tie_weights=False, n_layer=3),
}


def tiny(**kw) -> GPT:
    return sharp_gpt(**{"n_embd": 32, "block_size": 24, **kw})


def stepwise(model, tokens: torch.Tensor, prompt: int = 4) -> tuple[list[torch.Tensor], object]:
    """Prefill ``prompt`` tokens, then feed the rest one at a time: each step's logits, and
    the cache."""
    with torch.inference_mode():
        cache = model.new_cache(1)
        model(tokens[:, :prompt], cache)
        steps = [model(tokens[:, t:t + 1], cache) for t in range(prompt, tokens.shape[1])]
    return steps, cache


@pytest.mark.parametrize("option", OPTIONS.values(), ids=OPTIONS.keys())
@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_c_steps_give_the_eager_logits_and_cache(option, dtype):
    model = tiny(**option)
    eager = prepare_for_decode(copy.deepcopy(model), dtype, native=False)
    fast = prepare_for_decode(model, dtype)
    assert isinstance(fast, NativeGPT)
    tokens = torch.randint(0, 29, (1, 20))
    want, want_cache = stepwise(eager, tokens)
    got, cache = stepwise(fast, tokens)
    for t, (g, w) in enumerate(zip(got, want, strict=True)):
        # the same arithmetic in another order: float rounding only (logits reach ~±40)
        assert torch.allclose(g, w, rtol=1e-5, atol=1e-4), t
    assert cache.pos == want_cache.pos == 20
    assert torch.allclose(cache.k, want_cache.k, atol=1e-5)
    assert torch.allclose(cache.v, want_cache.v, atol=1e-5)


def test_a_bf16_step_is_the_fp32_model_within_bf16_rounding():
    """bf16 weights, fp32 arithmetic: closer to the fp32 model than the eager bf16 model, which
    rounds every activation to bf16 as well."""
    model = tiny(n_embd=64, n_head=4)
    reference = copy.deepcopy(model)
    eager = prepare_for_decode(copy.deepcopy(model), "bf16", native=False)
    fast = prepare_for_decode(model, "bf16")
    tokens = torch.randint(0, 29, (1, 20))
    with torch.inference_mode():
        want = reference(tokens)[:, 4:]  # (1, 16, V) the fp32 model, uncached
    got = torch.cat(stepwise(fast, tokens)[0], dim=1)
    eager_got = torch.cat(stepwise(eager, tokens)[0], dim=1).float()
    scale = want.abs().max()
    assert (got - want).abs().max() < 0.02 * scale
    assert (got - want).abs().mean() < (eager_got - want).abs().mean()


@pytest.mark.parametrize("option", ["gpt2", "speedrun-stack"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "int8"])
def test_greedy_tokens_past_the_context_equal_the_eager_ones(dtype, option):
    """60 tokens with a context of 24: the window slides (an eager re-prefill) again and again."""
    model = tiny(**OPTIONS[option])
    eager = prepare_for_decode(copy.deepcopy(model), dtype, native=False)
    fast = prepare_for_decode(model, dtype)
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    assert torch.equal(generate(fast, prompt, 60, GREEDY), generate(eager, prompt, 60, GREEDY))


def test_a_left_padded_row_decodes_as_if_alone():
    """One row with padding in front (a server's or a batch's leftover row): the C step skips
    the padding slots and counts positions from the first real token."""
    fast = prepare_for_decode(tiny(), "fp32")
    ids = [7, 3, 9, 4]
    with torch.inference_mode():
        padded, alone = fast.new_cache(1), fast.new_cache(1)
        prefill_rows(fast, alone, [ids])
        padded.left_pad(torch.tensor([3]))
        fast(torch.tensor([[0, 0, 0] + ids]), padded)
        for token in (5, 8, 2):
            got = fast(torch.tensor([[token]]), padded)
            want = fast(torch.tensor([[token]]), alone)
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "int8"])
def test_a_batch_decodes_each_row_as_alone_bit_for_bit(dtype):
    """Rows of different prompt lengths (left padding) in one C step: each row's logits are the
    very bits of its own step alone, and the eager batch's within float rounding."""
    model = tiny(**OPTIONS["speedrun-stack"])
    eager = prepare_for_decode(copy.deepcopy(model), dtype, native=False)
    fast = prepare_for_decode(model, dtype)
    rows = [[3, 1, 4, 1, 5, 9], [2, 7], [1, 8, 2, 8]]
    nexts = torch.tensor([[6], [5], [3]])
    with torch.inference_mode():
        batch, eager_batch = fast.new_cache(3), eager.new_cache(3)
        prefill_rows(fast, batch, rows), prefill_rows(eager, eager_batch, rows)
        alone = [copy.deepcopy(batch) for _ in rows]  # row i alone, with its padding
        for i, cache in enumerate(alone):
            cache.select_rows(torch.tensor([i]))
        together = [fast(nexts, batch)[:, 0] for _ in range(3)]  # three steps
        want = [eager(nexts, eager_batch)[:, 0].float() for _ in range(3)]
        for i, cache in enumerate(alone):
            for step in range(3):
                assert torch.equal(fast(nexts[i:i + 1], cache)[0, 0], together[step][i])
    tolerance = {"fp32": 1e-4, "int8": 1e-4, "bf16": 0.5}[dtype]  # bf16: eager rounds more
    for got, w in zip(together, want, strict=True):
        assert torch.allclose(got, w, rtol=1e-4, atol=tolerance)


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_a_server_sized_batch_decodes_each_row_as_alone_bit_for_bit(dtype):
    """Nine rows in one C step (a server gives a small model's whole batch to it): from eight
    rows on, int8 products widen each block of weights once for all rows instead of at every
    step, and a row still gets the bits of its step alone."""
    fast = prepare_for_decode(tiny(n_embd=48, n_head=3), dtype, pack=False, native_rows=9)
    rows = [[3, 1, 4, 1, 5, 9, 2, 6][: 1 + i % 8] for i in range(9)]
    nexts = torch.arange(9).view(9, 1) + 1
    with torch.inference_mode():
        batch = fast.new_cache(9)
        prefill_rows(fast, batch, rows)
        alone = [copy.deepcopy(batch) for _ in rows]
        together = fast(nexts, batch)[:, 0]  # (9, V) one C step
        for i, cache in enumerate(alone):
            cache.select_rows(torch.tensor([i]))
            assert torch.equal(fast(nexts[i:i + 1], cache)[0, 0], together[i])


# (SMALL_MODEL_ROWS + 1: more rows than a C step takes, so the batch's steps are eager)
@pytest.mark.parametrize("n_prompts", [3, native.SMALL_MODEL_ROWS + 1])
def test_batched_generation_gives_each_prompts_own_tokens(n_prompts):
    fast = prepare_for_decode(tiny(**OPTIONS["speedrun-stack"]), "fp32")
    prompts = [[3, 1, 4, 1, 5, 9, 2][: 2 + i] for i in range(n_prompts)]
    together = generate_batch(fast, prompts, 30, GREEDY)
    alone = [generate_batch(fast, [p], 30, GREEDY)[0] for p in prompts]
    assert together == alone


def test_every_thread_count_gives_the_same_bits():
    """Each output row is summed by one thread, in one order, whatever the thread count."""
    fast = prepare_for_decode(tiny(n_embd=64, n_head=4), "fp32")
    tokens = torch.randint(0, 29, (1, 12))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one, _ = stepwise(fast, tokens)
        torch.set_num_threads(3)
        three, _ = stepwise(fast, tokens)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(one, three, strict=True))


def test_speculative_decoding_with_c_steps_keeps_the_targets_tokens():
    target = prepare_for_decode(tiny(n_layer=3), "fp32")
    draft = prepare_for_decode(tiny(n_layer=1), "fp32")
    prompt = torch.tensor([[3, 1, 4]])
    out, _ = speculative_generate(target, draft, prompt, 40, 4, GREEDY)
    assert torch.equal(out, generate(target, prompt, 40, GREEDY))


def test_models_it_does_not_implement_stay_eager():
    model = tiny(residual=False)
    assert native_refusal(model) == "the C decode step does not implement --no-residual"
    assert isinstance(prepare_for_decode(model, "fp32"), GPT)
    adapted = tiny()
    add_lora(adapted, LoRAConfig(rank=2))  # its products are not the plain weights' alone
    assert "LoRALinear" in native_refusal(adapted)


def test_int8_models_need_the_bf16_dot_product(monkeypatch):
    """Built for a CPU without AVX512-BF16, the C step has no int8 products: it refuses int8
    models (they decode in PyTorch) and still takes fp32 ones."""
    class WithoutInt8:
        @staticmethod
        def gpt_decode_int8() -> int:
            return 0

    monkeypatch.setattr(native, "_library", lambda: WithoutInt8())
    assert "AVX512-BF16" in native_refusal(quantize_int8(tiny()))
    assert native_refusal(tiny()) is None


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv(native.SWITCH, "torch")
    native._library.cache_clear()
    try:
        model = tiny()
        assert "SCRATCHGPT_DECODE_KERNEL" in native_refusal(model)
        assert isinstance(prepare_for_decode(model, "fp32"), GPT)
    finally:
        native._library.cache_clear()  # (monkeypatch restores the environment after this)


def test_bad_token_ids_get_the_eager_error():
    fast = prepare_for_decode(tiny(), "fp32")
    with torch.inference_mode():
        cache = fast.new_cache(1)
        fast(torch.tensor([[1, 2]]), cache)
        with pytest.raises(IndexError):
            fast(torch.tensor([[29]]), cache)  # vocabulary of 29: no id 29
