"""Flags every benchmark shares: nonsense values are one line before any work."""

from __future__ import annotations

import pytest

from scratchgpt.commands.bench import BENCHMARKS
from tests.cli_errors import error_of

THREADED = [name for name in BENCHMARKS if name not in ("train", "tokenize")]


@pytest.mark.parametrize("name", THREADED)
def test_a_negative_thread_count_is_refused(name, capsys):
    """torch.set_num_threads(-1) raised a RuntimeError traceback (or -1 passed unnoticed)."""
    assert "--threads" in error_of(capsys, ["bench", name, "--threads", "-1"])
