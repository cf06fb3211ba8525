"""Shared fixtures: the Tiny Shakespeare corpus most tests run on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
CORPUS = "tinyshakespeare.txt"


def find_corpus(name: str = CORPUS) -> Path | None:
    """``$SCRATCHGPT_DATA_DIR/name``, else ``<repo>/../shared/corpora/name``; None if neither."""
    candidates = []
    if os.environ.get("SCRATCHGPT_DATA_DIR"):
        candidates.append(Path(os.environ["SCRATCHGPT_DATA_DIR"]) / name)
    candidates.append(REPO_ROOT.parent / "shared" / "corpora" / name)
    return next((p for p in candidates if p.is_file()), None)


@pytest.fixture(scope="session")
def shakespeare_text() -> str:
    """The whole of Tiny Shakespeare. Missing data fails the test: it is not optional."""
    path = find_corpus()
    if path is None:
        pytest.fail(f"{CORPUS} not found: set SCRATCHGPT_DATA_DIR to a directory holding it "
                    f"(looked in $SCRATCHGPT_DATA_DIR and {REPO_ROOT.parent / 'shared/corpora'})")
    return path.read_text(encoding="utf-8")
