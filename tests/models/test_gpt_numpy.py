"""The NumPy reference forward pass gives the torch GPT's logits."""

from __future__ import annotations

import numpy as np
import torch

from scratchgpt.models.gpt import GPT, GPTConfig
from scratchgpt.models.gpt_numpy import gpt, params_from_torch


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
        ref = gpt(ids[0].numpy(), params_from_torch(model.state_dict()), cfg.n_head,
                  cfg.layer_norm_eps, cfg.activation)
        assert ref.shape == (29, 53)
        assert np.abs(ours - ref).max() <= 1e-4
