"""A named dataset made by a test: its pinned file in a folder that ``$SCRATCHGPT_DATA_DIR``
names, so ``--dataset NAME`` finds it without a network."""

from __future__ import annotations

import hashlib
from pathlib import Path

from scratchgpt.data import sources


def fake_named_dataset(monkeypatch, folder: Path, name: str, text: str) -> Path:
    """Register named dataset ``name`` holding ``text`` (char-level by default), its file
    written into ``folder``, which ``$SCRATCHGPT_DATA_DIR`` is set to. Returns the file."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.txt"
    path.write_text(text, encoding="utf-8")
    monkeypatch.setitem(sources.DATASETS, name, sources.NamedDataset(
        name=name, filename=path.name, url=f"https://example.invalid/{path.name}",
        sha256=hashlib.sha256(path.read_bytes()).hexdigest(), description="made by a test"))
    monkeypatch.setattr(sources, "DATASET_NAMES", (*sources.DATASET_NAMES, name))
    monkeypatch.setenv("SCRATCHGPT_DATA_DIR", str(folder))
    return path
