"""The models, and the registry that names them.

Every model is a plain ``nn.Module`` built from a dataclass config. Language models share
``forward(idx, cache=None) -> logits``, ``new_cache(batch_size, max_len)`` for incremental
decoding, and ``num_params()``; the seq2seq models are encoder-decoders (``models/seq2seq.py``).

A model *type* is the name saved in checkpoints and given as ``--model``: ``gpt``, ``bigram``,
``rnn``, ``lstm``, ``gru`` (the language models, :data:`LM_TYPES`), ``seq2seq``, and the
fine-tuned GPTs: ``gpt-classifier`` (a GPT with an N-class head) and ``gpt-lora`` (a GPT with
LoRA adapters). Its config class is the one place its hyperparameters are declared; a config
may nest another (a fine-tuned GPT's holds its base's ``GPTConfig``), saved as a nested dict:

>>> cfg = model_config("gpt", vocab_size=65, n_layer=2, n_head=2, n_embd=32)
>>> model_type(cfg), type(build_model(cfg)).__name__
('gpt', 'GPT')
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from scratchgpt.errors import ConfigError
from scratchgpt.models.configs.bigram import BigramConfig
from scratchgpt.models.configs.classifier import GPTClassifierConfig
from scratchgpt.models.configs.gpt import GPTConfig
from scratchgpt.models.configs.lora import GPTLoRAConfig
from scratchgpt.models.configs.rnn import (
    CELLS,
    RecurrentClassifierConfig,
    RecurrentConfig,
    cell_config,
)
from scratchgpt.models.configs.seq2seq import Seq2SeqConfig
from scratchgpt.validation import check_values, refuse_unknown

if TYPE_CHECKING:
    from torch import nn

# The language models, trained by ``scratchgpt train``: type -> config class. The configs are
# plain data (models/configs/, no torch), so that naming and checking them, as the command
# line's --help does, imports no torch; the models are imported when one is built.
LM_CONFIGS: dict[str, type] = {
    "gpt": GPTConfig,
    "bigram": BigramConfig,
    # recurrent LMs: one model class, the cell named by the type ("rnn", "lstm", "gru")
    **{cell: cell_config(cell) for cell in CELLS},
}
# Every model type a checkpoint may hold: type -> config class.
MODEL_TYPES: dict[str, type] = {
    **LM_CONFIGS,
    "seq2seq": Seq2SeqConfig,
    "rnn-classifier": RecurrentClassifierConfig,
    "gpt-classifier": GPTClassifierConfig,
    "gpt-lora": GPTLoRAConfig,
}

ModelConfig = GPTConfig | BigramConfig | RecurrentConfig | Seq2SeqConfig | \
    RecurrentClassifierConfig | GPTClassifierConfig | GPTLoRAConfig


def model_builders() -> dict[str, Any]:
    """Model type -> the model class (or builder function) its config is built into. It imports
    torch and every model: only building a model needs them."""
    from scratchgpt.models.bigram import BigramLM
    from scratchgpt.models.classifier import GPTClassifier
    from scratchgpt.models.gpt import GPT
    from scratchgpt.models.lora import build_gpt_lora
    from scratchgpt.models.rnn import RecurrentClassifier, RecurrentLM
    from scratchgpt.models.seq2seq import build_seq2seq

    return {"gpt": GPT, "bigram": BigramLM, **{cell: RecurrentLM for cell in CELLS},
            "seq2seq": build_seq2seq, "rnn-classifier": RecurrentClassifier,
            "gpt-classifier": GPTClassifier, "gpt-lora": build_gpt_lora}


def __getattr__(name: str) -> Any:
    """``LM_TYPES`` (the language models) and ``OTHER_TYPES`` (the rest): type -> (config
    class, model class or builder), made on first use, since the models import torch."""
    if name not in ("LM_TYPES", "OTHER_TYPES"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    builders = model_builders()
    types = {t: c for t, c in MODEL_TYPES.items() if (t in LM_CONFIGS) == (name == "LM_TYPES")}
    globals()[name] = {t: (c, builders[t]) for t, c in types.items()}
    return globals()[name]


def config_fields(model_type: str) -> set[str]:
    """Names of the hyperparameters a model type takes (fields fixed with ``init=False``, such
    as a recurrent model's cell, are set by the type, not by the user)."""
    _check_type(model_type)
    return {f.name for f in dataclasses.fields(MODEL_TYPES[model_type]) if f.init}


def model_config(model_type: str, **values: Any) -> ModelConfig:
    """The validated config of ``model_type`` (unknown hyperparameters are an error)."""
    _check_type(model_type)
    return _build_config(MODEL_TYPES[model_type], values, f"model {model_type!r}")


def _build_config(cls: type, values: dict[str, Any], what: str) -> Any:
    """``cls(**values)``, checked; a field typed as a config dataclass may be given as a dict
    (as a checkpoint saves it), built the same way."""
    refuse_unknown(values, [f.name for f in dataclasses.fields(cls) if f.init], what)
    hints = typing.get_type_hints(cls)
    values = {k: _nested(hints[k], v, f"the {k} of {what}") for k, v in values.items()}
    check_values(cls, values)
    try:
        return cls(**values)
    except TypeError as e:  # a required field is missing
        raise ConfigError(f"{what}: {e}") from None


def _nested(annotation: Any, value: Any, what: str) -> Any:
    """``value``, or the config dataclass of ``annotation`` built from it when it is a dict."""
    if not isinstance(value, Mapping):
        return value
    options = typing.get_args(annotation) or (annotation,)
    cls = next((t for t in options if dataclasses.is_dataclass(t)), None)
    return value if cls is None else _build_config(cls, dict(value), what)


def model_type(config: ModelConfig) -> str:
    """The registry name of a config: ``gpt``, ``bigram``, ``rnn``/``lstm``/``gru``,
    ``seq2seq``."""
    if isinstance(config, RecurrentConfig):
        return config.cell
    for name, cls in MODEL_TYPES.items():
        if type(config) is cls:
            return name
    raise ConfigError(f"{type(config).__name__} is not a registered model config")


def build_model(config: ModelConfig) -> nn.Module:
    """A freshly initialised model for ``config`` (initialisation draws from torch's RNG)."""
    return model_builders()[model_type(config)](config)


def config_dict(config: ModelConfig) -> dict[str, Any]:
    """A config as the plain data saved in checkpoints and config.json (``init`` fields; a
    nested config becomes a nested dict)."""
    return {f.name: _plain(getattr(config, f.name)) for f in dataclasses.fields(config)
            if f.init}


def _plain(value: Any) -> Any:
    return config_dict(value) if dataclasses.is_dataclass(value) else value


def _check_type(name: str) -> None:
    if name not in MODEL_TYPES:
        raise ConfigError(f"unknown model type {name!r}; choose from {', '.join(MODEL_TYPES)}")


__all__ = ["LM_CONFIGS", "LM_TYPES", "MODEL_TYPES", "ModelConfig", "build_model", "config_dict",
           "config_fields", "model_builders", "model_config", "model_type"]
