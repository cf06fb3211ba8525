"""What a classifier's fine-tuning run its --time-budget ended says before its final
evaluation: the validation and test texts that evaluation goes through, as many as it scores."""

from __future__ import annotations

import json
import re

from scratchgpt.checkpoints import load_checkpoint
from scratchgpt.finetune import classify
from tests.finetune.conftest import BUDGETED, classify_run, run_cli

SAID = re.compile(r"^--time-budget 0\.5s spent at step (\d+); evaluating the ([\d,]+) "
                  r"validation texts, then best\.pt on the ([\d,]+) test texts\.\.\.$", re.M)


def test_a_classify_run_its_budget_ended_says_what_it_evaluates(ft_dir, tmp_path, capsys,
                                                                 monkeypatch):
    """It said only 'running the final evaluation': it names the validation texts its final
    figures read and the test texts best.pt is then scored on, as many as each is."""
    said, scored = [], []
    real_final, real_scoring = classify.ClassifyTask.final_metrics, classify._loss_and_predictions

    def final_metrics(self, *args, **kwargs):
        said.append(capsys.readouterr().err)
        scored.clear()  # (the texts of the final evaluation alone: train's, then val's)
        return real_final(self, *args, **kwargs)

    def scoring(model, examples, *args, **kwargs):
        scored.append(len(examples))
        return real_scoring(model, examples, *args, **kwargs)

    monkeypatch.setattr(classify.ClassifyTask, "final_metrics", final_metrics)
    monkeypatch.setattr(classify, "_loss_and_predictions", scoring)
    out = tmp_path / "ft"
    code, _, err = run_cli(classify_run(ft_dir, out, *BUDGETED), capsys)
    assert code == 0, err
    assert len(said) == 1
    lines = SAID.findall(said[0])
    assert len(lines) == 1, said[0]  # before the evaluation began
    assert not SAID.search(err)  # said once
    step, val, test = (int(n.replace(",", "")) for n in lines[0])
    assert step == load_checkpoint(out / "last.pt").state.step
    assert len(scored) == 2 and scored[1] == val > 1, scored
    assert test == json.loads((out / "test_metrics.json").read_text())["total"] > 1
