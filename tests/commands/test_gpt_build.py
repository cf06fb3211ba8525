"""``scratchgpt experiment gpt-build``: the GPT of "Let's build GPT" built one part at a time.

Each stage must add exactly the part it names, train under the shared recipe into its own run
directory (sampleable), equal the ``scratchgpt train`` command the report gives for it, and the
report (table and plot) must hold every stage."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import re
import shlex
from pathlib import Path

import pytest
import torch

from scratchgpt.checkpoints.io import load_checkpoint, load_model
from scratchgpt.cli import main
from scratchgpt.data.dataset import TokenDataset
from scratchgpt.errors import ConfigError
from scratchgpt.experiments import gpt_build
from scratchgpt.models import build_model, config_dict
from scratchgpt.models.gpt import GPT
from scratchgpt.training.task import full_split_loss
from tests.cli_errors import error_of


def config_of(stage: gpt_build.Stage) -> dict:
    return config_dict(stage.config(vocab_size=65))


# What each stage changes in the model of the stage before it: nothing else may change.
CHANGES = {
    "multi-head": {"n_head": (1, 4)},
    "feed-forward": {"mlp": (False, True)},
    "blocks": {"n_layer": (1, 3)},
    "residual": {"residual": (False, True)},
    "layernorm": {"layernorm": (False, True)},
}


def test_each_stage_adds_exactly_its_part():
    stages = gpt_build.stages(gpt_build.BuildSetup())
    assert [s.name for s in stages] == ["1-bigram", "2-one-head", "3-multi-head",
                                        "4-feed-forward", "5-blocks", "6-residual",
                                        "7-layernorm", "8-scaled"]
    for before, after in zip(stages[1:6], stages[2:7], strict=True):
        a, b = config_of(before), config_of(after)
        changed = {k: (a[k], b[k]) for k in a if a[k] != b[k]}
        assert changed == CHANGES[after.key], after.name
    one_head = config_of(stages[1])
    assert (one_head["n_layer"], one_head["n_head"], one_head["n_embd"]) == (1, 1, 32)
    assert not (one_head["mlp"] or one_head["residual"] or one_head["layernorm"])
    assert config_of(stages[7])["dropout"] == 0.2 > config_of(stages[6])["dropout"]
    assert type(build_model(stages[0].config(65))).__name__ == "BigramLM"


def test_the_lecture_shaped_last_stage_has_the_lectures_parameter_count():
    # "Let's build GPT" prints 10.788929 M parameters for its 6 x 6 x 384 model at context 256.
    # Ours differs only in biases: our fused q/k/v projection has them (6 layers x 3 x 384)
    # and the lecture's head has one (65) where ours has none.
    stage = gpt_build.stages(gpt_build.BuildSetup(scaled="lecture"))[7]
    model = build_model(stage.config(vocab_size=65))
    ours = sum(p.numel() for p in model.parameters())
    assert ours - 6 * 3 * 384 + 65 == 10_788_929


def test_stages_are_chosen_by_number_key_or_name():
    stages = gpt_build.stages(gpt_build.BuildSetup())
    chosen = gpt_build.select(stages, ["7-layernorm", "1", "one-head"])
    assert [s.name for s in chosen] == ["1-bigram", "2-one-head", "7-layernorm"]
    assert gpt_build.select(stages, None) == stages
    with pytest.raises(ConfigError, match="no stage 'attention'"):
        gpt_build.select(stages, ["attention"])
    for twice in (["1", "1"], ["2", "one-head", "3"]):  # trained once, as memory's --cells
        with pytest.raises(ConfigError, match="^--stages names [12]-[a-z-]+ more than once$"):
            gpt_build.select(stages, twice, "--stages")
    with pytest.raises(ConfigError, match="scaled must be one of"):
        gpt_build.BuildSetup(scaled="huge")


def val_estimates(run: Path) -> list[float]:
    return [float(r["val_loss"]) for r in csv.DictReader((run / "metrics.csv").open())
            if r["val_loss"]]


@pytest.fixture(scope="module")
def quick_build(tmp_path_factory, small_dataset) -> Path:
    out = tmp_path_factory.mktemp("build") / "gb"
    assert main(["experiment", "gpt-build", "--quick", "--dataset", str(small_dataset),
                 "--out", str(out), "--no-progress"]) == 0
    return out


def untrained_val_loss(stage: gpt_build.Stage, data: TokenDataset, seed: int) -> float:
    """The exact val loss of the stage's model before training (the trainer seeds, then
    builds the model, exactly so)."""
    config = stage.config(data.vocab_size)
    torch.manual_seed(seed)
    return full_split_loss(build_model(config), data, "val", config.block_size,
                           torch.device("cpu"))


def test_quick_build_trains_every_stage_and_writes_the_report(quick_build, small_dataset):
    with open(quick_build / "gpt_build.csv") as f:
        table = list(csv.DictReader(f))
    setup = gpt_build.quick_setup()
    stages = gpt_build.stages(setup)
    assert [r["stage"] for r in table] == [s.name for s in stages]
    data = TokenDataset(small_dataset)
    for row, stage in zip(table, stages, strict=True):
        run = quick_build / row["run"]
        assert (run / "best.pt").is_file() and (run / "loss.png").is_file()
        assert int(row["steps"]) == 20 and math.isfinite(float(row["val_loss"]))
        assert len(val_estimates(run)) >= 2  # the curve of the plot
        # it learned: the same measure as the table's, on the model it started from
        assert float(row["val_loss"]) < untrained_val_loss(stage, data, setup.seed), row
        saved = json.loads((run / "config.json").read_text())
        assert saved["experiment"]["stage"] == row["stage"]
    assert table[0]["lecture_val_loss"] == "2.49" and table[-1]["lecture_val_loss"] == "1.48"
    md = (quick_build / "gpt_build.md").read_text()
    assert sum(line.startswith("| ") for line in md.splitlines()) == 9  # header + 8 stages
    assert sum(line.startswith("scratchgpt train ") for line in md.splitlines()) == 8
    assert (quick_build / "gpt_build.png").stat().st_size > 10_000


def test_the_plots_curves_are_the_estimates_one_point_per_evaluation(quick_build):
    """Each curve ended in a vertical drop: the final evaluation on the whole val split, at the
    step of the last estimate, was drawn as one more point of the estimates."""
    for run in sorted(p for p in quick_build.iterdir() if p.is_dir()):
        rows = list(csv.DictReader((run / "metrics.csv").open()))
        estimates = [(float(r["step"]), float(r["val_loss"])) for r in rows
                     if r["val_loss"] and r["lr"]]
        assert len(estimates) < len(val_estimates(run))  # the final one is in the file...
        points = gpt_build.curve(run, by_time=False)
        assert points == estimates and len(points) >= 2  # ...and not on the curve
        steps = [step for step, _ in points]
        assert steps == sorted(set(steps)), steps


def test_the_plots_steps_read_as_plain_numbers_and_its_legend_covers_no_curve(
        quick_build, tmp_path, monkeypatch):
    """On the log axis of steps, step 20 read '2 x 10^1' and step 10 '10^1', and the legend
    covered the curves."""
    import scratchgpt.viz

    results = gpt_build.recorded_results(quick_build)
    drawn = []
    monkeypatch.setattr(scratchgpt.viz, "save_figure", lambda fig, path: drawn.append(fig))
    gpt_build.plot(results, tmp_path / "p.png", by_time=False)
    right = drawn[0].axes[1]
    drawn[0].canvas.draw()
    labels = [t.get_text() for minor in (False, True)
              for t in right.get_xticklabels(minor=minor) if t.get_text()]
    low, high = right.get_xlim()
    shown = [float(x) for x in labels if low <= float(x) <= high]  # each a plain number
    assert 10.0 in shown and 20.0 in shown, labels
    # the legend of eight stages stands beside the curves, not over them
    renderer = drawn[0].canvas.get_renderer()
    box, axes = right.get_legend().get_window_extent(renderer), right.get_window_extent(renderer)
    assert box.x0 >= axes.x1 and box.x1 <= drawn[0].bbox.x1, (box, axes)


def test_the_plots_seconds_below_one_read_as_plain_numbers_apart(tmp_path, monkeypatch):
    """A stage that evaluated within its first second put ticks below 1 s on the log axis of
    time, which read '3e-01', '4e-01', ... and ran into each other ('3e-04e-01')."""
    import scratchgpt.viz

    stage = gpt_build.stages(gpt_build.BuildSetup())[0]
    run = tmp_path / stage.name
    run.mkdir()
    times = [0.25, 0.5, 0.8, 1.1, 2.0, 4.0, 8.0]
    (run / "metrics.csv").write_text(
        "step,tokens,elapsed_s,lr,loss,train_loss,val_loss\n"
        + "".join(f"{100 * (i + 1)},0,{t},1e-3,,4.0,{4.0 - i / 10}\n"
                  for i, t in enumerate(times)))
    result = gpt_build.StageResult(stage, 1, 700, 0, 8.0, 3.4, 3.4, run, time_budget="8s")
    drawn = []
    monkeypatch.setattr(scratchgpt.viz, "save_figure", lambda fig, path: drawn.append(fig))
    gpt_build.plot([result], tmp_path / "p.png", by_time=True)
    right = drawn[0].axes[1]
    drawn[0].canvas.draw()
    renderer = drawn[0].canvas.get_renderer()
    low, high = right.get_xlim()
    shown = sorted((t for minor in (False, True) for t in right.get_xticklabels(minor=minor)
                    if t.get_text() and low <= t.get_position()[0] <= high),
                   key=lambda t: t.get_position()[0])
    texts = [t.get_text() for t in shown]
    assert "0.3" in texts and "1" in texts and not any("e" in x for x in texts), texts
    assert [float(x) for x in texts] == pytest.approx([t.get_position()[0] for t in shown])
    boxes = [t.get_window_extent(renderer) for t in shown]
    # none runs into the next
    assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:], strict=False)), texts


def test_the_plot_says_why_it_has_no_curve(small_dataset, tmp_path, monkeypatch):
    """An --eval-interval longer than the steps leaves no estimate to draw: the panel was an
    empty frame with an empty legend box."""
    import scratchgpt.viz

    drawn = []
    monkeypatch.setattr(scratchgpt.viz, "save_figure",
                        lambda fig, path: drawn.append(fig) or Path(path))
    assert main(["experiment", "gpt-build", "--dataset", str(small_dataset), "--out",
                 str(tmp_path / "gb"), "--stages", "1", "--max-iters", "4",
                 "--eval-interval", "100", "--no-progress"]) == 0
    right = drawn[0].axes[1]
    assert not right.lines and right.get_legend() is None
    said = " ".join(t.get_text() for t in right.texts)
    assert "--eval-interval is longer than the stages' steps" in " ".join(said.split())


def test_the_report_names_the_unit_its_losses_are_averaged_over(small_dataset, english_text,
                                                                tmp_path, monkeypatch):
    """The plot's axis read 'nats/char' whatever --dataset was: a BPE dataset's losses are per
    token, several characters each. Then a char-prose dataset's read 'nats/token', though each
    of its tokens is a character: the unit is named by the tokenizer, in the plot and the
    table alike."""
    import scratchgpt.viz
    from scratchgpt.data.prepare import prepare_text

    bpe, prose = tmp_path / "bpe", tmp_path / "prose"
    prepare_text(english_text[:20_000], bpe, "bpe", vocab_size=300, source="test")
    prepare_text(english_text[:20_000], prose, "char-prose", source="test")
    drawn = []
    monkeypatch.setattr(scratchgpt.viz, "save_figure",
                        lambda fig, path: drawn.append(fig) or Path(path))
    for data, unit in ((bpe, "token"), (prose, "char"), (small_dataset, "char")):
        out = tmp_path / "out" / data.name
        assert main(["experiment", "gpt-build", "--dataset", str(data), "--out", str(out),
                     "--stages", "1", "--max-iters", "2", "--no-progress"]) == 0
        assert drawn[-1].axes[0].get_ylabel() == f"val loss (nats/{unit})", data
        header = (out / "gpt_build.md").read_text().splitlines()[0]
        assert f"| val loss (nats/{unit}) |" in header, (data, header)
    scratchgpt.viz.pyplot().close("all")  # kept open by the stand-in for save_figure


def test_the_lectures_losses_are_labelled_as_tiny_shakespeares_beside_another_text(
        small_dataset, tmp_path, monkeypatch, capsys):
    """The table and the plot set the lecture's Tiny Shakespeare losses beside any --dataset's
    with nothing to say they are another text's: read as a target, a bigram's loss far above
    2.49 looked like a broken model. The lecture's own text keeps the plain heading."""
    import shutil

    import scratchgpt.viz
    from scratchgpt.data.sources import DATASETS

    shakespeare = tmp_path / "shakespeare-char"  # the play, claiming Tiny Shakespeare's sha256
    shutil.copytree(small_dataset, shakespeare)
    meta = json.loads((shakespeare / "meta.json").read_text())
    meta["source_sha256"] = DATASETS["shakespeare"].sha256
    (shakespeare / "meta.json").write_text(json.dumps(meta))
    drawn = []
    monkeypatch.setattr(scratchgpt.viz, "save_figure",
                        lambda fig, path: drawn.append(fig) or Path(path))
    for data, heading, legend in (
            (small_dataset, "lecture (Tiny Shakespeare)", "Let's build GPT, on Tiny Shakespeare"),
            (shakespeare, "lecture", "Let's build GPT")):
        out = tmp_path / data.name / "gb"
        assert main(["experiment", "gpt-build", "--dataset", str(data), "--out", str(out),
                     "--stages", "1", "--max-iters", "2", "--no-progress"]) == 0
        printed = capsys.readouterr().out
        for md in (printed, (out / "gpt_build.md").read_text()):
            assert f"| val loss (nats/char) | {heading} |" in md, md
        assert f"({heading} 2.49)" in printed, printed  # the stage's own line
        labels = drawn[-1].axes[0].get_legend_handles_labels()[1]
        assert labels == ["this run", legend], labels
    scratchgpt.viz.pyplot().close("all")  # kept open by the stand-in for save_figure


@pytest.mark.parametrize("where", ["a file", "below a file", "where nothing can be written"])
def test_an_out_that_cannot_hold_the_stages_is_refused_before_anything(where, small_dataset,
                                                                       tmp_path, capsys):
    """--out naming a file was found by the first stage's run directory, after the dataset
    was read and the stage announced, as 'F/1-bigram is below F, a file, not a folder; give
    the run its own --out', naming a folder and a flag of train's; memory and count said
    '--out F is a file' before anything."""
    if where.startswith("where") and not Path("/proc/self").is_dir():
        pytest.skip("no /proc on this system")
    (tmp_path / "f").write_text("mine")
    out, said = {"a file": (tmp_path / "f", "is a file; give a directory for the results"),
                 "below a file": (tmp_path / "f" / "gb", f"is below {tmp_path / 'f'}, a file"),
                 "where nothing can be written": (Path("/proc/scratchgpt-gb"),
                                                  "no file can be written in /proc (")}[where]
    assert main(["experiment", "gpt-build", "--dataset", str(small_dataset), "--out", str(out),
                 "--stages", "1", "--max-iters", "2", "--no-progress"]) == 2
    printed = capsys.readouterr()
    assert printed.out == ""  # no stage was announced
    err = printed.err.strip().splitlines()
    assert len(err) == 1 and f"--out {out}" in err[0] and said in err[0], err
    assert (tmp_path / "f").read_text() == "mine"


def test_the_final_losses_axis_does_not_magnify_a_few_thousandths(quick_build, tmp_path,
                                                                   monkeypatch):
    """One stage alone (--stages 1) drew its 2.4948 and the lecture's 2.49 on an axis from
    2.490 to 2.495: a difference of 0.005 spanned the panel and read as a gap. The axis spans
    at least half a nat; the full build's, wider, is left as drawn."""
    import scratchgpt.viz

    results = gpt_build.recorded_results(quick_build)
    drawn = []
    monkeypatch.setattr(scratchgpt.viz, "save_figure", lambda fig, path: drawn.append(fig))
    bigram = dataclasses.replace(results[0], val_loss=2.4948)
    gpt_build.plot([bigram], tmp_path / "one.png", by_time=False)
    low, high = drawn[-1].axes[0].get_ylim()
    assert high - low >= 0.5 and low <= 2.49 < 2.4948 <= high, (low, high)
    spread = [dataclasses.replace(r, val_loss=1.0 + 0.5 * i) for i, r in enumerate(results)]
    gpt_build.plot(spread, tmp_path / "all.png", by_time=False)
    low, high = drawn[-1].axes[0].get_ylim()
    assert low < 1.0 and 4.5 < high < 5.0, (low, high)  # matplotlib's own margins


def test_a_stage_loads_as_the_model_it_names(quick_build):
    model, source = load_model(quick_build / "5-blocks")
    assert isinstance(model, GPT) and source.model_type == "gpt"
    cfg = model.config
    assert (cfg.n_layer, cfg.n_head, cfg.mlp, cfg.residual, cfg.layernorm) == (3, 4, True,
                                                                                False, False)
    assert main(["sample", "--checkpoint", str(quick_build / "5-blocks"), "--prompt", "KING",
                 "--max-new-tokens", "5", "--seed", "0"]) == 0


def test_each_stage_equals_its_train_command(quick_build, tmp_path):
    saved = json.loads((quick_build / "6-residual" / "config.json").read_text())
    command = shlex.split(saved["experiment"]["train_command"])
    assert command[:2] == ["scratchgpt", "train"]
    out = command.index("--out") + 1
    command[out] = str(tmp_path / "replay")
    assert main([*command[1:], "--no-progress"]) == 0
    assert val_estimates(tmp_path / "replay") == val_estimates(quick_build / "6-residual")
    replayed = json.loads((tmp_path / "replay" / "config.json").read_text())
    assert replayed["model"] == saved["model"] and replayed["train"] == saved["train"]


def test_existing_stage_runs_are_kept_unless_overwrite(small_dataset, tmp_path, capsys):
    args = ["experiment", "gpt-build", "--quick", "--dataset", str(small_dataset),
            "--out", str(tmp_path), "--stages", "1", "--no-progress"]
    assert main(args) == 0
    before = (tmp_path / "1-bigram" / "best.pt").read_bytes()
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--overwrite" in err[0]
    assert (tmp_path / "1-bigram" / "best.pt").read_bytes() == before
    assert main([*args, "--overwrite"]) == 0
    assert not (tmp_path / "2-one-head").exists()  # only the stages asked for


def interrupt_stage_two(monkeypatch) -> None:
    """Ctrl-C as stage 2's third batch is drawn (``monkeypatch.undo()`` lifts it)."""
    import signal

    from tests.interrupts import interrupt_at

    real_run = gpt_build.train_job.run

    def stage_run(job, progress):
        if job.out.name == "2-one-head":
            interrupt_at(monkeypatch, 3, signal.SIGINT)
        return real_run(job, progress)

    monkeypatch.setattr(gpt_build.train_job, "run", stage_run)


def test_an_interrupted_build_is_told_how_to_go_on(small_dataset, tmp_path, capsys,
                                                   monkeypatch):
    """Ctrl-C in stage 2 keeps stage 1 (and the report of it); the same command again was
    refused with only 'already holds a run; pass --overwrite', which trains stage 1 again. It
    now names the stages the report lacks, and that command completes the build."""
    interrupt_stage_two(monkeypatch)
    args = ["experiment", "gpt-build", "--quick", "--dataset", str(small_dataset),
            "--out", str(tmp_path), "--no-progress", "--stages"]
    assert main([*args, "1", "2", "3"]) == 130
    monkeypatch.undo()
    bigram = (tmp_path / "1-bigram" / "best.pt").read_bytes()
    # where it stopped, and how to go on, is said at once (nothing followed the signal's line)
    cut = tmp_path / "2-one-head"
    last = capsys.readouterr().out.splitlines()[-1]
    assert re.fullmatch(
        rf"stage 2-one-head stopped at step \d+; saved {re.escape(str(cut / 'last.pt'))} "
        rf"\(scratchgpt train --resume --out {re.escape(str(cut))} finishes it; then "
        r"--stages 3 goes on with the rest\)", last), last
    step = int(last.split("at step ")[1].split(";")[0])
    assert step == load_checkpoint(cut, "last").state.step
    said = error_of(capsys, [*args, "1", "2", "3"])
    assert "holds 1-bigram, 2-one-head; to go on with the stages not finished there, pass " \
           "--stages 2 3 --overwrite (a stage cut short trains again from its start; " \
           f"scratchgpt train --resume --out {tmp_path / '2-one-head'} finishes it" in said, said
    assert main([*args, "2", "3", "--overwrite"]) == 0
    with open(tmp_path / "gpt_build.csv") as f:
        assert [r["stage"] for r in csv.DictReader(f)] == ["1-bigram", "2-one-head",
                                                           "3-multi-head"]
    assert (tmp_path / "1-bigram" / "best.pt").read_bytes() == bigram  # kept, not retrained


def test_a_build_cut_in_its_first_stage_is_told_train_resume_finishes_it(
        small_dataset, tmp_path, capsys, monkeypatch):
    """Cut in the first stage asked for, the same command again was refused with 'already
    holds a run; pass --overwrite', which trains it again from its start, with no word that
    train --resume finishes it."""
    interrupt_stage_two(monkeypatch)
    args = ["experiment", "gpt-build", "--quick", "--dataset", str(small_dataset),
            "--out", str(tmp_path), "--no-progress", "--stages", "2", "3"]
    assert main(args) == 130
    monkeypatch.undo()
    capsys.readouterr()
    said = error_of(capsys, args)
    assert said.endswith(f"{tmp_path / '2-one-head'} already holds a run, not finished; pass "
                         "--overwrite to train the stages again from their start (scratchgpt "
                         f"train --resume --out {tmp_path / '2-one-head'} finishes it where it "
                         "stopped), or --out another directory"), said


def test_a_build_stopped_in_its_last_stage_points_to_the_report(tmp_path):
    chosen = gpt_build.select(gpt_build.stages(gpt_build.BuildSetup()), ["2", "5"])
    cut = gpt_build.StageResult(chosen[-1], 0, 7, 0, 0.0, math.nan, math.nan,
                                tmp_path / "5-blocks", interrupted=True)
    note = gpt_build.stopped_note(cut, chosen, tmp_path)
    assert note.startswith("stage 5-blocks stopped at step 7; ")
    assert note.endswith(f"then scratchgpt experiment gpt-build --out {tmp_path} --report "
                         "writes the report with it)")


def test_a_stage_finished_by_train_resume_is_in_the_report(small_dataset, quick_build,
                                                          tmp_path, capsys, monkeypatch):
    """A stage cut short by Ctrl-C and finished with ``scratchgpt train --resume`` stayed out
    of the report: it was kept from gpt_build.csv, which had no row of the stage. Each stage
    is now read from its own run directory: ``--report`` writes the report with it, the same
    command again goes on with the stages after it, and its row is that of the stage trained
    without a break (the quick build's)."""
    interrupt_stage_two(monkeypatch)
    args = ["experiment", "gpt-build", "--quick", "--dataset", str(small_dataset),
            "--out", str(tmp_path), "--no-progress"]
    assert main([*args, "--stages", "1", "2", "3"]) == 130
    monkeypatch.undo()
    assert main(["train", "--resume", "--out", str(tmp_path / "2-one-head"),
                 "--no-progress"]) == 0
    capsys.readouterr()

    def table() -> dict[str, dict[str, str]]:
        with open(tmp_path / "gpt_build.csv") as f:
            return {r["stage"]: r for r in csv.DictReader(f)}

    assert main(["experiment", "gpt-build", "--out", str(tmp_path), "--report"]) == 0
    assert "| 2-one-head |" in capsys.readouterr().out
    assert list(table()) == ["1-bigram", "2-one-head"]
    said = error_of(capsys, [*args, "--stages", "1", "2", "3"])
    assert said.endswith("pass --stages 3, or --overwrite to train them all again"), said
    assert main([*args, "--stages", "3"]) == 0
    assert "keeps 1-bigram, 2-one-head from earlier runs" in capsys.readouterr().out
    with open(quick_build / "gpt_build.csv") as f:
        unbroken = {r["stage"]: r for r in csv.DictReader(f)}
    rows = table()
    assert list(rows) == ["1-bigram", "2-one-head", "3-multi-head"]
    for name in rows:
        for column in ("params", "steps", "tokens", "train_loss", "val_loss", "run"):
            assert rows[name][column] == unbroken[name][column], (name, column)
    md = (tmp_path / "gpt_build.md").read_text()
    assert f"--out {tmp_path / '2-one-head'} --model gpt" in md  # the stage's own command
    said = error_of(capsys, [*args, "--stages", "1", "2", "3"])  # all of them finished now
    assert "finished run of each stage asked for; pass --report to write the report" in said


@pytest.mark.parametrize("flags, said", [
    (["--max-iters", "5"], "--report writes the report of the stages in --out and trains "
                           "nothing; drop --max-iters"),
    (["--seed", "3", "--overwrite"], "drop --seed and --overwrite"),
    ([], "holds no finished stage to report; train them first: scratchgpt experiment "
         "gpt-build --out"),
])
def test_report_refuses_what_it_cannot_do(flags, said, tmp_path, capsys):
    """--report trains nothing: a flag of training beside it would be ignored, and an --out
    with no finished stage has no report; each is refused in a line, nothing written."""
    out = tmp_path / "gb"
    line = error_of(capsys, ["experiment", "gpt-build", "--out", str(out), "--report", *flags])
    assert said in line, line
    assert not out.exists()


def test_the_report_reads_no_stage_cut_short_nor_another_run(quick_build, tmp_path):
    """A run directory counts as its stage's when it holds the stage's checkpoint and final
    evaluation: not one cut short (no final row in metrics.csv), nor another run's."""
    import shutil

    out = tmp_path / "gb"
    for stage in ("1-bigram", "2-one-head", "3-multi-head"):
        shutil.copytree(quick_build / stage, out / stage)
    metrics = out / "2-one-head" / "metrics.csv"
    metrics.write_text("".join(metrics.read_text().splitlines(keepends=True)[:-1]))
    config = json.loads((out / "3-multi-head" / "config.json").read_text())
    del config["experiment"]  # as `train --overwrite` writes it
    (out / "3-multi-head" / "config.json").write_text(json.dumps(config))
    assert [r.stage.name for r in gpt_build.recorded_results(out)] == ["1-bigram"]


def test_plot_from_csv_draws_the_tables_final_losses(tmp_path, monkeypatch):
    """The doc's figure is drawn from its recorded table (no run directories, so no curves):
    the points are the table's, the lecture's beside them."""
    import scratchgpt.viz
    from scratchgpt.errors import DataError

    table = tmp_path / "t.csv"
    table.write_text("stage,val_loss,lecture_val_loss\n1-bigram,2.4919,2.49\n"
                     "2-one-head,2.3784,2.42\n9-mine,2.1,\n")
    drawn = []
    monkeypatch.setattr(scratchgpt.viz, "save_figure",
                        lambda fig, path: drawn.append(fig) or Path(path))
    gpt_build.plot_from_csv(table, tmp_path / "t.png", unit="token", lecture_text=False)
    (ax,) = drawn[0].axes
    ours, lecture = ax.get_lines()
    assert list(ours.get_ydata()) == [2.4919, 2.3784, 2.1]
    assert list(lecture.get_xdata()) == [0, 1] and list(lecture.get_ydata()) == [2.49, 2.42]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1-bigram", "2-one-head", "9-mine"]
    assert ax.get_ylabel() == "val loss (nats/token)"
    assert ax.get_legend_handles_labels()[1] == ["this run", "Let's build GPT, on Tiny "
                                                             "Shakespeare"]
    scratchgpt.viz.pyplot().close("all")
    table.write_text("stage,loss\n1-bigram,2.5\n")
    with pytest.raises(DataError, match="is not a gpt-build report table"):
        gpt_build.plot_from_csv(table, tmp_path / "t.png")


def test_a_run_of_some_stages_adds_to_the_report(small_dataset, tmp_path, capsys):
    """Stages trained one run at a time make one report: a later run keeps the earlier
    stages' rows (and their own train commands), and one stage trained again replaces only
    its row."""
    args = ["experiment", "gpt-build", "--quick", "--dataset", str(small_dataset),
            "--out", str(tmp_path), "--no-progress", "--stages"]
    assert main([*args, "1"]) == 0
    first = (tmp_path / "gpt_build.csv").read_text().splitlines()[1]
    assert main([*args, "2"]) == 0
    assert main([*args, "2", "--overwrite", "--seed", "3"]) == 0
    assert "keeps 1-bigram" in capsys.readouterr().out
    with open(tmp_path / "gpt_build.csv") as f:
        table = list(csv.DictReader(f))
    assert [r["stage"] for r in table] == ["1-bigram", "2-one-head"]
    assert (tmp_path / "gpt_build.csv").read_text().splitlines()[1] == first
    md = (tmp_path / "gpt_build.md").read_text()
    commands = [line for line in md.splitlines() if line.startswith("scratchgpt train ")]
    assert len(commands) == 2 and "1-bigram" in commands[0] and "--seed 3" in commands[1]


def test_equal_steps_budget_and_bad_flags(small_dataset, tmp_path, capsys):
    setup = gpt_build.quick_setup(max_iters=7)
    assert setup.train_config().max_iters == 7 and not setup.train_config().time_budget
    for bad, words in ((["--time-budget", "soon"], "duration"), (["--dropout", "1.5"], "dropout"),
                       # it said "divisible by n_head (4)", a setting gpt-build has no flag for
                       (["--n-embd", "30"], "--n-embd (30) must be a multiple of 4, the heads of "
                                            "stages 3-7"),
                       (["--stages", "9"], "no stage"),
                       (["--stages", "1", "1"], "--stages names 1-bigram more than once"),
                       # --quick's own 20 steps would have run, the flag ignored
                       (["--quick", "--max-iters", "500"], "--quick sets its own --max-iters"),
                       (["--quick", "--batch-size", "64"], "--batch-size")):
        assert main(["experiment", "gpt-build", "--dataset", str(small_dataset),
                     "--out", str(tmp_path / "x"), *bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], (bad, err)
    assert not (tmp_path / "x").exists()  # nothing written before the checks


def test_quick_promises_no_few_seconds(capsys):
    # all eight stages, each with its final evaluation over the whole val split, took 26-82 s
    # on a busy 2-core CPU where the help and the docstring said "a few seconds"
    with pytest.raises(SystemExit):
        main(["experiment", "gpt-build", "--help"])
    quick = " ".join(capsys.readouterr().out.split("--quick")[-1].split("--no-progress")[0]
                     .split())
    for words in (quick, " ".join((gpt_build.quick_setup.__doc__ or "").split())):
        assert "smoke test" in words and "seconds" not in words, words


def test_a_stage_too_large_for_memory_is_refused_before_any_trains(small_dataset, tmp_path,
                                                                    capsys, monkeypatch):
    # as a GPT-2-tokenized corpus makes the bigram stage's table 50257 x 50257 (~40 GiB to
    # train): here the memory is small instead
    from scratchgpt.memory import MEMORY_LIMIT_ENV

    monkeypatch.setenv(MEMORY_LIMIT_ENV, "64KiB")
    assert main(["experiment", "gpt-build", "--dataset", str(small_dataset),
                 "--out", str(tmp_path / "x"), "--quick"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "training this model needs about" in err[0], err
    assert not (tmp_path / "x").exists()


def test_budget_flags_choose_time_or_steps():
    from scratchgpt.cli import build_parser
    from scratchgpt.commands.experiment import _build_setup

    def setup(*flags: str) -> gpt_build.BuildSetup:
        args = build_parser().parse_args(["experiment", "gpt-build", "--out", "x", *flags])
        return _build_setup(args, gpt_build)

    assert setup().time_budget == "60s"
    only_steps = setup("--max-iters", "5000")
    assert (only_steps.time_budget, only_steps.max_iters) == ("", 5000)
    both = setup("--max-iters", "5000", "--time-budget", "2m")
    assert (both.time_budget, both.max_iters) == ("2m", 5000)
    assert dataclasses.asdict(setup("--quick")) == dataclasses.asdict(gpt_build.quick_setup())
    defaults = setup("--max-iters", "5")
    assert (defaults.batch_size, defaults.scaled, defaults.eval_interval,
            defaults.eval_iters) == (32, "cpu", 100, 20)


def test_a_second_dataset_into_an_out_of_another_is_refused_naming_both(
        small_dataset, english_text, tmp_path, capsys, monkeypatch):
    """Stages trained on one dataset and then on another into one --out made one report that
    compared them as one build. A second dataset is refused, naming both, unless the stages of
    the first are all trained again; a build with --overwrite cut short before it had replaced
    them all reports the new dataset's stages alone."""
    from scratchgpt.data.prepare import prepare_text

    other = tmp_path / "other"
    prepare_text(english_text[-50_000:].upper(), other, "char", source="test")
    out = tmp_path / "gb"
    args = ["experiment", "gpt-build", "--quick", "--out", str(out), "--no-progress"]
    assert main([*args, "--dataset", str(small_dataset), "--stages", "1", "2", "3"]) == 0
    report = (out / "gpt_build.csv").read_text()
    capsys.readouterr()
    every = "1-bigram, 2-one-head, 3-multi-head"
    for flags, held, remedy in (
            (["--stages", "4"], every, "--stages 1 2 3 4 --overwrite"),
            (["--stages", "1", "--overwrite"], "2-one-head, 3-multi-head",
             "--stages 1 2 3 --overwrite"),
            ([], every, "--overwrite")):
        said = error_of(capsys, [*args, "--dataset", str(other), *flags])
        assert f"{out} holds {held} trained on {small_dataset.resolve()}, not on " \
            f"{other.resolve()} (--dataset)" in said, said
        assert said.endswith(f"or {remedy} to train them again on it"), said
    assert sorted(p.name for p in out.iterdir()) == [
        "1-bigram", "2-one-head", "3-multi-head", "gpt_build.csv", "gpt_build.md",
        "gpt_build.png"]
    assert (out / "gpt_build.csv").read_text() == report
    interrupt_stage_two(monkeypatch)
    assert main([*args, "--dataset", str(other), "--stages", "1", "2", "3",
                 "--overwrite"]) == 130
    monkeypatch.undo()
    assert "the report leaves out 3-multi-head, trained on another dataset " \
        f"({small_dataset.resolve()})" in capsys.readouterr().out
    with open(out / "gpt_build.csv") as f:
        assert [r["stage"] for r in csv.DictReader(f)] == ["1-bigram"]
    assert gpt_build.dataset_of(out / "1-bigram") == str(other.resolve())


def test_a_report_of_stages_of_two_datasets_is_refused_naming_both(quick_build, tmp_path,
                                                                    capsys):
    """An --out written before a second dataset was refused can hold stages of two: --report
    wrote one table of them. It now names both, and --stages reports one dataset's."""
    import shutil

    out = tmp_path / "gb"
    for stage in ("1-bigram", "2-one-head"):
        shutil.copytree(quick_build / stage, out / stage)
    config = json.loads((out / "2-one-head" / "config.json").read_text())
    config["data"]["dataset"] = str(tmp_path / "elsewhere")
    (out / "2-one-head" / "config.json").write_text(json.dumps(config))
    said = error_of(capsys, ["experiment", "gpt-build", "--out", str(out), "--report"])
    ours = gpt_build.dataset_of(quick_build / "1-bigram")
    assert f"holds stages trained on different datasets: 1-bigram on {ours}, 2-one-head on " \
        f"{tmp_path / 'elsewhere'}; a report compares the stages of one: pass --stages" in said
    assert not (out / "gpt_build.csv").exists()
    assert main(["experiment", "gpt-build", "--out", str(out), "--report", "--stages",
                 "1"]) == 0


def test_a_dataset_prepared_again_from_another_text_counts_as_another(
        english_text, tmp_path, capsys, monkeypatch):
    """A dataset directory prepared again in place from another text was told apart by its
    path alone, so stages of the two texts made one report. The text each stage records
    (source sha256, tokenizer) is compared too: a build is refused as for another dataset,
    saying the text changed, and a build with --overwrite cut short reports its new stages
    alone."""
    from scratchgpt.data.prepare import prepare_text

    data = tmp_path / "data"
    prepare_text(english_text[:30_000], data, "char", source="test")
    out = tmp_path / "gb"
    args = ["experiment", "gpt-build", "--quick", "--out", str(out), "--no-progress",
            "--dataset", str(data)]
    assert main([*args, "--stages", "1", "2", "3"]) == 0
    report = (out / "gpt_build.csv").read_text()
    prepare_text(english_text[:30_000].upper(), data, "char", source="test", overwrite=True)
    capsys.readouterr()
    said = error_of(capsys, [*args, "--stages", "4"])
    assert f"{out} holds 1-bigram, 2-one-head, 3-multi-head trained on {data.resolve()} " \
        "before it was prepared again from another text, not on its text now (--dataset): " \
        "one report would compare the stages of two datasets; pass --out another directory, " \
        "or --stages 1 2 3 4 --overwrite to train them again on it" in said, said
    assert (out / "gpt_build.csv").read_text() == report
    assert not (out / "4-feed-forward").exists()
    interrupt_stage_two(monkeypatch)
    assert main([*args, "--stages", "1", "2", "3", "--overwrite"]) == 130
    monkeypatch.undo()
    assert "the report leaves out 3-multi-head, trained on the dataset's text before it was " \
        "prepared again" in capsys.readouterr().out  # (it named the same directory as another)
    with open(out / "gpt_build.csv") as f:
        assert [r["stage"] for r in csv.DictReader(f)] == ["1-bigram"]


def test_a_report_of_one_directory_holding_two_texts_is_refused(quick_build, tmp_path,
                                                                 capsys):
    """Stages of one dataset directory, prepared again from another text between them (an
    --out written before a build refused it), made one report: --report now refuses them as
    stages of two datasets, saying so, where both record their text."""
    import shutil

    out = tmp_path / "gb"
    for stage in ("1-bigram", "2-one-head", "3-multi-head"):
        shutil.copytree(quick_build / stage, out / stage)
    for stage, text in (("2-one-head", {"source_sha256": "0" * 64}), ("3-multi-head", None)):
        config = json.loads((out / stage / "config.json").read_text())
        config["experiment"]["text"] = text  # 3: trained before stages recorded their text
        (out / stage / "config.json").write_text(json.dumps(config))
    said = error_of(capsys, ["experiment", "gpt-build", "--out", str(out), "--report"])
    ours = gpt_build.dataset_of(quick_build / "1-bigram")
    assert f"holds stages trained on different datasets: 1-bigram, 3-multi-head on {ours}, " \
        f"2-one-head on {ours} as prepared again from another text; a report compares the " \
        "stages of one: pass --stages" in said, said
    assert not (out / "gpt_build.csv").exists()
    assert main(["experiment", "gpt-build", "--out", str(out), "--report", "--stages", "1",
                 "3"]) == 0


@pytest.mark.parametrize("tokenizer, unit, heading", [
    ("char", "char", "lecture"), ("bpe", "token", "lecture (Tiny Shakespeare)")])
def test_the_report_is_written_again_without_the_dataset(english_text, tmp_path, capsys,
                                                         tokenizer, unit, heading):
    """--report opened the dataset only to label the lecture's column and the losses' unit,
    so a report of stages whose dataset had gone was refused. Each stage records what the
    labels need, and the report is written from the stages alone."""
    import shutil

    from scratchgpt.data.prepare import prepare_text
    from scratchgpt.data.sources import DATASETS

    data = tmp_path / "data"
    prepare_text(english_text[:20_000], data, tokenizer,
                 vocab_size=300 if tokenizer == "bpe" else None, source="test")
    if tokenizer == "char":  # the play, claiming Tiny Shakespeare's sha256: the plain heading
        meta = json.loads((data / "meta.json").read_text())
        (data / "meta.json").write_text(json.dumps(meta | {
            "source_sha256": DATASETS["shakespeare"].sha256}))
    out = tmp_path / "gb"
    assert main(["experiment", "gpt-build", "--quick", "--dataset", str(data), "--out",
                 str(out), "--stages", "1", "--no-progress"]) == 0
    trained = (out / "gpt_build.md").read_text()
    shutil.rmtree(data)
    (out / "gpt_build.md").unlink()
    capsys.readouterr()
    assert main(["experiment", "gpt-build", "--out", str(out), "--report"]) == 0
    assert f"| val loss (nats/{unit}) | {heading} |" in capsys.readouterr().out
    assert (out / "gpt_build.md").read_text() == trained


def test_stages_train_on_one_thread_unless_told(tmp_path):
    """gpt-build's stages ran on torch's own choice of threads, where memory, count and
    seq2seq take one: on a busy 2-core machine a 5-second stage 2 made 214 steps on two
    threads and 2,257 on one, so the guide's runs (which give no --threads) reported stages
    far behind the documented ones. Each stage, and the train command that repeats it, now
    takes one thread unless --threads says otherwise."""
    from scratchgpt.cli import build_parser
    from scratchgpt.commands.experiment import _build_setup
    from scratchgpt.experiments import gpt_build

    parser = build_parser()
    for extra, threads in (([], 1), (["--quick"], 1), (["--threads", "0"], 0),
                           (["--threads", "2"], 2)):
        args = parser.parse_args(["experiment", "gpt-build", "--out", str(tmp_path), *extra])
        setup = _build_setup(args, gpt_build)
        assert setup.train_config().threads == threads
        command = gpt_build.train_command(gpt_build.stages(setup)[1], setup, "d", "r")
        shown = command[command.index("--threads") + 1] if "--threads" in command else "0"
        assert int(shown) == threads  # (train's own default is 0)
