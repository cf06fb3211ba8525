"""Fixtures of the reliability suite: a tiny dataset and run, and the figures the suite
records (``docs/RELIABILITY.md`` quotes them).

Set ``SCRATCHGPT_RELIABILITY_REPORT=FILE.json`` to have the figures written to FILE.json at
the end of the session::

    SCRATCHGPT_RELIABILITY_REPORT=reliability.json python -m pytest tests/reliability
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.corpus import play_text

# A model small enough that a step, an evaluation and a checkpoint take milliseconds.
TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
        "--batch-size", "4", "--eval-iters", "1", "--dtype", "fp32", "--threads", "1",
        "--no-progress", "--warmup-iters", "1"]


class Figures:
    """Counts and tables the tests add to; written as JSON at the end of the session."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.exit_codes: dict[str, int] = {}
        self.notes: dict[str, Any] = {}

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] += n

    def to_dict(self) -> dict[str, Any]:
        codes = Counter(self.exit_codes.values())
        return {"counts": dict(sorted(self.counts.items())),
                "bad_inputs": {"tried": len(self.exit_codes),
                               "exit_codes": {str(k): v for k, v in sorted(codes.items())},
                               "each": dict(sorted(self.exit_codes.items()))},
                **self.notes}


_FIGURES = Figures()


@pytest.fixture(scope="session")
def figures() -> Figures:
    return _FIGURES


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    out = os.environ.get("SCRATCHGPT_RELIABILITY_REPORT")
    if out and (_FIGURES.counts or _FIGURES.exit_codes):
        Path(out).write_text(json.dumps(_FIGURES.to_dict(), indent=1) + "\n")


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """A character-level dataset of 40,000 characters of the generated play."""
    from scratchgpt.data.prepare import prepare_text

    out = tmp_path_factory.mktemp("reliability") / "play"
    prepare_text(play_text(40_000), out, "char", source="test")
    return out


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` (the lock file aside) and its bytes."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name != ".lock"}
