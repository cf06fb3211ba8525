"""The NumPy reference forward pass gives the torch GPT's logits, for every architecture option."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from scratchgpt.models.gpt import GPT, GPTConfig
from scratchgpt.models.gpt_numpy import gpt, params_from_torch
from tests.models.test_gpt import OPTIONS, option_model


def reference(model: GPT, ids: torch.Tensor) -> np.ndarray:
    """The NumPy spec's logits (T, V) for one row of ids, in float64."""
    return gpt(ids.numpy(), params_from_torch(model.state_dict()), model.config.to_dict())


def test_numpy_reference_matches_torch_logits():
    torch.manual_seed(0)
    for tie, act in ((True, "gelu_tanh"), (False, "gelu")):
        cfg = GPTConfig(vocab_size=53, block_size=32, n_layer=3, n_head=4, n_embd=32,
                        tie_weights=tie, layer_norm_eps=1e-6, activation=act)
        model = GPT(cfg).eval()
        with torch.no_grad():  # make LayerNorm scales and biases matter
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        ids = torch.randint(0, 53, (1, 29))
        with torch.no_grad():
            ours = model(ids)[0].double().numpy()
        ref = reference(model, ids[0])
        assert ref.shape == (29, 53)
        assert np.abs(ours - ref).max() <= 1e-4


@pytest.mark.parametrize("impl", ["sdpa", "math"])
@pytest.mark.parametrize("option", OPTIONS)
def test_every_option_matches_the_numpy_spec(option, impl):
    """In float64 the two implementations agree to rounding; in float32 to float32's."""
    model = option_model(option, attn_impl=impl)
    ids = torch.randint(0, 37, (24,))
    ref = reference(model, ids)  # (24, 37)
    with torch.no_grad():
        fp32 = model(ids[None])[0].double().numpy()
        fp64 = model.double()(ids[None])[0].numpy()
    # (sinusoidal and rotary tables are float32 buffers: in float64 they still carry its rounding)
    tables = model.config.pos_encoding != "learned"
    assert np.abs(fp64 - ref).max() <= (1e-6 if tables else 1e-10)
    assert np.abs(fp32 - ref).max() <= 2e-5 * max(1.0, np.abs(ref).max())
