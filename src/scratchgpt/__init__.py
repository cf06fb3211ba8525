"""scratchgpt: build language models from scratch, as real, fast, tested software.

The Python API, the whole loop from a text to a model's words (README.md, "Python API")::

    prepare_text, TokenDataset            a text -> a prepared dataset, opened
    build_tokenizer, load_tokenizer       tokenizers (prepare_text builds one itself)
    model_config, build_model, GPTConfig  a model's hyperparameters, and a fresh model
    TrainConfig, train, TrainResult       training, with the checks of ``scratchgpt train``
    load_model                            a trained model and its source (the tokenizer)
    SamplingConfig, StopRule              how to pick tokens and when to stop
    generate, stream, generate_batch      sampling, all at once or token by token
    stream_text                           sampling, text piece by piece (any tokenizer)
    beam_search                           the likeliest continuations
    full_split_loss                       the exact loss over a dataset's split
    ScratchGPTError                       what every refusal of bad input raises

Each name is imported from its module on first use, so ``import scratchgpt`` (which the
command line does) costs no torch import; nor do the configs, ``GPTConfig``, ``TrainConfig``,
``SamplingConfig``, ``StopRule`` and ``model_config``, which are plain data (the model and
sampling code is what imports torch).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "prepare_text": "scratchgpt.data.prepare",
    "TokenDataset": "scratchgpt.data.dataset",
    "build_tokenizer": "scratchgpt.tokenizers",
    "load_tokenizer": "scratchgpt.tokenizers",
    "model_config": "scratchgpt.models",
    "build_model": "scratchgpt.models",
    "GPTConfig": "scratchgpt.models.configs.gpt",
    "TrainConfig": "scratchgpt.training.config",
    "train": "scratchgpt.training.job",
    "TrainResult": "scratchgpt.training.trainer",
    "load_model": "scratchgpt.checkpoints.io",
    "SamplingConfig": "scratchgpt.generation.sampling_config",
    "StopRule": "scratchgpt.generation.stopping",
    "generate": "scratchgpt.generation.generate",
    "stream": "scratchgpt.generation.generate",
    "stream_text": "scratchgpt.generation.generate",
    "generate_batch": "scratchgpt.generation.generate",
    "beam_search": "scratchgpt.generation.beam",
    "full_split_loss": "scratchgpt.training.task",
    "ScratchGPTError": "scratchgpt.errors",
}

# (written out, as type checkers and linters read it; the tests hold it equal to _EXPORTS)
__all__ = ["prepare_text", "TokenDataset", "build_tokenizer", "load_tokenizer", "model_config",
           "build_model", "GPTConfig", "TrainConfig", "train", "TrainResult", "load_model",
           "SamplingConfig", "StopRule", "generate", "stream", "stream_text", "generate_batch",
           "beam_search", "full_split_loss", "ScratchGPTError"]

if TYPE_CHECKING:
    from scratchgpt.checkpoints.io import load_model
    from scratchgpt.data.dataset import TokenDataset
    from scratchgpt.data.prepare import prepare_text
    from scratchgpt.errors import ScratchGPTError
    from scratchgpt.generation.beam import beam_search
    from scratchgpt.generation.generate import generate, generate_batch, stream, stream_text
    from scratchgpt.generation.sampling_config import SamplingConfig
    from scratchgpt.generation.stopping import StopRule
    from scratchgpt.models import build_model, model_config
    from scratchgpt.models.configs.gpt import GPTConfig
    from scratchgpt.tokenizers import build_tokenizer, load_tokenizer
    from scratchgpt.training.config import TrainConfig
    from scratchgpt.training.job import train
    from scratchgpt.training.task import full_split_loss
    from scratchgpt.training.trainer import TrainResult


def __getattr__(name: str) -> Any:
    """An exported name, imported on first use (PEP 562) and kept."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
