"""The numbers of seeded short runs are exactly those recorded before the last refactor
(``runs.py`` says what is recorded and how to record it anew)."""

import json
from pathlib import Path

import pytest
import torch

from tests.golden import runs

GOLDEN = json.loads((Path(__file__).parent / "golden.json").read_text())


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    from scratchgpt.data.prepare import prepare_text

    path = tmp_path_factory.mktemp("golden") / "data"
    prepare_text(runs.corpus(), path, "char", source="golden")
    return path


@pytest.mark.parametrize("name", list(runs.LM_RUNS))
def test_language_model_run_is_unchanged(name, data_dir, tmp_path):
    torch.set_num_threads(1)
    assert runs.lm_run(name, data_dir, tmp_path / name) == GOLDEN[name]


@pytest.mark.parametrize("arch", ["transformer", "lstm-attention"])
def test_seq2seq_run_is_unchanged(arch):
    torch.set_num_threads(1)
    assert runs.seq2seq_run(arch) == GOLDEN[f"seq2seq-{arch}"]
