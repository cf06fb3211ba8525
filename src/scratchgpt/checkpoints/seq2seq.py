"""Seq2seq checkpoints: one directory holding ``seq2seq.pt`` (weights, model config, both
tokenizers and how the data was made) plus a human-readable ``seq2seq.json`` copy of everything
but the weights. Files are written to a temporary name and then ``os.replace``-d, so a crash
mid-save never leaves a half-written checkpoint."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from scratchgpt.data.translation import Seq2SeqTokenizer
from scratchgpt.errors import CheckpointError
from scratchgpt.models.seq2seq import Seq2Seq, Seq2SeqConfig, build_seq2seq

WEIGHTS_FILE = "seq2seq.pt"
INFO_FILE = "seq2seq.json"


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def save_seq2seq(
    directory: str | Path, model: Seq2Seq, src_tok: Seq2SeqTokenizer,
    tgt_tok: Seq2SeqTokenizer, meta: dict[str, Any] | None = None,
) -> Path:
    """Write the checkpoint into ``directory`` (created if needed); returns the weights path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    info = {
        "model_config": model.config.to_dict(),
        "src_tokenizer": src_tok.state(),
        "tgt_tokenizer": tgt_tok.state(),
        "meta": meta or {},
    }
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    _atomic_write(directory / WEIGHTS_FILE, lambda p: torch.save({**info, "state_dict": state}, p))
    _atomic_write(directory / INFO_FILE,
                  lambda p: p.write_text(json.dumps(info, indent=1, ensure_ascii=False)))
    return directory / WEIGHTS_FILE


def load_seq2seq(
    directory: str | Path, device: str | torch.device = "cpu"
) -> tuple[Seq2Seq, Seq2SeqTokenizer, Seq2SeqTokenizer, dict[str, Any]]:
    """-> (model in eval mode, source tokenizer, target tokenizer, meta)."""
    path = Path(directory) / WEIGHTS_FILE
    if not path.is_file():
        raise CheckpointError(f"no seq2seq checkpoint: {path} does not exist")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)
    except Exception as e:  # torch raises several unpickling/zip error types for a bad file
        raise CheckpointError(
            f"{path} is not a valid seq2seq checkpoint ({type(e).__name__})") from None
    try:
        config = Seq2SeqConfig(**ckpt["model_config"])
        src_tok = Seq2SeqTokenizer.from_dict(ckpt["src_tokenizer"])
        tgt_tok = Seq2SeqTokenizer.from_dict(ckpt["tgt_tokenizer"])
        model = build_seq2seq(config)
        model.load_state_dict(ckpt["state_dict"])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{path} is not a valid seq2seq checkpoint ({e})") from None
    return model.to(device).eval(), src_tok, tgt_tok, ckpt.get("meta", {})
