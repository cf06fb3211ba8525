"""Shared fixtures: the Tiny Shakespeare text and a small prepared dataset built from it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

# Test tensors are small: one thread is faster than two, and far faster on a shared CPU.
torch.set_num_threads(1)


def _data_dir() -> Path:
    env = os.environ.get("SCRATCHGPT_DATA_DIR")
    return Path(env) if env else REPO.parent / "shared" / "corpora"


@pytest.fixture(scope="session")
def shakespeare_path() -> Path:
    path = _data_dir() / "tinyshakespeare.txt"
    if not path.is_file():
        pytest.fail(f"Tiny Shakespeare not found at {path}; set SCRATCHGPT_DATA_DIR")
    return path


@pytest.fixture(scope="session")
def shakespeare_text(shakespeare_path: Path) -> str:
    return shakespeare_path.read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory, shakespeare_text: str) -> Path:
    """The first 200k characters of Tiny Shakespeare, char-tokenized."""
    from scratchgpt.data.prepare import prepare_text

    out = tmp_path_factory.mktemp("data") / "shakespeare-small"
    prepare_text(shakespeare_text[:200_000], out, "char", source="test")
    return out


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch, tmp_path_factory):
    """Never touch the user's cache; keep tests single-threaded-deterministic enough."""
    monkeypatch.setenv("SCRATCHGPT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    monkeypatch.setenv("SCRATCHGPT_DATA_DIR", str(_data_dir()))
    torch.manual_seed(0)


@pytest.fixture
def cli_main():
    """The CLI entry point, ``scratchgpt.cli.main``."""
    from scratchgpt.cli import main

    return main
