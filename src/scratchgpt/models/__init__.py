"""Language models. Each is a plain ``nn.Module`` with ``forward(idx, cache=None) -> logits``,
``new_cache(batch_size, max_len)`` for incremental decoding, and ``num_params()``."""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from scratchgpt.errors import ConfigError
from scratchgpt.models.bigram import BigramConfig, BigramLM
from scratchgpt.models.gpt import GPT, GPTConfig
from scratchgpt.models.rnn import CELLS, RecurrentLM, cell_config

# model type -> (config class, model class)
MODEL_TYPES: dict[str, tuple[type, type[nn.Module]]] = {
    "gpt": (GPTConfig, GPT),
    "bigram": (BigramConfig, BigramLM),
    # recurrent LMs: one model class, the cell named by the type ("rnn", "lstm", "gru")
    **{cell: (cell_config(cell), RecurrentLM) for cell in CELLS},
}


def config_fields(model_type: str) -> set[str]:
    """Names of the hyperparameters a model type takes (fields fixed with ``init=False``, such
    as a recurrent model's cell, are set by the type, not by the user)."""
    return {f.name for f in dataclasses.fields(MODEL_TYPES[model_type][0]) if f.init}


def make_config(model_type: str, values: dict[str, Any]):
    """Build and validate the config of ``model_type`` from a dict (unknown keys are an error)."""
    if model_type not in MODEL_TYPES:
        raise ConfigError(
            f"unknown model type {model_type!r}; choose from {', '.join(MODEL_TYPES)}")
    extra = set(values) - config_fields(model_type)
    if extra:
        raise ConfigError(f"model {model_type!r} does not take: {', '.join(sorted(extra))}")
    return MODEL_TYPES[model_type][0](**values)


def build_model(model_type: str, config: Any) -> nn.Module:
    """Instantiate ``model_type`` from its config object (or a dict of its fields)."""
    if isinstance(config, dict):
        config = make_config(model_type, config)
    return MODEL_TYPES[model_type][1](config)
