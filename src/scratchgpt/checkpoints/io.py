"""Saving and loading checkpoints safely.

A run directory holds ``last.pt`` and ``best.pt`` (plus ``config.json``, ``tokenizer.json``,
``metrics.csv``, ``loss.png``). Every write goes to a temporary file in the same directory, is
flushed to disk, and is then renamed over the old file, so a crash or Ctrl-C at any moment
leaves the previous good checkpoint intact.
"""

from __future__ import annotations

import io
import os
import pickle
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from scratchgpt.errors import CheckpointError

FORMAT = "scratchgpt-checkpoint"
FORMAT_VERSION = 1


def atomic_write(path: Path, write) -> None:
    """Call ``write(file_object)`` on a temp file next to ``path``, fsync, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_checkpoint(path: str | Path, state: dict[str, Any],
                    copies: Iterable[str | Path] = ()) -> None:
    """Atomically save ``state`` (must hold model_type, model_config, model) with format tags,
    to ``path`` and to each of ``copies`` (serialized once)."""
    buf = io.BytesIO()
    torch.save({"format": FORMAT, "version": FORMAT_VERSION, **state}, buf)
    for target in (path, *copies):
        atomic_write(Path(target), lambda f: f.write(buf.getbuffer()))


def resolve_checkpoint(path: str | Path, which: str = "best") -> Path:
    """A checkpoint file from a file path or a run directory (``best.pt``, else ``last.pt``)."""
    path = Path(path)
    if path.is_dir():
        order = ["best.pt", "last.pt"] if which == "best" else ["last.pt", "best.pt"]
        for name in order:
            if (path / name).is_file():
                return path / name
        raise CheckpointError(f"no checkpoint (best.pt or last.pt) in {path}")
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    return path


def load_checkpoint(path: str | Path, which: str = "best") -> dict[str, Any]:
    """Load and validate a checkpoint; every failure is a one-line :class:`CheckpointError`."""
    file = resolve_checkpoint(path, which)
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, OSError,
            ValueError) as e:
        reason = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        raise CheckpointError(
            f"{file} is not a readable checkpoint (truncated or corrupt?): {reason}"
                        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{file} is not a scratchgpt checkpoint")
    if state.get("version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{file} has checkpoint format version {state.get('version')}, this scratchgpt "
            f"reads version {FORMAT_VERSION}"
        )
    for key in ("model_type", "model_config", "model"):
        if key not in state:
            raise CheckpointError(f"{file} lacks {key!r}; it is damaged or from another program")
    state["path"] = str(file)
    return state


def load_model(path: str | Path, which: str = "best") -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild the model saved in a checkpoint (eval mode, CPU). Returns (model, checkpoint).

    ``path`` may also be a Hugging Face GPT-2 directory (config.json + model.safetensors or
    pytorch_model.bin), which is converted on the fly (see :mod:`scratchgpt.checkpoints.hf`), or
    ``hf:`` and a hub model id (``hf:gpt2``), downloaded once into the hub's cache
    (:mod:`scratchgpt.checkpoints.hub`)."""
    from scratchgpt.checkpoints.hf import is_hf_dir, load_hf
    from scratchgpt.checkpoints.hub import HF_PREFIX, download
    from scratchgpt.models import build_model

    if str(path).startswith(HF_PREFIX):
        path = download(str(path)[len(HF_PREFIX):])
    if is_hf_dir(path):
        return load_hf(path)
    state = load_checkpoint(path, which)
    model = build_model(state["model_type"], dict(state["model_config"]))
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as e:
        raise CheckpointError(f"{state['path']}: weights do not fit the model: "
                        f"{str(e).splitlines()[0][:200]}") from None
    model.eval()
    return model, state


def checkpoint_tokenizer(state: dict[str, Any]):
    """The tokenizer a checkpoint was trained with (stored inside it, else beside it; for a
    Hugging Face directory, the tokenizer files in it)."""
    from scratchgpt.tokenizers import load_tokenizer, tokenizer_from_dict

    if "hf_dir" in state:
        from scratchgpt.checkpoints.hf import hf_tokenizer

        return hf_tokenizer(state["hf_dir"])
    directory = Path(state["path"]).parent
    if "tokenizer" in state:
        return tokenizer_from_dict(state["tokenizer"], directory, where=state["path"])
    return load_tokenizer(directory)
