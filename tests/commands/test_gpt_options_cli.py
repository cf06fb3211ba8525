"""GPT architecture options through the command line: each is a `train` flag, saved with the
run, and the run samples, evaluates and (where GPT-2 can express it) converts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from scratchgpt.cli import main

TINY = ["--n-embd", "32", "--block-size", "32", "--batch-size", "8", "--max-iters", "60",
        "--eval-interval", "30", "--eval-iters", "2", "--learning-rate", "1e-2",
        "--warmup-iters", "5", "--no-progress", "--dtype", "fp32"]
FLAGS = {
    # "Let's build GPT", step two: one self-attention head over the embeddings, nothing else
    "one-head": (["--n-layer", "1", "--n-head", "1", "--no-mlp", "--no-residual",
                  "--no-layernorm"],
                 dict(n_head=1, mlp=False, residual=False, layernorm=False)),
    # every speedrun option at once
    "speedrun": (["--n-layer", "4", "--n-head", "2", "--pos-encoding", "rope", "--qk-norm",
                  "--activation", "relu2", "--zero-init-proj", "--value-embeds", "1",
                  "--unet-skips", "--logit-softcap", "15", "--no-tie-weights", "--no-bias"],
                 dict(pos_encoding="rope", qk_norm=True, activation="relu2",
                      zero_init_proj=True, value_embeds=1, unet_skips=True, logit_softcap=15.0)),
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    from scratchgpt.data.prepare import prepare_text
    from tests.golden.runs import corpus

    path = tmp_path_factory.mktemp("data") / "words"
    prepare_text(corpus(), path, "char", source="test")
    return path


@pytest.mark.parametrize("name", FLAGS)
def test_option_flags_train_save_sample_and_eval(name, dataset, tmp_path, capsys):
    flags, expected = FLAGS[name]
    out = tmp_path / name
    assert main(["train", "--dataset", str(dataset), "--out", str(out), *TINY, *flags]) == 0
    saved = json.loads((out / "config.json").read_text())["model"]
    assert {k: saved[k] for k in expected} == expected
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(out), "--json"]) == 0
    val = json.loads(capsys.readouterr().out)["val_loss"]
    vocab = json.loads((dataset / "meta.json").read_text())["vocab_size"]
    assert val < math.log(vocab) - 0.3, val  # ln V: an untrained model
    assert main(["sample", "--checkpoint", str(out), "--prompt", "KING:", "--temperature", "0",
                 "--max-new-tokens", "40"]) == 0
    assert capsys.readouterr().out.startswith("KING:")


def test_an_option_gpt2_lacks_is_a_one_line_convert_error(dataset, tmp_path, capsys):
    out = tmp_path / "rope"
    assert main(["train", "--dataset", str(dataset), "--out", str(out), *TINY, "--max-iters",
                 "2", "--n-layer", "1", "--n-head", "2", "--pos-encoding", "rope"]) == 0
    capsys.readouterr()
    assert main(["convert", "--to", "hf", "--checkpoint", str(out),
                 "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--pos-encoding rope" in err and "\n" not in err
    assert not (tmp_path / "hf").exists()


def test_help_lists_the_options(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    for flag in ("--qk-norm", "--no-residual", "--no-layernorm", "--no-mlp", "--unet-skips",
                 "--value-embeds", "--logit-softcap", "--zero-init-proj", "relu2", "rope"):
        assert flag in text, flag
