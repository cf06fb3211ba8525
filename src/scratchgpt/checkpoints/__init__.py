"""Checkpoints: atomic saves, validated loads, run directories, Hugging Face interop."""

from scratchgpt.checkpoints.io import (
    FORMAT,
    FORMAT_VERSION,
    Checkpoint,
    ModelSource,
    load_checkpoint,
    load_model,
    model_from_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
)


def checkpoint_tokenizer(source: ModelSource):
    """The tokenizer of a loaded model (see :meth:`ModelSource.tokenizer`)."""
    return source.tokenizer()


__all__ = ["FORMAT", "FORMAT_VERSION", "Checkpoint", "ModelSource", "checkpoint_tokenizer",
           "load_checkpoint", "load_model", "model_from_checkpoint", "resolve_checkpoint",
           "save_checkpoint"]
