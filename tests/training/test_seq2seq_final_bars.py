"""A seq2seq run's final evaluation shows its progress, as a language model's does."""

import torch

from scratchgpt.data.translation import DataSpec
from scratchgpt.models.seq2seq import build_seq2seq
from scratchgpt.training.seq2seq import Seq2SeqTask
from scratchgpt.training.task import EvalSetting
from tests.eval_bars import last_drawing, quiet_and_shown


def test_the_final_evaluation_shows_its_bars_only_with_progress(capsys, monkeypatch):
    """The greedy decodes of the held-out pairs and their loss took minutes after the last
    step with nothing on the screen. With the run's ``EvalSetting.progress`` (progress on, on
    a terminal) each shows a bar to its last pair; without it none; the figures are the
    same either way."""
    from scratchgpt import bars

    monkeypatch.setattr(bars, "PROGRESS_DELAY_S", 0.0)  # drawn however short the pass
    task = Seq2SeqTask.from_spec(DataSpec(task="reverse", n_train=40, n_test=20, seed=0))
    torch.manual_seed(0)
    model = build_seq2seq(task.model_config("lstm", d_model=8))
    figures, quiet, shown = quiet_and_shown(task.fresh, model, 8, capsys)
    assert figures[0] == figures[1]
    assert "greedy decodes" not in quiet and "held-out loss" not in quiet, quiet
    held = len(task.held_out)
    for bar in ("greedy decodes", "held-out loss"):
        last = last_drawing(shown, bar)
        assert "100%" in last and f" {held}/{held} " in last, shown
    assert figures[0]["val_loss"] == (
        task.estimate(model, "val", held, EvalSetting(torch.device("cpu"), "fp32", 8, 0)))
