"""Fixtures of the commands' tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from scratchgpt.cli import main
from tests.commands.test_cli import TINY


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, small_dataset) -> Path:
    """A tiny GPT run (30 steps, evaluated at 15 and 30), trained once per test module."""
    out = tmp_path_factory.mktemp("runs") / "tiny"
    assert main(["train", "--dataset", str(small_dataset), "--out", str(out), "--max-iters", "30",
                 "--eval-interval", "15", *TINY]) == 0
    return out
