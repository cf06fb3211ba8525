"""A small random GPT with sharpened logits, for tests that compare two ways of generating."""

from __future__ import annotations

import torch

from scratchgpt.models.gpt import GPT, GPTConfig


def sharp_gpt(scale: float = 20, **kw) -> GPT:
    """A 2-layer GPT (vocabulary 29, context 16, 2 heads, 16 wide unless ``kw`` says
    otherwise), seeded, in eval mode, its output head scaled by ``scale`` so that greedy
    choices are far from ties: two correct implementations then pick the same tokens."""
    torch.manual_seed(0)
    cfg = dict(vocab_size=29, block_size=16, n_layer=2, n_head=2, n_embd=16)
    model = GPT(GPTConfig(**{**cfg, **kw}))
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model.eval()
