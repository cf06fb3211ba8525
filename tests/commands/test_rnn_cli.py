"""Recurrent LMs (``--model rnn|lstm|gru``) through the same train / sample / eval commands."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch

from scratchgpt.cli import main
from scratchgpt.models import MODEL_TYPES, build_model, config_fields, model_config

TINY_LSTM = ["--model", "lstm", "--n-layer", "1", "--hidden", "32", "--block-size", "32",
             "--batch-size", "8", "--eval-iters", "4", "--learning-rate", "1e-2",
             "--no-progress", "--dtype", "fp32"]


@pytest.fixture(scope="module")
def lstm_run(tmp_path_factory, small_dataset) -> Path:
    out = tmp_path_factory.mktemp("runs") / "lstm"
    assert main(["train", "--dataset", str(small_dataset), "--out", str(out), "--max-iters", "150",
                 "--eval-interval", "50", "--warmup-iters", "5", *TINY_LSTM]) == 0
    return out


def test_lstm_training_lowers_val_loss(lstm_run):
    rows = [r for r in csv.DictReader((lstm_run / "metrics.csv").open()) if r["val_loss"]]
    first, last = float(rows[0]["val_loss"]), float(rows[-1]["val_loss"])
    vocab = json.loads((lstm_run / "config.json").read_text())["model"]["vocab_size"]
    assert last < first - 0.1 and last < math.log(vocab) - 1.0, (first, last)  # ln V: untrained
    resolved = json.loads((lstm_run / "config.json").read_text())
    assert resolved["model"]["type"] == "lstm" and resolved["model"]["hidden"] == 32
    assert "cell" not in resolved["model"]  # the type names the cell


@pytest.mark.parametrize("flags", [
    ["--temperature", "0"], ["--temperature", "0.9", "--top-k", "5"],
    ["--top-p", "0.9"], ["--beam", "3"], ["--num-samples", "2"],
])
def test_every_sampling_method_runs(lstm_run, capsys, flags):
    assert main(["sample", "--checkpoint", str(lstm_run), "--prompt", "Th", "--seed", "1",
                 "--max-new-tokens", "12", *flags]) == 0
    assert capsys.readouterr().out.startswith("Th")


def test_greedy_equals_beam_one(lstm_run, capsys):
    base = ["sample", "--checkpoint", str(lstm_run), "--prompt", "Th", "--max-new-tokens", "15"]
    main([*base, "--temperature", "0"])
    greedy = capsys.readouterr().out
    main([*base, "--beam", "1"])
    assert capsys.readouterr().out == greedy


def test_eval_and_checkpoint_round_trip(lstm_run, tmp_path, capsys):
    from scratchgpt.checkpoints import load_model

    model, source = load_model(lstm_run, "last")
    assert type(model).__name__ == "RecurrentLM" and model.config.cell == "lstm"
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, source.checkpoint.model[name])
    assert main(["eval", "--checkpoint", str(lstm_run), "--json"]) == 0
    assert "val" in capsys.readouterr().out


def test_resume_continues(lstm_run, small_dataset, tmp_path):
    import shutil

    run = tmp_path / "r"
    shutil.copytree(lstm_run, run)
    assert main(["train", "--dataset", str(small_dataset), "--out", str(run), "--resume",
                 "--max-iters", "160", "--no-progress"]) == 0


def test_n_head_with_lstm_is_a_one_line_error(small_dataset, tmp_path, capsys):
    code = main(["train", "--dataset", str(small_dataset), "--model", "lstm", "--n-head", "4",
                 "--out", str(tmp_path / "r"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--n-head" in err[0]


def test_hidden_with_gpt_is_an_error(small_dataset, tmp_path, capsys):
    assert main(["train", "--dataset", str(small_dataset), "--hidden", "64",
                 "--out", str(tmp_path / "r"), "--no-progress"]) == 2
    assert "--hidden" in capsys.readouterr().err


@pytest.mark.parametrize("cell", ["rnn", "gru"])
def test_rnn_and_gru_train(small_dataset, tmp_path, cell):
    flags = [f if f != "lstm" else cell for f in TINY_LSTM]
    assert main(["train", "--dataset", str(small_dataset), "--out", str(tmp_path / "r"),
                 "--max-iters", "5", "--eval-interval", "5", *flags]) == 0


def test_registry_fixes_the_cell():
    for cell in ("rnn", "lstm", "gru"):
        assert "cell" not in config_fields(cell)
        model = build_model(model_config(cell, vocab_size=7, hidden=4, n_layer=1))
        assert model.config.cell == cell
        assert MODEL_TYPES[cell](vocab_size=7).cell == cell
    from scratchgpt.errors import ScratchGPTError

    with pytest.raises(ScratchGPTError):
        model_config("lstm", vocab_size=7, cell="gru")


def test_warandpeace_preset_is_a_4x512_lstm():
    from scratchgpt.training.config import PRESETS

    preset = PRESETS["warandpeace-lstm"]
    assert (preset["model"], preset["n_layer"], preset["hidden"]) == ("lstm", 4, 512)
    model = build_model(model_config("lstm", vocab_size=80, **{
        k: preset[k] for k in config_fields("lstm") if k in preset}))
    assert 8_000_000 < model.num_params() < 9_000_000


def test_num_samples_and_batch_prompts_go_through_the_batched_loop(lstm_run, tmp_path, capsys):
    """Recurrent models batch too (left padding leaves each row's state alone): every row
    equals the same prompt sampled alone."""
    base = ["sample", "--checkpoint", str(lstm_run), "--temperature", "0",
            "--max-new-tokens", "12"]
    alone = {}
    for prompt in ("Th", "KING RICHARD:", "a"):
        main([*base, "--prompt", prompt])
        alone[prompt] = capsys.readouterr().out.rstrip("\n")
    assert main([*base, "--prompt", "Th", "--num-samples", "2"]) == 0
    assert capsys.readouterr().out.split("\n---------------\n") == [alone["Th"] + "\n"] * 2
    (tmp_path / "p.txt").write_text("Th\nKING RICHARD:\n\na\n")
    assert main([*base, "--prompt-file", str(tmp_path / "p.txt"), "--batch-prompts"]) == 0
    got = capsys.readouterr().out.rstrip("\n").split("\n\n---------------\n")
    assert got == [alone["Th"], alone["KING RICHARD:"], alone["a"]]
