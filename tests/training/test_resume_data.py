"""A resumed run goes on with the data it was trained on: its dataset directory prepared again
in place (another text, or another split, with the same tokenizer) is refused unless named."""

from __future__ import annotations

import pytest

from scratchgpt.checkpoints import load_checkpoint
from scratchgpt.cli import main
from tests.cli_errors import error_of
from tests.corpus import play_text

TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
        "--batch-size", "4", "--eval-iters", "2", "--eval-interval", "2", "--no-progress",
        "--dtype", "fp32", "--threads", "1"]


def _prepare(tmp_path, text: str, data, *extra: str) -> None:
    source = tmp_path / "text.txt"
    source.write_text(text)
    assert main(["prepare", "--data", str(source), "--out", str(data), "--overwrite",
                 "--no-progress", *extra]) == 0


@pytest.fixture
def trained(tmp_path, capsys):
    """A run of 2 steps on DATA, prepared from the first 20,000 characters of the play."""
    text = play_text(40_000)
    data, run = tmp_path / "data", tmp_path / "run"
    _prepare(tmp_path, text[:20_000], data)
    assert main(["train", "--dataset", str(data), "--out", str(run), "--max-iters", "2",
                 *TINY]) == 0
    capsys.readouterr()
    return text, data, run


@pytest.mark.parametrize(("how", "what"), [
    ("text", "prepared again from another text"),
    ("split", "prepared again with another split (16,000 + 4,000 tokens; the run's "
              "18,000 + 2,000 tokens)"),
])
def test_a_resume_refuses_its_dataset_prepared_again(trained, tmp_path, capsys, how, what):
    text, data, run = trained
    if how == "text":  # (the same characters: the same char tokenizer)
        _prepare(tmp_path, text[20_000:], data)
    else:
        _prepare(tmp_path, text[:20_000], data, "--val-fraction", "0.2")
    capsys.readouterr()
    before = (run / "last.pt").read_bytes()
    line = error_of(capsys, ["train", "--out", str(run), "--resume", "--max-iters", "4"])
    assert what in line and f"pass --dataset {data}" in line, line
    assert (run / "last.pt").read_bytes() == before  # nothing trained, nothing lost
    # named, the new data is the run's from then on: a later resume goes on without it
    assert main(["train", "--out", str(run), "--resume", "--max-iters", "4", "--dataset",
                 str(data), "--no-progress"]) == 0
    assert main(["train", "--out", str(run), "--resume", "--max-iters", "6",
                 "--no-progress"]) == 0
    assert load_checkpoint(run / "last.pt").state.step == 6


def test_a_resume_takes_its_dataset_prepared_again_alike(trained, tmp_path):
    """The same text prepared again the same way is the run's data: no refusal."""
    text, data, run = trained
    _prepare(tmp_path, text[:20_000], data)
    assert main(["train", "--out", str(run), "--resume", "--max-iters", "4",
                 "--no-progress"]) == 0
    assert load_checkpoint(run / "last.pt").state.step == 4


def test_eval_says_when_the_runs_dataset_was_prepared_again(trained, tmp_path, capsys):
    """eval reads the run's dataset where it was trained; prepared again from another text,
    its figures are that text's, which a note on stderr says (not when --dataset names it)."""
    text, data, run = trained
    assert main(["eval", "--checkpoint", str(run), "--split", "val", "--json"]) == 0
    assert "note:" not in capsys.readouterr().err
    _prepare(tmp_path, text[20_000:], data)
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(run), "--split", "val", "--json"]) == 0
    err = capsys.readouterr().err
    assert f"note: {data} was prepared again from another text since the run" in err, err
    assert main(["eval", "--checkpoint", str(run), "--split", "val", "--json", "--dataset",
                 str(data)]) == 0
    assert "note:" not in capsys.readouterr().err
