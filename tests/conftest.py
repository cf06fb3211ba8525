"""Shared test setup."""

import importlib.util
from contextlib import contextmanager

import pytest
import torch

# Small tensors: one thread is faster than two fighting over a shared CPU.
torch.set_num_threads(1)


def _present(package: str, names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(n for n in names if importlib.util.find_spec(f"{package}.{n}") is not None)


@contextmanager
def present_commands_only():
    """Restrict the CLI to the command and bench modules that exist in this checkout (other
    branches add theirs in parallel)."""
    from scratchgpt import cli
    from scratchgpt.commands import bench

    saved = cli.COMMAND_MODULES, bench.BENCHMARKS
    cli.COMMAND_MODULES = _present("scratchgpt.commands", saved[0])
    bench.BENCHMARKS = _present("scratchgpt.bench", saved[1])
    try:
        yield cli.main
    finally:
        cli.COMMAND_MODULES, bench.BENCHMARKS = saved


@pytest.fixture
def cli_main():
    """``scratchgpt.cli.main`` over the commands present in this checkout."""
    with present_commands_only() as main:
        yield main
