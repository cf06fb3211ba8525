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


@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_bench_option_with_a_default_states_it(name):
    """A number's or a word's default is in the option's help, said as the default: bench
    train's --variants, seq2seq's --n-train, generate's --batch, decode-step's --dtype,
    --variants and --tokens, and finetune's --out ran with one their help did not give."""
    import argparse
    import re

    mod = importlib.import_module(f"scratchgpt.bench.{name.replace('-', '_')}")
    parser = argparse.ArgumentParser()
    mod.add_arguments(parser)
    unstated = []
    for action in parser._actions:
        value, text = action.default, action.help or ""
        if isinstance(value, bool) or not isinstance(value, (int, float, str)) or \
                value == argparse.SUPPRESS:
            continue
        forms = {str(value), f"{value:,}" if isinstance(value, int) else str(value)}
        if isinstance(value, float):  # as written in the help: 2e-3 for 0.002
            forms |= {w for w in re.findall(r"[\d.]+e-?\d+|[\d.]+", text) if float(w) == value}
        said = any(f"default {f}" in text or f"default: {f}" in text or f"({f}" in text
                   or f"{f} (default)" in text for f in forms)
        if not said and "default all" not in text:  # (a list of every choice)
            unstated.append(action.option_strings[0])
    assert unstated == []
