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


READ = re.compile(r"^\* Read:(.*?)(?=^\* Proof:)", re.M | re.S)
NAME = re.compile(r"`([A-Za-z_][\w.]*)`")


def defines(source: str, name: str) -> bool:
    """Whether ``source`` (Python or C) defines ``name``: a def or class, a module-level
    assignment, or a C function; ``Class.method`` needs both."""
    *owner, last = name.split(".")
    if owner and not re.search(rf"^class {owner[-1]}\b", source, re.M):
        return False
    python = rf"^\s*(?:async\s+)?(?:def|class)\s+{last}\b|^{last}\s*(?::|=)"
    c_function = rf"^[A-Za-z_][\w \*]*\b{last}\s*\("
    return bool(re.search(f"{python}|{c_function}", source, re.M))


def test_every_name_a_read_line_gives_is_defined_in_a_file_it_links():
    """`Block.forward` in [models/gpt.py]: a name to read must be found where the line sends
    the reader, so a renamed class or function cannot leave the guide pointing at nothing."""
    guide = DOCS / "GUIDE.md"
    blocks = READ.findall(guide.read_text())
    named = [(name, block) for block in blocks for name in NAME.findall(block)]
    assert len(named) >= 20, "the guide's Read lines no longer name what to read"
    for name, block in named:
        sources = [(guide.parent / target.split("#")[0]).resolve()
                   for _, target in LINK.findall(block)]
        code = [p.read_text() for p in sources if p.suffix in (".py", ".c", ".h")]
        assert any(defines(source, name) for source in code), \
            f"GUIDE.md: `{name}` is defined in none of {[p.name for p in sources]}"


def test_every_python_script_the_guide_runs_exists():
    scripts = re.findall(r"`python ([\w/.-]+\.py)\b", (DOCS / "GUIDE.md").read_text())
    assert scripts, "the guide runs no Python script"
    for script in scripts:
        assert (ROOT / script).is_file(), f"GUIDE.md runs python {script}, which is not there"


def test_the_feed_forward_command_is_the_experiments_stage_4():
    """The guide's one-command feed-forward run trains what the gpt-build experiment's stage 4
    trains (the model and every training setting but the evaluation's cadence), so a learner
    who runs it alone sees the stage the experiment reports."""
    from scratchgpt.experiments.gpt_build import BuildSetup, stages, train_command

    text = (DOCS / "GUIDE.md").read_text()
    given = [c for c in commands(text) if "--out runs/feed-forward" in c]
    assert len(given) == 1, "the guide no longer gives the feed-forward run"
    parser = build_parser()
    guide = vars(parser.parse_args(shlex.split(given[0])[1:]))
    guide["model"] = guide["model"] or "gpt"  # train's default model
    setup = BuildSetup(time_budget=guide["time_budget"], max_iters=guide["max_iters"])
    stage = next(s for s in stages(setup) if s.key == "feed-forward")
    experiment = vars(parser.parse_args(train_command(stage, setup, "shakespeare",
                                                      "runs/feed-forward")))
    cadence = {"eval_interval", "eval_iters", "log_interval"}
    differ = {k for k in guide.keys() | experiment.keys()
              if k not in cadence and guide.get(k) != experiment.get(k)}
    assert not differ, {k: (guide.get(k), experiment.get(k)) for k in differ}


def test_every_section_the_guide_sends_to_is_a_heading_there():
    """`the tables in [BENCHMARKS.md](BENCHMARKS.md) ("A tokenizer for 90 s")`: each quoted
    section must begin a heading of the linked document, so renaming one there is caught."""
    text = " ".join((DOCS / "GUIDE.md").read_text().split())
    pointers = re.findall(r"\]\(([\w.-]+\.md)\) \(([^)]*\"[^)]*)\)", text)
    assert pointers, "the guide sends the reader to no section of another document"
    for doc, titles in pointers:
        headings = re.findall(r"^#+ (.*)$", (DOCS / doc).read_text(), re.M)
        for title in re.findall(r"\"([^\"]+)\"", titles):
            assert any(h.startswith(title) for h in headings), \
                f"GUIDE.md: no section of {doc} begins {title!r}"


def test_no_two_train_commands_of_the_guide_write_one_run():
    """A learner who runs the guide's commands in turn meets no refusal of a run directory
    already there: each `train` writes its own --out (runs/<dataset name> without one), unless
    it continues or replaces that run on purpose (--resume, --overwrite)."""
    from scratchgpt.data.resolve import dataset_name

    parser = build_parser()
    written: dict[str, str] = {}
    for command in commands((DOCS / "GUIDE.md").read_text()):
        args = parser.parse_args(shlex.split(command, comments=True)[1:])
        if args.command != "train" or args.resume or args.overwrite:
            continue
        out = str(Path(args.out or Path("runs") / dataset_name(args.dataset)))
        assert out not in written, \
            f"GUIDE.md: `{command}` writes {out}, as `{written[out]}` did before"
        written[out] = command
    assert len(written) >= 5, "the guide gives too few train commands to check"


# The training a model needs on seq2seq's reverse task (strings of 10-60 letters backwards):
# bench_seq2seq.md's attention LSTM reached 99% in 9 minutes, while at 3 minutes a model the
# best of the three was 16% exact.
REVERSE_NEEDS_S = 9 * 60


def test_every_reverse_run_the_guide_gives_trains_as_long_as_the_task_needs():
    """A `--task reverse` run the guide gives (seq2seq train, or bench seq2seq) has the budget
    the task was measured to need: the guide's 2-minute transformer run ended at 0% exact on
    every length, which showed a learner nothing of what the section was about."""
    from scratchgpt.training.config import parse_duration

    parser = build_parser()
    runs = []
    for command in commands((DOCS / "GUIDE.md").read_text()):
        argv = shlex.split(command, comments=True)[1:]
        if argv[:2] in (["seq2seq", "train"], ["bench", "seq2seq"]):
            runs.append((command, parser.parse_args(argv)))
    assert any(args.task == "reverse" for _, args in runs), "the guide gives no reverse run"
    for command, args in runs:
        if args.task == "reverse":
            budget = getattr(args, "budget", None) or args.time_budget
            assert budget and parse_duration(budget) >= REVERSE_NEEDS_S, \
                f"GUIDE.md: `{command}` trains for less than the reverse task needs"


def test_the_line_the_guide_reads_a_runs_val_loss_from_gives_it(small_dataset, tmp_path, capsys):
    """The guide sends a reader to the line of `train`'s output that gives the val loss and
    the bits per character: it said the last line, which names the run's files, so a reader
    looked for figures where there are none."""
    from scratchgpt.cli import main
    from tests.commands.test_cli import TINY

    named = set(re.findall(r"`train`'s `([^`]+)`\s+line|each run's\s+`([^`]+)`\s+line",
                           (DOCS / "GUIDE.md").read_text()))
    prefixes = {p for pair in named for p in pair if p}
    assert prefixes, "the guide no longer says which line of train's output to read"
    assert main(["train", "--dataset", str(small_dataset), "--out", str(tmp_path / "run"),
                 "--max-iters", "2", "--eval-interval", "2", *TINY]) == 0
    lines = capsys.readouterr().out.splitlines()
    for prefix in prefixes:
        line = next((x for x in lines if x.startswith(prefix)), None)
        assert line is not None, f"train printed no line starting {prefix!r}"
        assert re.search(r"val loss [\d.]+ .*[\d.]+ bits/char", line), line
