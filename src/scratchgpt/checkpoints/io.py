"""Checkpoints: one typed format for every model, written atomically, loaded with checks.

A checkpoint file (``last.pt``, ``best.pt``) holds a :class:`Checkpoint`: the model (type,
config, weights), its tokenizers, where its data came from, and, for a run that can resume,
the training settings, the optimizer and the :class:`~scratchgpt.training.state.TrainState`.
It is the one source of truth of a run; ``config.json`` beside it is a copy for people to read.

Every write goes to a temporary file in the same directory, is flushed to disk, and is then
renamed over the old file, so a crash or Ctrl-C at any moment leaves the previous good file
intact.
"""

from __future__ import annotations

import io
import os
import pickle
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import torch
from torch import Tensor, nn

from scratchgpt.errors import CheckpointError, ScratchGPTError

FORMAT = "scratchgpt-checkpoint"
ADAPTER_FORMAT = "scratchgpt-adapter"  # a LoRA adapter file (scratchgpt.finetune.adapter)
FORMAT_VERSION = 2  # version 1 files (before typed checkpoints) are read too
TEMP_SUFFIX = ".tmp"


def atomic_write(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    """Call ``write(file_object)`` on a temp file next to ``path``, fsync, then rename.

    The temporary file is named ``.<name>.<random>.tmp``: a process killed mid-write leaves
    only such a file, which :func:`remove_stale_temporaries` clears later."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    """:func:`atomic_write` of UTF-8 text."""
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def _fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_stale_temporaries(directory: Path) -> list[Path]:
    """Delete the temporary files a killed write left in ``directory``; returns them."""
    stale = [p for p in directory.glob(f".*{TEMP_SUFFIX}") if p.is_file()]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


@dataclass
class Checkpoint:
    """Everything a checkpoint file holds.

    ``tokenizers`` maps a role to a tokenizer's saved state: ``"text"`` for language models,
    ``"source"``/``"target"`` for seq2seq. ``data`` says where the run's data came from (e.g.
    ``{"dataset": "data/shakespeare"}``), so ``eval`` and ``--resume`` find it again. A run's
    checkpoints share its ``run_id``. ``path`` is where it was read from (not saved).
    """

    model_type: str
    model_config: Any  # the typed config of ``model_type`` (see scratchgpt.models)
    model: dict[str, Tensor]
    tokenizers: dict[str, dict[str, Any]] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    run_id: str = ""
    train_config: Any = None  # scratchgpt.training.config.TrainConfig, for runs that resume
    state: Any = None  # scratchgpt.training.state.TrainState
    optimizer: dict[str, Any] | None = None
    path: Path | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``torch.save`` (loadable with ``weights_only=True``)."""
        from scratchgpt.models import config_dict

        return {"format": FORMAT, "version": FORMAT_VERSION, "run_id": self.run_id,
                "model_type": self.model_type, "model_config": config_dict(self.model_config),
                "model": self.model, "tokenizers": self.tokenizers, "data": self.data,
                "train_config": None if self.train_config is None else self.train_config.to_dict(),
                "state": None if self.state is None else self.state.to_dict(),
                "optimizer": self.optimizer}

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str) -> Checkpoint:
        """Validate and type what a checkpoint file held (version 1 or 2)."""
        from scratchgpt.models import model_config
        from scratchgpt.training.config import TrainConfig
        from scratchgpt.training.state import TrainState

        if d.get("version") == 1:
            d = _from_version_1(d)
        if d.get("version") != FORMAT_VERSION:
            raise CheckpointError(f"{where} has checkpoint format version {d.get('version')}, "
                                  f"this scratchgpt reads versions 1 and {FORMAT_VERSION}")
        for key in ("model_type", "model_config", "model"):
            if key not in d:
                raise CheckpointError(f"{where} lacks {key!r}; it is damaged or from another "
                                      "program")
        try:
            config = model_config(d["model_type"], **dict(d["model_config"]))
            train = d.get("train_config")
            train = None if train is None else TrainConfig.from_dict(dict(train))
        except (ScratchGPTError, TypeError, ValueError) as e:
            raise CheckpointError(f"{where}: damaged or incompatible settings ({e})") from None
        state = d.get("state")
        return cls(d["model_type"], config, d["model"], dict(d.get("tokenizers") or {}),
                   dict(d.get("data") or {}), str(d.get("run_id", "")), train,
                   None if state is None else TrainState.from_dict(dict(state), where),
                   d.get("optimizer"), Path(where))

    def tokenizer(self, role: str = "text") -> Any:
        """The tokenizer saved under ``role`` (a language model's: ``"text"``); an older
        checkpoint without one uses the ``tokenizer.json`` beside the file."""
        from scratchgpt.tokenizers import load_tokenizer, tokenizer_from_dict

        directory = self.path.parent if self.path is not None else None
        if role in self.tokenizers:
            return tokenizer_from_dict(self.tokenizers[role], directory, where=str(self.path))
        if role == "text" and directory is not None:
            return load_tokenizer(directory)
        raise CheckpointError(f"{self.path}: holds no {role} tokenizer")


def _from_version_1(d: dict[str, Any]) -> dict[str, Any]:
    """A version-1 checkpoint (flat keys, one tokenizer, dataset path) as version 2."""
    train = dict(d["train_config"]) if d.get("train_config") else None
    if train is not None:
        train.pop("model", None)  # the model type lives with the model now
    rng = dict(d.get("rng") or {})
    if rng and "torch_per_rank" not in rng:
        rng["torch_per_rank"], rng["cuda_per_rank"] = [rng.get("torch")], [rng.get("cuda")]
    state = None
    if "step" in d:
        state = {"step": d["step"], "tokens": d.get("tokens", 0),
                 "elapsed_s": d.get("elapsed_s", 0.0),
                 "best_val_loss": d.get("best_val_loss", float("inf")),
                 "val_loss": d.get("val_loss"),
                 "rng": {k: rng[k] for k in ("batch", "torch_per_rank", "cuda_per_rank")
                         if k in rng}}
    return {**d, "version": FORMAT_VERSION, "train_config": train, "state": state,
            "tokenizers": {"text": d["tokenizer"]} if d.get("tokenizer") else {},
            "data": {"dataset": d["dataset"]} if d.get("dataset") else {}}


def save_checkpoint(path: str | Path, checkpoint: Checkpoint,
                    copies: Iterable[str | Path] = ()) -> None:
    """Atomically save ``checkpoint`` to ``path`` and to each of ``copies`` (serialized once,
    written in the order given)."""
    buf = io.BytesIO()
    torch.save(checkpoint.to_dict(), buf)
    for target in (*copies, path):
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


def load_checkpoint(path: str | Path, which: str = "best") -> Checkpoint:
    """Load and validate a checkpoint; every failure is a one-line :class:`CheckpointError`."""
    file = resolve_checkpoint(path, which)
    try:
        data = torch.load(file, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, OSError,
            ValueError) as e:
        reason = " ".join(str(e).split())[:160] if str(e) else type(e).__name__
        raise CheckpointError(f"{file} is not a readable checkpoint (truncated or corrupt?): "
                              f"{reason}") from None
    if isinstance(data, dict) and data.get("format") == ADAPTER_FORMAT:
        from scratchgpt.finetune.adapter import checkpoint_from_adapter

        return checkpoint_from_adapter(data, str(file))  # its base, with the adapter over it
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"{file} is not a scratchgpt checkpoint")
    return Checkpoint.from_dict(data, str(file))


@dataclass
class ModelSource:
    """Where a loaded model came from: a scratchgpt checkpoint, or a Hugging Face directory
    (``hf_dir``, no checkpoint). ``path`` is the file the weights were read from."""

    path: Path
    checkpoint: Checkpoint | None = None
    hf_dir: Path | None = None

    @property
    def model_type(self) -> str:
        """The registry name of the model (a Hugging Face GPT-2 is a ``gpt``)."""
        return self.checkpoint.model_type if self.checkpoint is not None else "gpt"

    def tokenizer(self) -> Any:
        """The tokenizer the model was trained with (for a Hugging Face directory, its
        tokenizer files)."""
        if self.checkpoint is not None:
            return self.checkpoint.tokenizer("text")
        from scratchgpt.checkpoints.hf import hf_tokenizer

        return hf_tokenizer(self.hf_dir)


def model_from_checkpoint(checkpoint: Checkpoint) -> nn.Module:
    """The model a checkpoint holds, with its weights (eval mode, CPU). LoRA adapters are
    merged into the weights they adapt (the same function, computed by plain layers)."""
    from scratchgpt.models import build_model
    from scratchgpt.models.lora import merge_lora

    model = build_model(checkpoint.model_config)
    try:
        model.load_state_dict(checkpoint.model)
    except RuntimeError as e:
        reason = " ".join(str(e).split())[:300]
        raise CheckpointError(f"{checkpoint.path}: weights do not fit the model: {reason}"
                              ) from None
    merge_lora(model)
    return model.eval()


def load_model(path: str | Path, which: str = "best") -> tuple[nn.Module, ModelSource]:
    """Rebuild the model saved in a checkpoint (eval mode, CPU): returns (model, source).

    ``path`` may also be a Hugging Face GPT-2 directory (config.json + model.safetensors or
    pytorch_model.bin), converted on the fly (see :mod:`scratchgpt.checkpoints.hf`), or
    ``hf:`` and a hub model id (``hf:gpt2``), downloaded once into the hub's cache
    (:mod:`scratchgpt.checkpoints.hub`)."""
    from scratchgpt.checkpoints.hf import is_hf_dir, load_hf
    from scratchgpt.checkpoints.hub import HF_PREFIX, download

    if str(path).startswith(HF_PREFIX):
        path = download(str(path)[len(HF_PREFIX):])
    if is_hf_dir(path):
        model, weights = load_hf(path)
        return model, ModelSource(weights, hf_dir=Path(path))
    checkpoint = load_checkpoint(path, which)
    return model_from_checkpoint(checkpoint), ModelSource(checkpoint.path, checkpoint)
