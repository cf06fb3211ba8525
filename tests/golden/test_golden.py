"""The numbers of seeded short runs are exactly those recorded before the last refactor, on a
machine of the same kind of CPU kernels (``runs.py`` says what is recorded and how to record
it anew)."""

import json

import pytest
import torch

from tests.golden import runs

RECORDED = json.loads(runs.GOLDEN_FILE.read_text())
GOLDEN = RECORDED.get(runs.capability())
pytestmark = pytest.mark.skipif(
    GOLDEN is None, reason=f"no golden numbers for {runs.capability()} kernels (recorded: "
    f"{', '.join(RECORDED)}); see tests/golden/runs.py to add them")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    from scratchgpt.data.prepare import prepare_text

    path = tmp_path_factory.mktemp("golden") / "data"
    prepare_text(runs.corpus(), path, "char", source="golden")
    return path


@pytest.mark.parametrize("name", list(runs.LM_RUNS))
def test_language_model_run_is_unchanged(name, data_dir, tmp_path):
    if name not in GOLDEN:  # an intended change of numbers not yet recorded on this kind
        pytest.skip(f"{name}: no golden numbers for {runs.capability()} kernels")
    torch.set_num_threads(1)
    got = runs.lm_run(name, data_dir, tmp_path / name)
    # every number recorded (runs.py: a kind may lack one an intended change has moved)
    assert "weights" in GOLDEN[name] and {k: got[k] for k in GOLDEN[name]} == GOLDEN[name]


@pytest.mark.parametrize("arch", ["transformer", "lstm-attention"])
def test_seq2seq_run_is_unchanged(arch):
    torch.set_num_threads(1)
    assert runs.seq2seq_run(arch) == GOLDEN[f"seq2seq-{arch}"]
