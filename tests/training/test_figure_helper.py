"""loss.png drawn by the figure helper process (scratchgpt/figure_helper.py): the same file as
drawn in-process, drawn in-process when the helper is gone, errors as they would be without
it, and started by the command line only for commands that draw."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from scratchgpt import cli, figure_helper
from scratchgpt.training.metrics import FIELDS, plot_losses


def _metrics(path: Path) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for step in range(1, 41):
            w.writerow({"step": step, "tokens": step * 64, "elapsed_s": step / 10,
                        "lr": "1e-3", "loss": f"{3 / step ** 0.3:.4f}"})
            if step % 20 == 0:
                w.writerow({"step": step, "tokens": step * 64, "elapsed_s": step / 10,
                            "train_loss": f"{3 / step ** 0.3:.4f}",
                            "val_loss": f"{3.1 / step ** 0.3:.4f}"})
    return path


@pytest.fixture
def helper():
    figure_helper.start()
    assert figure_helper._helper is not None
    yield figure_helper._helper
    figure_helper.stop()


def test_the_helper_draws_the_same_file_as_this_process(tmp_path, helper):
    metrics = _metrics(tmp_path / "metrics.csv")
    plot_losses(metrics, tmp_path / "here.png")
    assert figure_helper._drawn_by_helper("losses", (metrics, tmp_path / "there.png"))
    assert (tmp_path / "there.png").read_bytes() == (tmp_path / "here.png").read_bytes()


def test_without_a_helper_the_figure_is_drawn_here(tmp_path, helper):
    metrics = _metrics(tmp_path / "metrics.csv")
    helper.kill()
    helper.wait()
    figure_helper.draw("losses", metrics, tmp_path / "loss.png")
    assert (tmp_path / "loss.png").stat().st_size > 1000
    assert figure_helper._helper is None  # not asked again
    figure_helper.draw("losses", metrics, tmp_path / "again.png")
    assert (tmp_path / "again.png").is_file()


def test_a_figure_that_fails_fails_here_as_it_would_without_the_helper(tmp_path, helper):
    metrics = _metrics(tmp_path / "metrics.csv")
    with pytest.raises(FileNotFoundError):
        figure_helper.draw("losses", metrics, tmp_path / "no such folder" / "loss.png")
    figure_helper.draw("losses", metrics, tmp_path / "loss.png")  # the helper goes on
    assert figure_helper._helper is helper and (tmp_path / "loss.png").is_file()


def _named_in_cjk(tmp_path: Path) -> Path:
    """metrics.csv in a run folder whose name (loss.png's title) the font has no glyphs for."""
    run = tmp_path / "你好"
    run.mkdir()
    return _metrics(run / "metrics.csv")


def test_what_the_helper_says_while_drawing_is_said_here(tmp_path, helper, capsys):
    """The note that the title's characters show as boxes reaches this process's stderr, as
    it does when the figure is drawn here: the helper's stderr went nowhere, so the note was
    lost (and loss.png was the one figure that gave no such note at all)."""
    metrics = _named_in_cjk(tmp_path)
    plot_losses(metrics, tmp_path / "here.png")
    here = capsys.readouterr()
    assert here.err == (f"note: 2 characters have no glyph in the font of "
                        f"{tmp_path / 'here.png'} and show as boxes: 你 好\n")
    assert figure_helper._drawn_by_helper("losses", (metrics, tmp_path / "there.png"))
    assert capsys.readouterr().err == here.err.replace("here.png", "there.png")


def test_a_figure_the_helper_fails_to_draw_is_explained_once(tmp_path, helper, capsys):
    """The helper keeps what a failed drawing said: the drawing here that follows says it,
    with the error, and the user reads each once."""
    metrics = _named_in_cjk(tmp_path)
    with pytest.raises(FileNotFoundError):
        figure_helper.draw("losses", metrics, tmp_path / "no such folder" / "loss.png")
    assert capsys.readouterr().err.count("have no glyph") == 1


def test_switched_off_no_helper_starts(monkeypatch):
    monkeypatch.setenv(figure_helper.SWITCH, "0")
    figure_helper.start()
    assert figure_helper._helper is None


@pytest.mark.parametrize("argv,starts", [
    (["train", "--dataset", "x"], True), (["finetune", "instruct"], True),
    (["train", "--help"], False), (["sample", "--run", "x"], False), ([], False)])
def test_the_command_line_starts_it_for_commands_that_draw(monkeypatch, argv, starts):
    started = []
    monkeypatch.setattr(figure_helper, "start", lambda: started.append(1))
    cli._start_figure_helper(argv)
    assert bool(started) == starts


def test_a_failed_drawing_leaves_no_figure_open(tmp_path):
    """loss.png that cannot be written closes its figure all the same: a process that goes on
    (a sweep, the helper) kept each one open, and matplotlib warns from the 21st."""
    import matplotlib.pyplot as plt

    plt.close("all")
    with pytest.raises(FileNotFoundError):
        plot_losses(_metrics(tmp_path / "metrics.csv"), tmp_path / "no such folder" / "l.png")
    assert plt.get_fignums() == []
