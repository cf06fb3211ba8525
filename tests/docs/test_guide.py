"""The learner's documents point at things that exist: every file a link names is there, every
test a link names is defined in the file it links to, and every command given (there, and in the
notebooks' text) parses with the CLI as it is. So a renamed module, test or flag breaks this
test, not a reader's afternoon."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import nbformat
import pytest

from scratchgpt.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CHECKED = [DOCS / "GUIDE.md", DOCS / "experiment_gpt_build.md"]
LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
INLINE_COMMAND = re.compile(r"`(scratchgpt [^`]+)`")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)


def commands(text: str) -> list[str]:
    """Commands in inline code, and lines of fenced blocks that start with one."""
    fenced = [line for block in FENCE.findall(text) for line in block.splitlines()
              if line.startswith("scratchgpt ")]
    return INLINE_COMMAND.findall(FENCE.sub("", text)) + fenced


def links(path: Path) -> list[tuple[str, Path]]:
    return [(text, (path.parent / target.split("#")[0]).resolve())
            for text, target in LINK.findall(path.read_text())
            if not target.startswith(("http://", "https://"))]


@pytest.mark.parametrize("doc", CHECKED, ids=lambda p: p.name)
def test_every_linked_file_and_test_exists(doc):
    found = links(doc)
    assert found, f"{doc.name} links to nothing"
    for text, target in found:
        assert target.exists(), f"{doc.name}: [{text}] -> {target} does not exist"
        if re.fullmatch(r"test_\w+", text):
            assert re.search(rf"^\s*def {text}\(", target.read_text(), re.M), \
                f"{doc.name}: {text} is not a test in {target.name}"


@pytest.mark.parametrize("doc", CHECKED, ids=lambda p: p.name)
def test_every_command_parses(doc):
    given = commands(doc.read_text())
    assert given, f"{doc.name} gives no command"
    parser = build_parser()
    for command in given:
        argv = shlex.split(command, comments=True)[1:]
        try:
            parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{doc.name}: `{command}` does not parse")


@pytest.mark.parametrize("path", sorted((DOCS / "notebooks").glob("*.ipynb")),
                         ids=lambda p: p.stem)
def test_every_command_a_notebook_gives_parses(path):
    nb = nbformat.read(path, as_version=4)
    text = "\n\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    parser = build_parser()
    for command in commands(text):
        try:
            parser.parse_args(shlex.split(command, comments=True)[1:])
        except SystemExit:
            pytest.fail(f"{path.name}: `{command}` does not parse")


def test_the_guide_names_a_test_for_every_concept():
    text = (DOCS / "GUIDE.md").read_text()
    concepts = re.split(r"\n\*\*", text)[1:]  # each concept starts with a bold name
    assert len(concepts) >= 20
    for block in concepts:
        name = block.split("**")[0]
        assert "* Run:" in block and "* Read:" in block and "* Proof:" in block, name
        assert any(re.fullmatch(r"test_\w+", t) for t, _ in LINK.findall(block)), name


def test_readme_points_learners_to_the_guide_and_notebooks():
    readme = (ROOT / "README.md").read_text()
    assert "docs/GUIDE.md" in readme and "docs/notebooks" in readme
    notebooks = sorted(p.name for p in (DOCS / "notebooks").glob("*.ipynb"))
    guide = (DOCS / "GUIDE.md").read_text()
    assert len(notebooks) == 5 and all(name in guide for name in notebooks)


def test_the_gpt_build_token_counts_are_steps_times_windows():
    """experiment_gpt_build.md's tokens for the scaled stage are its steps x the experiment's
    batch x stage 8's context (as the experiment's CSV counts them), and the lecture's are
    5,000 steps of 64 x 256."""
    from scratchgpt.experiments.gpt_build import SCALED, BuildSetup

    text = " ".join((DOCS / "experiment_gpt_build.md").read_text().split())
    ours = re.search(r"managed ([\d,]+) steps, ([\d.]+) million tokens", text)
    assert ours, "experiment_gpt_build.md no longer gives the scaled stage's tokens"
    setup = BuildSetup()
    tokens = int(ours[1].replace(",", "")) * setup.batch_size * SCALED[setup.scaled]["block_size"]
    assert f"{tokens / 1e6:.{len(ours[2].split('.')[1])}f}" == ours[2]
    lecture = re.search(r"batch (\d+) x (\d+) characters, ([\d,]+) steps: (\d+) million", text)
    assert lecture, "experiment_gpt_build.md no longer gives the lecture's tokens"
    batch, context, steps = (int(g.replace(",", "")) for g in lecture.groups()[:3])
    assert round(batch * context * steps / 1e6) == int(lecture[4])
