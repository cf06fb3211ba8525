"""LoRA adapters as files of their own, and merging them into their base.

A LoRA run's checkpoints hold the whole model (so that it resumes exactly). When it finishes,
``adapter.pt`` is written beside them: only the parameters that trained (LoRA's ``A`` and
``B``, and a classifier's head), the model's config, the run's data record, and the identity
of the base (the sha256 of its weights, ``finetune/base.py``). A few hundred kilobytes instead
of the whole model.

Every command that reads a checkpoint reads an adapter too (``load_checkpoint``): the base
named in the adapter is loaded, its identity checked, and the adapter's tensors laid over it.
Any other base is refused. :func:`merge_run` folds the adapters into the weights and writes a
plain model (``gpt``, or a ``gpt-classifier`` without adapters), which ``convert --to hf``
exports.
"""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path
from typing import Any

import torch

from scratchgpt.checkpoints.io import (
    ADAPTER_FORMAT,
    Checkpoint,
    atomic_write,
    load_checkpoint,
    model_from_checkpoint,
    read_torch_file,
)
from scratchgpt.errors import CheckpointError
from scratchgpt.finetune.base import (
    Base,
    check_out_is_not_the_base,
    load_base,
    map_base_state,
)
from scratchgpt.models import build_model, config_dict, model_config
from scratchgpt.models.classifier import GPTClassifierConfig
from scratchgpt.models.lora import GPTLoRAConfig

ADAPTER_FILE = "adapter.pt"
ADAPTER_VERSION = 1


def trainable_names(config: Any) -> set[str]:
    """Names of the parameters a model of ``config`` trains."""
    return {name for name, p in build_model(config).named_parameters() if p.requires_grad}


def adapter_dict(checkpoint: Checkpoint) -> dict[str, Any]:
    """The adapter of a LoRA checkpoint as plain data (see the module docstring)."""
    base = checkpoint.data.get("base")
    if base is None:
        raise CheckpointError(f"{checkpoint.path} does not record the base it was fine-tuned "
                              "from; it has no adapter")
    names = trainable_names(checkpoint.model_config)
    return {"format": ADAPTER_FORMAT, "version": ADAPTER_VERSION, "base": base,
            "model_type": checkpoint.model_type,
            "model_config": config_dict(checkpoint.model_config),
            "weights": {k: v for k, v in checkpoint.model.items() if k in names},
            "tokenizers": checkpoint.tokenizers, "data": checkpoint.data,
            "run_id": checkpoint.run_id}


def save_adapter(run: Path, which: str | None = None) -> Path:
    """Write ``adapter.pt`` into the run directory ``run`` from its ``best.pt`` (see
    :func:`~scratchgpt.checkpoints.io.resolve_checkpoint` for ``which``)."""
    adapter = adapter_dict(load_checkpoint(run, which))
    buf = io.BytesIO()
    torch.save(adapter, buf)
    path = Path(run) / ADAPTER_FILE
    atomic_write(path, lambda f: f.write(buf.getbuffer()))
    return path


def checkpoint_from_adapter(d: dict[str, Any], where: str,
                            base_source: str | None = None) -> Checkpoint:
    """The whole model an adapter describes: its base (``base_source``, or the one it names)
    with the adapter's tensors over it. A base with other weights is refused."""
    if d.get("version") != ADAPTER_VERSION:
        raise CheckpointError(f"{where}: adapter format version {d.get('version')}, this "
                              f"scratchgpt reads version {ADAPTER_VERSION}")
    try:
        config = model_config(d["model_type"], **dict(d["model_config"]))
        recorded, weights = dict(d["base"]), dict(d["weights"])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{where}: damaged adapter ({e})") from None
    base = _adapter_base(where, recorded, base_source)
    # the model is built, and the state's fit checked, by whoever loads this checkpoint
    state = {**map_base_state(base.state, d["model_type"]), **weights}
    return Checkpoint(d["model_type"], config, state, dict(d.get("tokenizers") or {}),
                      dict(d.get("data") or {}), str(d.get("run_id", "")), path=Path(where))


def _adapter_base(where: str, recorded: dict[str, Any], given: str | None) -> Base:
    """The base an adapter goes onto: ``given`` (``--init-from``), or the one it records,
    refused unless it has the weights the adapter was trained over. A refusal names the
    recorded base and, when it is another, the given one."""
    trained_over = recorded.get("source") or "(not recorded)"
    source = given or trained_over
    try:
        base = load_base(source, "--init-from" if given else None)
    except CheckpointError as e:
        if given:  # (the base that cannot be read is the one given, not the adapter's)
            raise CheckpointError(f"{e} (the base {where} was trained over is "
                                  f"{trained_over})") from None
        raise CheckpointError(f"{where} is an adapter over the base {source}, which cannot be "
                              f"read ({e}); if the base moved, fold the adapter into it where "
                              f"it is now: scratchgpt finetune --merge {where} --init-from "
                              "BASE --out DIR") from None
    if base.identity != recorded["identity"]:
        now = f"--init-from {source} has" if given else f"{source} now has"
        raise CheckpointError(f"{where} was trained over the base {trained_over} "
                              f"(weights sha256 {recorded['identity'][:12]}…), but {now} "
                              f"{base.identity[:12]}…; an adapter only fits its own base")
    return base


def load_adapter(path: str | Path, base_source: str | None = None) -> Checkpoint:
    """Read ``path`` (an ``adapter.pt``) and build the checkpoint it stands for."""
    d = read_torch_file(path, "adapter")
    if not isinstance(d, dict) or d.get("format") != ADAPTER_FORMAT:
        raise CheckpointError(f"{path} is not a scratchgpt adapter (adapter.pt)")
    return checkpoint_from_adapter(d, str(path), base_source)


def merged_config(config: Any, where: str = "this model") -> tuple[str, Any]:
    """(model type, config) of a model with its adapters folded in; ``where`` names the model
    in the error of one without adapters."""
    if isinstance(config, GPTLoRAConfig):
        return "gpt", config.gpt
    if isinstance(config, GPTClassifierConfig) and config.lora is not None:
        return "gpt-classifier", dataclasses.replace(config, train="all", lora=None)
    raise CheckpointError(f"{where} has no LoRA adapters to merge: only a run trained with "
                          "--lora (or its adapter.pt) has any")


def merge_run(source: str, out: str | Path, base: str | None = None,
              overwrite: bool = False) -> tuple[Path, str]:
    """Fold the adapters of ``source`` (a LoRA run, checkpoint or ``adapter.pt``; ``base``
    overrides the base an adapter names) into the weights: a run directory ``out`` holding
    the plain model as ``best.pt``, with the tokenizer. ``out`` is never the source, nor its
    base. Returns (the run directory, the merged model's type)."""
    from scratchgpt.checkpoints.rundir import write_model_run

    check_out_is_not_the_base(Path(out), source, "--merge")
    if base:
        check_out_is_not_the_base(Path(out), base, "--init-from")
    if base and Path(source).is_dir():  # a LoRA run: its adapter.pt goes onto ``base``
        source = str(Path(source) / ADAPTER_FILE)
    checkpoint = load_adapter(source, base) if base else load_checkpoint(source)
    kind, config = merged_config(checkpoint.model_config, source)
    recorded = (checkpoint.data.get("base") or {}).get("source")
    if recorded:  # the base the adapter names: replaced, the adapter would fit nothing
        check_out_is_not_the_base(Path(out), recorded, "the adapters' base")
    model = model_from_checkpoint(checkpoint)  # built, loaded, adapters merged
    merged = Checkpoint(kind, config, model.state_dict(), checkpoint.tokenizers,
                        {**checkpoint.data, "merged_from": str(checkpoint.path)},
                        checkpoint.run_id)
    tokenizer = checkpoint.tokenizer("text") if "text" in checkpoint.tokenizers else None
    return write_model_run(out, merged, tokenizer, overwrite), kind

