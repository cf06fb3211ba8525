"""The memory check's refusal: sizes in the unit that shows them."""

import pytest

from scratchgpt import memory
from scratchgpt.errors import ConfigError


def test_a_small_budget_is_shown_in_a_unit_that_says_something():
    """A 10 KiB limit against a model of a few hundred KiB read '0.0 GiB ... more than the
    0.0 GiB of memory available'."""
    estimate = memory.Estimate({"weights": 300 * 2**10, "activations": 50 * 2**10})
    with pytest.raises(ConfigError) as refused:
        memory.check_fits(estimate, "the model", available=10 * 2**10)
    message = str(refused.value)
    assert "about 350.0 KiB (weights 300.0, activations 50.0)" in message
    assert "more than the 10.0 KiB of memory available" in message
    assert memory.Estimate({"weights": 3 * 2**30}).describe() == "3.0 GiB (weights 3.0)"
    assert memory.parse_bytes("10KiB") == 10 * 2**10  # the limit's own units, unchanged


@pytest.mark.parametrize("rows, new_tokens", [(1, 30), (2, 30), (2, 8)])
def test_the_kv_estimate_holds_the_slots_generation_takes(rows, new_tokens):
    """The estimate that sample checks before a batch counts the cache slots decode holds: a
    batch past the context reserves more slots than the context (for rows sliding at their
    own lengths), which the estimate left out."""
    from scratchgpt.generation.decode import decode
    from scratchgpt.generation.sampling import SamplingConfig
    from tests.tiny_gpt import sharp_gpt

    model = sharp_gpt()
    caches, new_cache = [], model.new_cache
    model.new_cache = lambda *a, **k: caches.append(new_cache(*a, **k)) or caches[-1]
    prompts = [[1, 2, 3, 4, 5][: 3 + 2 * r] for r in range(rows)]
    for _ in decode(model, prompts, new_tokens, SamplingConfig(temperature=0)):
        pass
    held = sum(t.numel() * t.element_size() for t in (caches[0].k, caches[0].v))
    length = max(map(len, prompts)) + new_tokens
    estimate = memory.inference_estimate(model.config, rows, length).parts["kv_cache"]
    assert held <= estimate
    assert held > 0.75 * estimate  # (and not far more than it takes)
