"""A benchmark's --help shows its description as written: its example commands one a line,
as the module's docstring has them."""

from __future__ import annotations

import importlib

import pytest

from scratchgpt.cli import main
from scratchgpt.commands.bench import BENCHMARKS


@pytest.mark.parametrize("name", BENCHMARKS)
def test_bench_help_keeps_each_example_command_on_its_own_line(name, capsys):
    """decode-step's two examples ran on as one line ('... --threads 1 scratchgpt bench
    decode-step --n-layer 12 ...'), which nobody could paste."""
    doc = importlib.import_module(f"scratchgpt.bench.{name.replace('-', '_')}").__doc__
    examples = [line.strip() for line in doc.splitlines()
                if line.strip().startswith(("scratchgpt ", "python "))]
    with pytest.raises(SystemExit) as stop:
        main(["bench", name, "--help"])
    assert stop.value.code == 0
    shown = [line.strip() for line in capsys.readouterr().out.splitlines()]
    assert all(e.replace("``", "") in shown for e in examples)


def test_some_benchmark_has_example_commands():
    """(The test above checks something: decode-step's help has two.)"""
    doc = importlib.import_module("scratchgpt.bench.decode_step").__doc__
    assert sum(line.strip().startswith("scratchgpt bench") for line in doc.splitlines()) == 2


COMMANDS = ("train", "sample", "serve", "finetune", "prepare", "eval", "chat")


@pytest.mark.parametrize("name", BENCHMARKS)
def test_bench_help_names_only_values_its_own_flags_take(name):
    """A value written after one of the benchmark's own flags that has choices is one of
    them, unless another command's flag is meant ('sample --dtype'): bench recurrent's help
    said '--cells torch' and '--cells scratch', where its --cells takes rnn, lstm or gru (the
    words were train's --cells)."""
    import argparse
    import re

    mod = importlib.import_module(f"scratchgpt.bench.{name.replace('-', '_')}")
    parser = argparse.ArgumentParser()
    mod.add_arguments(parser)
    choices = {flag: a.choices for a in parser._actions if a.choices for flag in a.option_strings}
    doc = mod.__doc__.replace("``", "")
    wrong = [m.group(0) for m in re.finditer(r"(\S+ )?(--[\w-]+) (\w[\w.-]*)", doc)
             if m.group(2) in choices and m.group(3) not in choices[m.group(2)]
             and (m.group(1) or "").strip(" (") not in COMMANDS]
    assert wrong == []
