"""A run's settings layered from their sources (training/settings.py): named and checked
without the models, and a config file's key named as the file spells it."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import pytest

from scratchgpt.errors import ConfigError
from scratchgpt.training.config import TrainConfig
from scratchgpt.training.settings import Settings, new_run


def test_naming_and_checking_a_runs_settings_imports_no_model():
    """Only the model types' names and hyperparameters are needed here: they come from the
    configs (plain data), not from the registry of the models, which imports torch and every
    network to list them."""
    code = ("import sys\n"
            "from scratchgpt.training.settings import Settings, known_settings, new_run\n"
            "assert 'n_layer' in known_settings()\n"
            "kind, values, train, _ = new_run(Settings(flags={'model': 'lstm', 'n_layer': 2}))\n"
            "print(kind, values, sorted(m for m in sys.modules if m.split('.')[0] == 'torch'\n"
            "                            or m.startswith('scratchgpt.models.')\n"
            "                            and not m.startswith('scratchgpt.models.configs')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "lstm {'n_layer': 2} []"


FLOAT_SETTINGS = [f.name for f in dataclasses.fields(TrainConfig) if f.type == "float"]


@pytest.mark.parametrize("name", FLOAT_SETTINGS)
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_every_float_setting_refuses_what_is_no_number(name, value):
    """Infinity and NaN are refused as what they are: the learning rate's was "must be > 0,
    got inf", a bound infinity does not break."""
    with pytest.raises(ConfigError, match=rf"^{name} must be a finite number, got "):
        TrainConfig(**{name: value})


def test_a_config_files_time_budget_in_seconds_is_a_finite_number(tmp_path):
    """A number in a file is seconds; ``inf`` was read as the duration "infs"."""
    conf = tmp_path / "c.toml"
    for text, message in (("inf", "must be a finite number, got inf"),
                          ("nan", "must be a finite number, got nan"),
                          ("-5", "must be > 0, got -5")):
        conf.write_text(f"time_budget = {text}\n")
        with pytest.raises(ConfigError) as refused:
            new_run(Settings(config_file=str(conf)))
        assert str(refused.value) == f"time_budget in {conf} {message}"
    conf.write_text("time_budget = 90\n")
    assert new_run(Settings(config_file=str(conf)))[2].time_budget_s == 90


def test_a_config_files_unknown_key_is_named_as_written_with_what_it_nearly_reads_as(
        tmp_path):
    """One check refuses what a config does not take (validation.refuse_unknown): a file's
    typo was 'c.toml: unknown settings: n_layers', with no word of the setting meant."""
    conf = tmp_path / "c.toml"
    for text, message in (("n_layers = 2", "n_layers; did you mean 'n_layer'?"),
                          ("[train]\nlr = 0.1", "lr; did you mean 'learning_rate'?"),
                          ("zz = 1\nyy = 2", "zz, yy")):
        conf.write_text(text + "\n")
        with pytest.raises(ConfigError) as refused:
            new_run(Settings(config_file=str(conf)))
        assert str(refused.value) == f"config file {conf} does not take {message}"


def test_a_run_resumed_by_another_command_is_named_with_its_article(tmp_path):
    """It said "is a lstm run of 'scratchgpt finetune'"."""
    from types import SimpleNamespace

    from scratchgpt.errors import CheckpointError
    from scratchgpt.training.settings import check_resumed_by

    for kind, task, said in (("lstm", "classify", "is an lstm run of 'scratchgpt finetune'"),
                             ("gpt", "instruct", "is a gpt run of 'scratchgpt finetune'")):
        run = SimpleNamespace(model_type=kind, data={"task": task}, path=tmp_path / "last.pt")
        with pytest.raises(CheckpointError) as e:
            check_resumed_by(run, "train")
        assert str(e.value).startswith(f"{tmp_path / 'last.pt'} {said}; resume it with "
                                       f"'scratchgpt finetune --out {tmp_path} --resume'"), e.value
