"""The examples in the tokenizer modules' docstrings run and show what they return."""

from __future__ import annotations

import doctest

import pytest

from scratchgpt.tokenizers import (
    bpe,
    bpe_algorithm,
    bpe_files,
    pretokenize,
    tiktoken_backend,
    unicode_tables,
)

MODULES = [bpe, bpe_algorithm, bpe_files, pretokenize, tiktoken_backend, unicode_tables]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_docstring_examples(module):
    result = doctest.testmod(module)
    assert result.attempted > 0
    assert result.failed == 0
