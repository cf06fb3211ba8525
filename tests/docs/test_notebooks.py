"""The notebooks in docs/notebooks run from top to bottom against the package as it is, in
seconds each, offline; and they are stored without outputs (what a reader sees comes from
running them).

A notebook that trains keeps its budgets in one cell tagged ``parameters`` (papermill's
convention); the test runs it with a cell of tiny budgets inserted after that one, so that
every cell runs, on models trained for a few steps only."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "docs" / "notebooks").glob("*.ipynb"))
# What the tests run instead of each notebook's own budgets.
TINY = {
    "01_bigram_to_gpt": {"steps_per_stage": 6},
    "03_sampling": {"steps": 10},
    "04_lstm_memory": {"memory_steps": 10, "count_steps": 10},
    "05_speculative_sampling": {"steps": 10},
}

# What a notebook's outputs must show, whatever its budgets: the lecture's losses beside
# another text are labelled as Tiny Shakespeare's (notebook 01 trains on Python source, and
# its table headed them plain 'lecture', a bigram's 4.50 read beside 2.49 as a target missed,
# where the command's own report labels them).
SHOWN = {"01_bigram_to_gpt": ["| lecture (Tiny Shakespeare) |"]}


def output_text(nb: nbformat.NotebookNode) -> str:
    """Every text a notebook's code cells showed: printed, and each result's text forms."""
    parts = []
    for cell in nb.cells:
        for o in cell.get("outputs", []) if cell.cell_type == "code" else []:
            parts.append(o.get("text", ""))
            parts += [v for k, v in o.get("data", {}).items() if k.startswith("text/")]
    return "\n".join(parts)


def with_tiny_budgets(nb: nbformat.NotebookNode, name: str) -> nbformat.NotebookNode:
    """``nb`` with a cell setting the names of ``TINY[name]`` after its parameters cell, which
    must assign every one of them (so a renamed budget cannot silently go untested)."""
    tiny = TINY.get(name, {})
    tagged = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == (1 if tiny else 0), f"{name}: expected one parameters cell"
    if tiny:
        index = tagged[0]
        for variable in tiny:
            assert re.search(rf"^{variable} = ", nb.cells[index].source, re.M), \
                f"{name}: its parameters cell does not set {variable}"
        lines = "\n".join(f"{k} = {v!r}" for k, v in tiny.items())
        nb.cells.insert(index + 1, nbformat.v4.new_code_cell(lines))
    return nb


def test_there_are_notebooks():
    assert [p.stem[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04", "05"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, \
                f"{path.name}: clear its outputs before committing (Jupyter: Clear All Outputs)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path, monkeypatch):
    # The kernel inherits this environment: one thread (tiny models), its temporary files
    # under pytest's, and (from conftest) a cache directory of its own. The kernel "python3"
    # is this Python's own ipykernel: no kernel the user installed elsewhere is looked up.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter"))
    monkeypatch.delenv("JUPYTER_PATH", raising=False)
    nb = with_tiny_budgets(nbformat.read(path, as_version=4), path.stem)
    client = NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError, with the cell and its traceback, on failure
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert not errors
    shown = output_text(nb)
    # (tqdm.auto's warning in a notebook without ipywidgets, once shown at every import)
    assert "IProgress not found" not in shown
    for expected in SHOWN.get(path.stem, []):
        assert expected in shown, f"{path.name}: its outputs do not show {expected!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_file_a_notebook_names_exists(path):
    """`scratchgpt/models/rnn.py`, `tests/...`, `docs/...`: a file the text sends the reader
    to is there (under src/ for the package); a bare name such as `count.py` is beside a file
    named before it."""
    nb = nbformat.read(path, as_version=4)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    named = re.findall(r"`([\w/.-]+\.(?:py|c|md))`", text)
    folders: list[Path] = []
    for name in named:
        if "/" in name:
            found = [p for p in (ROOT / name, ROOT / "src" / name) if p.is_file()]
            assert found, f"{path.name} names {name}, which is not there"
            folders.append(found[0].parent)
        else:
            assert any((f / name).is_file() for f in folders), \
                f"{path.name} names {name}, beside none of the files it names before it"
