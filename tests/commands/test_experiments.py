"""``scratchgpt experiment memory`` and ``count``: what their result files and figures say."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from scratchgpt.cli import main
from scratchgpt.experiments import count, memory
from tests.cli_errors import error_of


def test_memory_plots_the_sequence_lengths_it_trained_on_and_says_how_far_back_that_is(
        tmp_path, monkeypatch):
    """The x-axis said 'sequence length (steps between the symbol and the answer)': a sequence
    of T symbols puts the first T - 1 steps before the answer, not T."""
    seen: list[int] = []
    real_batch = memory.FirstSymbolTask.train_batch

    def spy(self, *args, **kwargs):
        x, y = real_batch(self, *args, **kwargs)
        assert (y == x[:, 0]).all()  # the answer is the first symbol read...
        seen.append(x.shape[1])  # ...of T, the last read T - 1 steps after it
        return x, y

    figures = []
    real_figure = memory.figure

    def keep(*args, **kwargs):
        figures.append(real_figure(*args, **kwargs))
        return figures[-1]

    monkeypatch.setattr(memory.FirstSymbolTask, "train_batch", spy)
    monkeypatch.setattr(memory, "figure", keep)
    assert main(["experiment", "memory", "--quick", "--cells", "rnn", "--min-len", "3",
                 "--max-len", "5", "--hidden", "4", "--out", str(tmp_path)]) == 0
    lengths = [int(row["length"]) for row in csv.DictReader((tmp_path / "memory.csv").open())]
    assert lengths == sorted(set(seen)) == [3, 4, 5]
    ax = figures[0].axes[0]
    assert list(ax.lines[0].get_xdata()) == lengths
    label = ax.get_xlabel()
    assert label.startswith("sequence length T") and "T - 1 steps before the answer" in label


def test_memory_records_the_settings_that_produced_its_results(tmp_path, monkeypatch):
    """memory.csv and memory.png read alike whatever the sizes, steps or seed: two runs could
    not be told apart. settings.json beside them names each setting as its flag."""
    figures = []
    real_figure = memory.figure
    monkeypatch.setattr(memory, "figure",
                        lambda *a, **k: figures.append(real_figure(*a, **k)) or figures[-1])
    out = tmp_path / "m"
    assert main(["experiment", "memory", "--quick", "--cells", "lstm", "rnn", "--min-len", "3",
                 "--max-len", "4", "--hidden", "5", "--symbols", "3", "--batch-size", "6",
                 "--lr", "0.02", "--forget-bias", "2.5", "--mixed", "--seed", "11",
                 "--threads", "1", "--impl", "scratch", "--out", str(out)]) == 0
    settings = json.loads((out / "settings.json").read_text())
    assert settings == {"cells": ["lstm", "rnn"], "impl": "scratch", "min_len": 3,
                        "max_len": 4, "mixed": True, "symbols": 3, "hidden": 5,
                        "steps": 20, "batch_size": 6, "learning_rate": 0.02,
                        "forget_bias": 2.5, "eval_samples": 100, "seed": 11, "threads": 1}
    caption = " ".join(t.get_text() for t in figures[0].texts).replace("\n", " ")
    for part in ("one model for all lengths", "hidden 5", "20 steps", "batch 6", "lr 0.02",
                 "3 symbols", "forget bias 2.5", "100 tests per length", "seed 11",
                 "scratch cells"):
        assert part in caption, (part, caption)
    # without an LSTM there is no forget gate to record; the defaults are recorded too
    assert main(["experiment", "memory", "--cells", "gru", "--min-len", "2", "--max-len", "2",
                 "--hidden", "4", "--steps", "3", "--eval-samples", "7", "--out", str(out),
                 "--overwrite"]) == 0
    settings = json.loads((out / "settings.json").read_text())
    assert settings["forget_bias"] is None and "forget bias" not in memory.caption(settings)
    assert (settings["steps"], settings["eval_samples"], settings["seed"]) == (3, 7, 0)
    assert (settings["symbols"], settings["mixed"], settings["impl"]) == (8, False, "torch")


def test_memory_keeps_settings_json_of_an_earlier_run_without_overwrite(tmp_path, capsys):
    out = tmp_path / "m"
    out.mkdir()
    (out / "settings.json").write_text("{}")
    err = error_of(capsys, ["experiment", "memory", "--quick", "--out", str(out)])
    assert "holds settings.json; pass --overwrite" in err, err
    assert (out / "settings.json").read_text() == "{}"


def test_count_records_the_settings_that_produced_its_result(tmp_path, capsys):
    out = tmp_path / "c"
    assert main(["experiment", "count", "--out", str(out), "--cell", "lstm", "--modulus", "7",
                 "--hidden", "6", "--steps", "5", "--seed", "4", "--prompt", "5 6",
                 "--generate", "3"]) == 0
    result = json.loads((out / "count.json").read_text())
    assert result["settings"] == {"cell": "lstm", "modulus": 7, "hidden": 6, "steps": 5,
                                  "seed": 4, "threads": 1, "batch_size": count.BATCH,
                                  "row_length": count.ROW, "learning_rate": count.LEARNING_RATE}
    assert result["prompt"] == [5, 6] and len(result["generated"]) == 3
    said = capsys.readouterr().out
    assert f"loss {result['first_loss']:.3f} -> {result['final_loss']:.3f}" in said


def test_count_memory_check_counts_each_training_row_once(monkeypatch):
    """A GRU of 1,024 units counting modulo 20 needs ~0.15 GiB; the estimate multiplied its
    16-token rows by the config's 256-token context as well, and refused it below 8.6 GiB."""
    from scratchgpt.models.rnn import RecurrentConfig

    monkeypatch.setenv("SCRATCHGPT_MEMORY_LIMIT", "1GiB")
    count.check_fits(RecurrentConfig(vocab_size=20, cell="gru", n_layer=1, hidden=1024))


def test_memory_curves_that_coincide_all_show(tmp_path):
    """Every curve was the same size of circle: where the LSTM and the RNN both scored 100%,
    the later drawn hid the other, and the plot showed one network where there were two."""
    accuracy = {"rnn": [1.0, 1.0, 0.5], "lstm": [1.0, 1.0, 1.0], "gru": [1.0, 1.0, 1.0]}
    lines = memory.figure([3, 4, 5], accuracy, 8).axes[0].lines[:3]
    assert [line.get_label() for line in lines] == ["RNN", "LSTM", "GRU"]
    assert len({line.get_marker() for line in lines}) == 3
    sizes = [line.get_markersize() for line in lines]
    widths = [line.get_linewidth() for line in lines]
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == 3, sizes
    assert widths == sorted(widths, reverse=True) and len(set(widths)) == 3, widths


def test_memory_help_says_which_networks_it_trains_and_what_threads_0_is(capsys):
    """It said 'Train a tanh RNN and an LSTM' whatever --cells chose, and --threads took a 0
    it did not explain."""
    with pytest.raises(SystemExit):
        main(["experiment", "memory", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Train each network of --cells (default: a tanh RNN and an LSTM)" in text
    assert "Train a tanh RNN and an LSTM" not in text
    assert "0: torch's own choice" in text


def test_memory_help_says_how_many_steps_mixed_needs(capsys):
    """--help said that with --mixed the RNN 'copes': in the default 600 steps it scored
    23-27% at every length, near chance, and 100% in 3000 (docs/experiment_memory.md)."""
    with pytest.raises(SystemExit):
        main(["experiment", "memory", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    start = text.index("--mixed train one model")
    mixed = text[start:text.index("--batch-size BATCH_SIZE", start)]
    assert "--steps 3000" in mixed and "in the default 600 it stays near chance" in mixed, mixed


@pytest.mark.parametrize("lengths", [[5], [3, 4], list(range(4, 21)), list(range(2, 200))])
def test_memory_plots_whole_lengths_only(lengths):
    """--min-len 5 --max-len 5 put ticks at 4.74, 4.80 ... 5.22 under the one point."""
    fig = memory.figure(lengths, {"gru": [0.5] * len(lengths)}, 8)
    ax = fig.axes[0]
    fig.canvas.draw()
    low, high = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if low <= t <= high]
    assert ticks and all(t == int(t) for t in ticks), ticks
    assert set(lengths) <= set(ticks) or len(lengths) > 12, ticks


def test_count_without_a_prompt_counts_from_3_modulo_any_modulus(tmp_path, capsys):
    """The default prompt '3 4 5' was refused below --modulus 6, naming a --prompt nobody
    gave."""
    out = tmp_path / "c"
    assert main(["experiment", "count", "--modulus", "4", "--steps", "3", "--generate", "2",
                 "--out", str(out)]) == 0
    assert json.loads((out / "count.json").read_text())["prompt"] == [3, 0, 1]
    assert "3 0 1 -> " in capsys.readouterr().out
    err = error_of(capsys, ["experiment", "count", "--modulus", "4", "--prompt", "3 4",
                            "--out", str(tmp_path / "d")])  # a prompt given is still checked
    assert "--prompt needs numbers in [0, 3] (--modulus 4), got '3 4'" in err, err


@pytest.mark.parametrize("experiment", [["memory", "--quick", "--max-len", "5"],
                                        ["count", "--steps", "2"]])
def test_an_out_below_a_file_is_refused_before_anything_trains(experiment, tmp_path, capsys):
    """The folder's mkdir, after the training, found the file in the way: the models trained
    for nothing (minutes, by default) before the refusal."""
    (tmp_path / "f").write_text("mine")
    out = tmp_path / "f" / "results"
    assert main(["experiment", *experiment, "--out", str(out)]) == 2
    said = capsys.readouterr()
    assert said.out == ""  # no model was trained (each prints its accuracy)
    err = said.err.strip().splitlines()
    assert len(err) == 1 and f"--out {out} is below {tmp_path / 'f'}, a file, not a folder" \
        in err[0], err
    assert (tmp_path / "f").read_text() == "mine"


@pytest.mark.parametrize("experiment", [["memory", "--quick", "--max-len", "5"],
                                        ["count", "--steps", "2"]])
def test_an_out_where_nothing_can_be_written_is_refused_before_anything_trains(
        experiment, capsys):
    """An --out no file can be made in was found by the writes after the training: the
    models (minutes of them, by default) trained for nothing, then 'No such file or
    directory: /proc/m'. /proc takes no new file, whoever runs the test (a read-only folder
    takes one from root)."""
    if not Path("/proc/self").is_dir():
        pytest.skip("no /proc on this system")
    out = Path("/proc/scratchgpt-experiment/results")
    assert main(["experiment", *experiment, "--out", str(out)]) == 2
    said = capsys.readouterr()
    assert said.out == ""  # no model was trained (each prints its accuracy)
    err = said.err.strip().splitlines()
    assert len(err) == 1 and f"--out {out}: no file can be written in /proc (" in err[0], err


@pytest.mark.parametrize("experiment", ["count", "memory"])
def test_ctrl_c_says_the_experiment_stops_without_promising_a_last_pt(experiment, tmp_path,
                                                                     capsys, monkeypatch):
    """Ctrl-C during training said 'stopping after this step and saving last.pt', the
    trainer's words for a run directory; an experiment's models are kept in no file."""
    import os
    import signal

    task = count.CountingTask if experiment == "count" else memory.FirstSymbolTask
    real, calls = task.train_batch, {"n": 0}

    def interrupting(self, *args, **kw):
        calls["n"] += 1
        if calls["n"] == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return real(self, *args, **kw)

    monkeypatch.setattr(task, "train_batch", interrupting)
    argv = ["experiment", experiment, "--out", str(tmp_path / "x")]
    argv += ["--steps", "20"] if experiment == "count" else ["--quick"]
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert "SIGINT: stopping after this step (send it again" in err, err
    assert "last.pt" not in err and not (tmp_path / "x").exists()
