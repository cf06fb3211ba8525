"""The size the README gives for GPT-2's LoRA adapter is the size of what adapter.pt holds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from scratchgpt.finetune.adapter import trainable_names
from scratchgpt.models import build_model
from scratchgpt.models.configs.lora import GPTLoRAConfig, LoRAConfig
from scratchgpt.models.gpt import GPTConfig

README = Path(__file__).resolve().parents[2] / "README.md"
GPT2 = GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768)


def test_the_readme_gives_gpt2_s_adapter_its_size():
    """The tour said a GPT-2 instruction run's adapter.pt was 'a few hundred KiB': at the
    default rank 8 on attn,mlp its fp32 tensors alone are 4.5 MiB (1,179,648 numbers), ten
    times that. (The model is built on the meta device: no weights are allocated.)"""
    said = re.search(r"# LoRA: adapter\.pt, ([\d.]+) MiB for GPT-2", README.read_text())
    assert said, "the README's tour no longer gives the adapter's size"
    config = GPTLoRAConfig(gpt=GPT2, lora=LoRAConfig())
    with torch.device("meta"):
        kept = trainable_names(config)  # the tensors adapter.pt holds
        trained = [p for name, p in build_model(config).named_parameters() if name in kept]
    assert kept and all("lora" in name for name in kept)
    assert all(p.dtype == torch.float32 for p in trained)
    size = sum(p.numel() for p in trained) * 4 / 2**20
    assert float(said[1]) == pytest.approx(size, abs=0.05)
