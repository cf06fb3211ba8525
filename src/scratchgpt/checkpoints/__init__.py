"""Checkpoints: atomic saves, validated loads, and run directories."""

from scratchgpt.checkpoints.io import (
    FORMAT,
    FORMAT_VERSION,
    checkpoint_tokenizer,
    load_checkpoint,
    load_model,
    resolve_checkpoint,
    save_checkpoint,
)

__all__ = ["FORMAT", "FORMAT_VERSION", "checkpoint_tokenizer", "load_checkpoint", "load_model",
           "resolve_checkpoint", "save_checkpoint"]
