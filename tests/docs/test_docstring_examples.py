"""Every ``>>>`` example in the package's docstrings runs and shows what it returns.

Some modules' own tests run their examples too; this one finds every module that has any, so
an example in a module without such a test cannot drift from what the code does.
"""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

import scratchgpt

PACKAGE = Path(scratchgpt.__file__).parent


def modules_with_examples() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if ">>>" in path.read_text(encoding="utf-8"):
            parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


MODULES = modules_with_examples()


def test_examples_are_found():
    assert "scratchgpt.models" in MODULES and "scratchgpt.experiments.gpt_build" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.failed == 0
