"""Shared test setup."""

import importlib.util

import pytest
import torch

# Small tensors: one thread is faster than two fighting over a shared CPU.
torch.set_num_threads(1)


@pytest.fixture
def cli_main(monkeypatch):
    """``scratchgpt.cli.main`` restricted to the command modules present in this checkout."""
    from scratchgpt import cli

    present = tuple(m for m in cli.COMMAND_MODULES
                    if importlib.util.find_spec(f"scratchgpt.commands.{m}") is not None)
    monkeypatch.setattr(cli, "COMMAND_MODULES", present)
    return cli.main
