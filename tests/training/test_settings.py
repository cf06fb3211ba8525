"""A run's settings layered from their sources (training/settings.py): named and checked
without the models, and a config file's key named as the file spells it."""

from __future__ import annotations

import subprocess
import sys


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
