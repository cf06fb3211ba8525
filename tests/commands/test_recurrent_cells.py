"""``--cells scratch|torch``: recurrent LMs train with the cells written from their equations as
with torch's fused modules, to float tolerance; ``experiment memory --impl`` and
``bench recurrent`` expose the same choice."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest

from scratchgpt.cli import main
from tests.cli_errors import error_of

TINY = ["--model", "lstm", "--n-layer", "2", "--hidden", "16", "--block-size", "16",
        "--batch-size", "4", "--max-iters", "20", "--eval-interval", "10", "--eval-iters", "2",
        "--log-interval", "1", "--warmup-iters", "2", "--learning-rate", "1e-2",
        "--seed", "7", "--no-progress", "--dtype", "fp32"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    from scratchgpt.data.prepare import prepare_text

    rng = random.Random(0)
    words = "the cat sat on a mat and a dog ran to the sun".split()
    text = "\n".join(" ".join(rng.choice(words) for _ in range(8)) for _ in range(400))
    out = tmp_path_factory.mktemp("data") / "words"
    prepare_text(text, out, "char", source="test")
    return out


def losses(run: Path, column: str) -> list[float]:
    rows = csv.DictReader((run / "metrics.csv").open())
    return [float(r[column]) for r in rows if r[column]]


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_scratch_cells_train_like_torch_cells(dataset, tmp_path, cell):
    runs = {}
    for impl in ("torch", "scratch"):
        runs[impl] = tmp_path / impl
        flags = [f if f != "lstm" else cell for f in TINY]
        assert main(["train", "--dataset", str(dataset), "--out", str(runs[impl]),
                     "--cells", impl, *flags]) == 0
        saved = json.loads((runs[impl] / "config.json").read_text())["model"]
        assert saved["cells"] == impl
    for column in ("loss", "val_loss"):
        a, b = losses(runs["torch"], column), losses(runs["scratch"], column)
        assert len(a) == len(b) > 1
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-4, (column, a, b)
    assert losses(runs["torch"], "loss")[-1] < losses(runs["torch"], "loss")[0]  # it learned


def test_a_resume_may_switch_the_cells_and_trains_on_from_the_same_weights(dataset, tmp_path):
    """The cells of models/rnn.py read the parameters torch's modules own, in their layout: a
    run begun on torch's kernels and resumed on the scratch cells continues as it would have
    (it was refused as a change of the model)."""
    schedule = [*TINY[:TINY.index("--max-iters")], *TINY[TINY.index("--max-iters") + 2:],
                "--lr-decay-iters", "20"]
    full, half = tmp_path / "full", tmp_path / "half"
    assert main(["train", "--dataset", str(dataset), "--out", str(full), "--max-iters", "20",
                 *schedule]) == 0
    assert main(["train", "--dataset", str(dataset), "--out", str(half), "--max-iters", "10",
                 *schedule]) == 0
    assert main(["train", "--out", str(half), "--resume", "--max-iters", "20",
                 "--cells", "scratch", "--no-progress"]) == 0
    assert json.loads((half / "config.json").read_text())["model"]["cells"] == "scratch"
    a, b = losses(full, "loss"), losses(half, "loss")  # every update's (--log-interval 1)
    assert len(a) == len(b) == 20, (a, b)
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-4, (a, b)
    assert abs(losses(full, "val_loss")[-1] - losses(half, "val_loss")[-1]) < 1e-4


def test_a_gpt_resume_refuses_cells(dataset, tmp_path, capsys):
    run = tmp_path / "gpt"
    assert main(["train", "--dataset", str(dataset), "--out", str(run), "--n-layer", "1",
                 "--n-head", "1", "--n-embd", "8", "--block-size", "8", "--max-iters", "2",
                 "--eval-iters", "1", "--no-progress"]) == 0
    capsys.readouterr()
    err = error_of(capsys, ["train", "--out", str(run), "--resume", "--max-iters", "4",
                            "--cells", "scratch"])
    assert "does not take --cells" in err, err


def test_bad_cells_value_is_a_one_line_error(dataset, tmp_path, capsys):
    assert main(["train", "--dataset", str(dataset), "--out", str(tmp_path / "r"),
                 "--cells", "cuda", *TINY]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cells" in err[0]


def test_cells_is_not_a_gpt_setting(dataset, tmp_path, capsys):
    assert main(["train", "--dataset", str(dataset), "--out", str(tmp_path / "r"),
                 "--cells", "scratch", "--no-progress"]) == 2
    assert "--cells" in capsys.readouterr().err


def test_memory_experiment_gives_the_same_accuracies_with_scratch_cells(tmp_path, capsys):
    accuracy = {}
    for impl in ("torch", "scratch"):
        out = tmp_path / impl
        assert main(["experiment", "memory", "--quick", "--out", str(out), "--min-len", "3",
                     "--max-len", "4", "--hidden", "8", "--impl", impl]) == 0
        accuracy[impl] = list(csv.reader((out / "memory.csv").open()))
        assert f"({impl} cells)" in capsys.readouterr().out
    header, *rows = accuracy["torch"]
    assert header == accuracy["scratch"][0] == ["length", "rnn", "lstm"]
    for a, b in zip(rows, accuracy["scratch"][1:], strict=True):
        # 100 test sequences per length: one answer flipped by a 1e-6 difference moves 0.01
        assert all(abs(float(x) - float(y)) <= 0.011 for x, y in zip(a[1:], b[1:], strict=True))


def test_memory_quick_refuses_the_steps_it_would_ignore(tmp_path, capsys):
    assert main(["experiment", "memory", "--quick", "--steps", "5000",
                 "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--quick sets its own --steps" in err[0], err
    assert not (tmp_path / "m").exists()


def test_memory_refuses_a_forget_bias_without_an_lstm(tmp_path, capsys):
    """The forget gate is an LSTM's: with RNN and GRU cells alone --forget-bias changed
    nothing, silently."""
    assert main(["experiment", "memory", "--quick", "--cells", "rnn", "gru", "--forget-bias",
                 "5", "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--cells rnn gru has no LSTM" in err[0], err
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("bias", ["nan", "inf", "-inf"])
def test_memory_forget_bias_is_a_finite_number(bias, tmp_path, capsys):
    """A NaN bias was refused as "must be >= -inf, got nan", a bound it does not break."""
    err = error_of(capsys, ["experiment", "memory", "--quick", f"--forget-bias={bias}",
                            "--out", str(tmp_path / "m")])
    assert f"--forget-bias: expected a finite number, got '{bias}'" in err, err
    assert not (tmp_path / "m").exists()


def test_bench_recurrent_reports_both_paths(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["bench", "recurrent", "--cells", "rnn", "lstm", "--hidden", "8",
                 "--n-layer", "2", "--batch-size", "2", "--seq-len", "6", "--decode-tokens", "3",
                 "--repeats", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [r["cell"] for r in report["results"]] == ["rnn", "lstm"]
    for r in report["results"]:
        assert r["max_abs_logit_diff"] < 1e-5
        for impl in ("torch", "scratch"):
            assert r[f"{impl}_train_tokens_per_s"] > 0 and r[f"{impl}_decode_tokens_per_s"] > 0
        assert r["torch_speedup_train"] == pytest.approx(
            r["torch_train_tokens_per_s"] / r["scratch_train_tokens_per_s"])
    assert "sample tok/s" in capsys.readouterr().out


def test_bench_recurrent_default_shape_is_not_refused_for_memory(monkeypatch):
    """The default shape (two LSTM layers of 256, 32 rows of 128 tokens) trains a batch in
    ~0.15 GiB; the estimate counted each row's tokens again for every position of the
    config's unused 256-token context, so plain ``bench recurrent`` was refused as needing
    32.8 GiB on a machine with 19 GiB free."""
    from scratchgpt.bench import recurrent
    from scratchgpt.cli import build_parser

    monkeypatch.setenv("SCRATCHGPT_MEMORY_LIMIT", "1GiB")
    recurrent.check_fits(build_parser().parse_args(["bench", "recurrent"]))
