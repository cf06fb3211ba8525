"""scratchgpt classify on a run trained with --max-length: texts are cut as the run cut its
own, so --eval on the run's test split reproduces the run's test report; --confusion's file
is checked before the evaluation. A tiny base and data made by the tests
(tests/finetune/conftest.py)."""

from __future__ import annotations

import contextlib
import io
import json
import random

import pytest

from scratchgpt.checkpoints import load_checkpoint
from scratchgpt.cli import main
from scratchgpt.finetune.data import read_labelled, split_digest, stratified_split
from tests.cli_errors import error_of
from tests.finetune.conftest import NEGATIVE, POSITIVE, run_cli

TAB = "\t"
MAX_LENGTH = 8  # tokens, i.e. characters (the base is char-level): a word or two of a text


def misleading_lines(n: int, seed: int = 1) -> list[str]:
    """``text<TAB>label`` lines that open with two words of their class and go on with four
    of the other: a model that reads past the first few tokens reads them otherwise."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        label = rng.choice(["pos", "neg"])
        own, other = (POSITIVE, NEGATIVE) if label == "pos" else (NEGATIVE, POSITIVE)
        words = [rng.choice(own) for _ in range(2)] + [rng.choice(other) for _ in range(4)]
        lines.append(" ".join(words) + "\t" + label)
    return lines


@pytest.fixture(scope="module")
def short_run(ft_dir, tmp_path_factory):
    """(run, its data file): a classifier fine-tuned on each text's first MAX_LENGTH tokens."""
    d = tmp_path_factory.mktemp("short")
    data = d / "misleading.tsv"
    data.write_text("\n".join(misleading_lines(160)) + "\n")
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        code = main(["finetune", "--task", "classify", "--init-from", str(ft_dir / "base"),
                     "--data", str(data), "--max-length", str(MAX_LENGTH), "--max-iters",
                     "30", "--learning-rate", "3e-3", "--out", str(d / "run"),
                     "--batch-size", "8", "--no-progress"])
    assert code == 0, printed.getvalue()
    return d / "run", data


def test_eval_on_the_runs_test_split_reproduces_its_report(short_run, tmp_path, capsys):
    run, data = short_run
    record = load_checkpoint(run).data["classify"]
    assert record["max_length"] == MAX_LENGTH
    pairs, _, _ = read_labelled(str(data), None)
    parts = stratified_split([label for _, label in pairs], record["fractions"],
                             record["split_seed"])
    assert split_digest(parts) == record["split_digest"]  # the run's own test split
    test = tmp_path / "test.tsv"
    test.write_text("".join(f"{pairs[i][0]}\t{pairs[i][1]}\n" for i in parts[2]))
    code, printed, err = run_cli(["classify", "--checkpoint", run, "--eval", test, "--json"],
                                 capsys)
    assert code == 0, err
    saved = json.loads((run / "test_metrics.json").read_text())
    assert json.loads(printed) == {k: v for k, v in saved.items()
                                   if k not in ("split", "checkpoint")}
    assert f"{len(parts[2])} of {len(parts[2])} texts are longer than the run's " \
           f"--max-length ({MAX_LENGTH} tokens)" in err


def test_eval_of_the_runs_own_data_says_the_model_trained_on_it(short_run, tmp_path, capsys):
    """--eval of the file the run was fine-tuned on printed a report like a test's, its
    accuracy counting the texts the model trained on; a note says so, with the split's
    sizes, and names the report of the held-out test split. A file of other bytes (the test
    split alone, as above) gets none."""
    run, data = short_run
    sizes = load_checkpoint(run).data["classify"]["split_sizes"]
    code, printed, err = run_cli(["classify", "--checkpoint", run, "--eval", data], capsys)
    assert code == 0 and printed.startswith(f"{data}: accuracy"), err
    assert f"note: {data} is the data the run was fine-tuned on: {sizes['train']} of its " \
        f"texts trained the model and {sizes['val']} chose its best.pt, so the figures above " \
        "are not those of unseen text; the run's test_metrics.json scores its held-out test " \
        "split alone" in err.splitlines()
    other = tmp_path / "other.tsv"
    other.write_text("".join(data.read_text().splitlines(keepends=True)[1:]))
    code, _, err = run_cli(["classify", "--checkpoint", run, "--eval", other], capsys)
    assert code == 0 and "fine-tuned on" not in err, err


def test_texts_are_cut_to_the_runs_max_length(short_run, tmp_path, capsys):
    """A text and its first MAX_LENGTH characters get the same probabilities, from the
    command line and from --file."""
    run, _ = short_run
    long = "love good hate awful sad storm"
    texts = tmp_path / "texts.txt"
    texts.write_text(f"{long}\n{long[:MAX_LENGTH]}\n")
    code, printed, err = run_cli(["classify", "--checkpoint", run, "--file", texts, "--json"],
                                 capsys)
    assert code == 0 and "1 of 2 texts is longer than the run's --max-length" in err
    rows = json.loads(printed)
    assert rows[0]["probabilities"] == rows[1]["probabilities"]
    code, printed, _ = run_cli(["classify", "--checkpoint", run, long, "--json"], capsys)
    # alone rather than in a batch of two, the products may add in another order (oneDNN on an
    # AMX Xeon does): equal up to fp32 rounding
    alone = json.loads(printed)[0]["probabilities"]
    assert code == 0 and alone == pytest.approx(rows[1]["probabilities"], rel=1e-5)


@pytest.mark.parametrize("name, needle", [
    ("out.txt", "'.txt' is not an image format"),
    ("out", "it has no suffix"),
    ("adir", "it is a directory"),
])
def test_a_bad_confusion_file_is_refused_before_the_evaluation(short_run, tmp_path, capsys,
                                                               name, needle):
    run, data = short_run
    (tmp_path / "adir").mkdir()
    path = tmp_path / name
    code, printed, err = run_cli(["classify", "--checkpoint", run, "--eval", data,
                                  "--confusion", path], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"cannot write {path}: {needle}" in err and ".png" in err, err
    assert ".tmp" not in err and printed == ""  # nothing evaluated
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir"]


def test_a_confusion_file_in_a_file_is_refused_and_a_new_folder_made(short_run, tmp_path,
                                                                    capsys):
    run, _ = short_run
    data = tmp_path / "short.tsv"
    data.write_text("love\tpos\nsad\tneg\n")  # no text to cut: stderr holds the error alone
    (tmp_path / "afile").write_text("")
    path = tmp_path / "afile" / "c.png"
    code, printed, err = run_cli(["classify", "--checkpoint", run, "--eval", data,
                                  "--confusion", path], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and printed == "", err
    assert f"cannot write {path}: {tmp_path / 'afile'} is a file, not a directory" in err
    path = tmp_path / "fig" / "c.svg"
    code, printed, err = run_cli(["classify", "--checkpoint", run, "--eval", data,
                                  "--confusion", path], capsys)
    assert code == 0 and "accuracy" in printed, err
    assert path.read_text().lstrip().startswith("<?xml")
    assert sorted(p.name for p in path.parent.iterdir()) == ["c.svg"]  # no temporary file left
    drawn = path.read_text()  # replaced only with --overwrite
    code, printed, err = run_cli(["classify", "--checkpoint", run, "--eval", data,
                                  "--confusion", path], capsys)
    assert code == 2 and "already exists; pass --overwrite" in err and printed == "", err
    assert path.read_text() == drawn
    code, printed, err = run_cli(["classify", "--checkpoint", run, "--eval", data,
                                  "--confusion", path, "--overwrite"], capsys)
    assert code == 0 and "accuracy" in printed, err
    code, printed, err = run_cli(["classify", "--checkpoint", run, "--eval", data,
                                  "--overwrite"], capsys)  # with nothing to replace
    assert code == 2 and "it goes with --confusion" in err and printed == "", err


def test_the_confusion_file_drawn_is_named(short_run, tmp_path, capsys):
    """--eval --confusion drew its file without a word of it, where eval's --plot and
    inspect's --out say 'wrote FILE': the user could not tell from the output whether the
    figure had been drawn, nor where. With --json, stdout stays JSON alone."""
    run, data = short_run
    path = tmp_path / "c.png"
    code, printed, err = run_cli(["classify", "--checkpoint", run, "--eval", data,
                                  "--confusion", path], capsys)
    assert code == 0 and path.is_file(), err
    assert printed.splitlines()[-1] == f"wrote {path}"
    code, printed, err = run_cli(["classify", "--checkpoint", run, "--eval", data,
                                  "--confusion", path, "--overwrite", "--json"], capsys)
    assert code == 0 and json.loads(printed)["total"] == 160, err


@pytest.mark.parametrize("texts, n", [([""], 1), (["love", "  "], 2)])
def test_an_empty_text_is_refused_not_labelled(ft_dir, capsys, texts, n):
    """An empty text has no token to read: it is refused (as --file skips blank lines and
    finetune refuses empty texts), not labelled from a stand-in token."""
    code, printed, err = run_cli(["classify", "--checkpoint", ft_dir / "base", *texts], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"text {n} is empty" in err and printed == ""


def test_file_is_read_as_finetune_reads_its_data(short_run, tmp_path, capsys):
    """--file drops a BOM (not a character of the first text) and refuses a directory in
    words, as finetune's --data does."""
    run, _ = short_run
    (tmp_path / "bom.txt").write_bytes("\ufefflove\n".encode())
    code, printed, err = run_cli(["classify", "--checkpoint", run, "--file",
                                  tmp_path / "bom.txt", "--json"], capsys)
    assert code == 0 and json.loads(printed)[0]["text"] == "love" and err == "", err
    code, _, err = run_cli(["classify", "--checkpoint", run, "--file", tmp_path], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{tmp_path} is a directory, not a file" in err
    code, _, err = run_cli(["classify", "--checkpoint", run, "--file", "/dev/null"], capsys)
    assert "/dev/null is not a regular file" in err and code == 2, err  # not "does not exist"


def test_a_labelled_file_given_as_file_gets_a_note_naming_eval(short_run, tmp_path, capsys):
    """text<TAB>label lines given to --file were each classified whole, label and all, with no
    word: a note names --eval. Texts that hold a tab without ending in a label get none."""
    run, data = short_run
    code, printed, err = run_cli(["classify", "--checkpoint", run, "--file", data], capsys)
    assert code == 0 and len(printed.splitlines()) == len(data.read_text().splitlines())
    notes = [line for line in err.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and notes[0].startswith(f"note: every line of --file {data} ends "
                                                   "in a tab and one of the model's labels ")
    assert notes[0].endswith(f"give --eval {data}"), notes
    texts = tmp_path / "tabbed.txt"
    texts.write_text("love\tgood\nhate\tpos\n")  # ('good' is no label)
    code, _, err = run_cli(["classify", "--checkpoint", run, "--file", texts], capsys)
    assert code == 0 and "--eval" not in err, err


def test_a_file_of_one_line_prints_the_columns_of_a_file_of_many(short_run, tmp_path, capsys):
    """--file printed label, probability and text for each line, but for a file of one line
    the text was left out: a script reading the third column broke on such a file. A single
    text given as an argument is printed without it, as it stands on the command line."""
    run, _ = short_run
    rows = {}
    for lines in (["love it", "hate it"], ["love it"]):
        (tmp_path / "t.txt").write_text("\n".join(lines) + "\n")
        code, printed, err = run_cli(["classify", "--checkpoint", run, "--file",
                                      tmp_path / "t.txt"], capsys)
        assert code == 0, err
        rows[len(lines)] = [line.split("\t") for line in printed.splitlines()]
    assert [len(r) for r in rows[2]] == [3, 3] and rows[1] == rows[2][:1]
    code, printed, _ = run_cli(["classify", "--checkpoint", run, "love it"], capsys)
    assert code == 0 and printed.rstrip("\n").split("\t") == rows[1][0][:2]


def _stdin(raw: bytes) -> io.TextIOWrapper:
    """Standard input holding ``raw``, decoded as a terminal's is (invalid bytes kept as
    surrogates, which would reach the tokenizer as U+FFFD)."""
    return io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8", errors="surrogateescape")


def test_file_dash_reads_standard_input(short_run, capsys, monkeypatch):
    run, _ = short_run
    monkeypatch.setattr("sys.stdin", _stdin("\ufefflove\n\nhate\n".encode()))
    code, printed, err = run_cli(["classify", "--checkpoint", run, "--file", "-", "--json"],
                                 capsys)
    assert code == 0 and [r["text"] for r in json.loads(printed)] == ["love", "hate"], err
    monkeypatch.setattr("sys.stdin", _stdin(b"\n"))
    code, _, err = run_cli(["classify", "--checkpoint", run, "--file", "-"], capsys)
    assert code == 2 and "standard input has no non-empty line" in err, err


def test_standard_input_that_is_not_utf8_is_refused(short_run, capsys, monkeypatch):
    """As a --file that is not UTF-8 is: one line naming the first bad byte (its texts were
    labelled with U+FFFD in place of the bytes, without a word)."""
    run, _ = short_run
    monkeypatch.setattr("sys.stdin", _stdin(b"love\nha\xffte\n"))
    code, printed, err = run_cli(["classify", "--checkpoint", run, "--file", "-"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and printed == "", err
    assert "standard input is not valid UTF-8 text (byte 7)" in err


def test_file_splits_lines_where_an_editor_ends_them(short_run, tmp_path, capsys):
    """A form feed, U+2028 or \\x85 inside a text keeps it one text, as finetune's data does
    (str.splitlines broke it in two)."""
    run, _ = short_run
    texts = tmp_path / "texts.txt"
    texts.write_text("love\x0cgood\nhate\u2028sad\x85storm\r\nawful\n", newline="")
    code, printed, err = run_cli(["classify", "--checkpoint", run, "--file", texts, "--json"],
                                 capsys)
    assert code == 0, err
    assert [r["text"] for r in json.loads(printed)] == \
        ["love\x0cgood", "hate\u2028sad\x85storm", "awful"]


def test_eval_dash_reads_standard_input(short_run, capsys, monkeypatch):
    """--eval - scores the labelled lines of standard input, as --eval FILE scores a file's."""
    run, data = short_run
    code, from_file, err = run_cli(["classify", "--checkpoint", run, "--eval", data, "--json"],
                                   capsys)
    assert code == 0, err
    monkeypatch.setattr("sys.stdin", _stdin(data.read_bytes()))
    code, from_stdin, err = run_cli(["classify", "--checkpoint", run, "--eval", "-",
                                     "--json"], capsys)
    assert code == 0, err
    assert json.loads(from_stdin) == json.loads(from_file)
    monkeypatch.setattr("sys.stdin", _stdin(b"love\tpos\nhate\tcheerful\n"))
    code, _, err = run_cli(["classify", "--checkpoint", run, "--eval", "-"], capsys)
    assert code == 2 and "standard input: label 'cheerful' is not one the model knows" in err


def test_file_dash_and_eval_dash_together_are_refused_in_one_line(short_run, capsys,
                                                                 monkeypatch):
    run, _ = short_run
    monkeypatch.setattr("sys.stdin", _stdin(b"love\tpos\n"))
    line = error_of(capsys, ["classify", "--checkpoint", str(run), "--file", "-", "--eval", "-"])
    assert "--file - and --eval - would both read standard input" in line


def test_file_help_says_dash_is_standard_input_and_the_text_is_utf8(capsys):
    """--help is where a user learns both: that - reads standard input, and that bytes which
    are not UTF-8 are refused rather than labelled."""
    with pytest.raises(SystemExit):
        main(["classify", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    file_help = shown.rsplit("--file FILE", 1)[1].split("--eval")[0]  # (not the usage line)
    assert "standard input with -" in file_help and "UTF-8" in file_help, file_help
    eval_help = shown.rsplit("--eval LABELLED_FILE", 1)[1].split("--confusion")[0]
    assert "standard input with -" in eval_help and "UTF-8" in eval_help, eval_help


@pytest.mark.parametrize("labels", [
    ["a very long label name number one", "second_category_with_underscores", "x",
     "politics & world", "science/tech"],
    ["pos", "neg"],
])
def test_the_confusion_matrix_s_class_names_never_overlap(labels):
    """Class names wider than their column were written over each other along the x axis."""
    from scratchgpt.viz import confusion_figure

    n = len(labels)
    fig = confusion_figure([[int(t == p) for p in range(n)] for t in range(n)], labels)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ticks = fig.axes[0].get_xticklabels()
    assert [t.get_text() for t in ticks] == labels
    boxes = [t.get_window_extent(renderer) for t in ticks]
    assert all(not a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    assert all(fig.bbox.contains(b.x0, b.y0) and fig.bbox.contains(b.x1, b.y1)
               for b in boxes)  # (and none is cut off by the figure's edge)


@pytest.mark.parametrize("name, lines, why", [
    ("flipped.tsv", [f"{line.split(TAB)[1]}\t{line.split(TAB)[0]}"
                     for line in misleading_lines(20)], "20 labels among 20 texts"),
    # read as labels the model lacks: 'label 'hate sad' is not one the model knows'
    ("upper.tsv", ["POS\tlove happy", "neg\thate sad"],
     "its texts are the model's labels (neg, pos) and its labels are not"),
    ("flipped.csv", ["pos,love happy", "neg,hate sad", "pos,nice day"], "3 labels among 3")])
def test_eval_of_a_file_written_label_first_says_so_first_and_what_to_do(
        short_run, tmp_path, capsys, name, lines, why):
    """The line named the file's counts first and only asked whether its columns were
    swapped, with no word of what to do (no flag reads a file label first); a file whose
    texts were the model's labels in capitals was refused for its labels, the texts. It names
    the swapped columns first, then why, then the remedy."""
    run, _ = short_run
    labelled = tmp_path / name
    labelled.write_text("\n".join(lines) + "\n")
    line = error_of(capsys, ["classify", "--checkpoint", str(run), "--eval", str(labelled)])
    first, last = ("label,text", "text,label") if name.endswith(".csv") else (
        "label<TAB>text", "text<TAB>label")
    assert line.startswith(f"scratchgpt classify: error: {labelled}: its label and text "
                           f"columns look swapped ({why}"), line
    assert f"{first}?);" in line and line.endswith(f"read as {last}, the label last: swap "
                                                   "its two columns"), line
