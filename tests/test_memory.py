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
