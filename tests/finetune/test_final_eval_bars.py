"""A fine-tuning run's final evaluation shows its progress, as a language model's does."""

from __future__ import annotations

import pytest

from tests.eval_bars import last_drawing, quiet_and_shown


@pytest.mark.parametrize("task, data, bar", [("classify", "labels.tsv", "val split"),
                                             ("instruct", "inst.json", "held-out loss")])
def test_the_final_evaluation_shows_a_bar_only_with_progress(ft_dir, tmp_path, capsys,
                                                             monkeypatch, task, data, bar):
    """The pass over the whole validation split (the held-out conversations) after the last
    step showed nothing while it ran. With the run's ``EvalSetting.progress`` (progress on,
    on a terminal) it shows a bar to the split's end; without it none; the figures are the
    same either way."""
    from scratchgpt import bars
    from scratchgpt.finetune.plan import FinetuneRequest, plan

    monkeypatch.setattr(bars, "PROGRESS_DELAY_S", 0.0)  # drawn however short the pass
    train_job = plan(FinetuneRequest(task, str(ft_dir / "base"), str(tmp_path / "r"),
                                     str(ft_dir / data), held_out=0.2,
                                     train_flags={"max_iters": 1, "batch_size": 4}), log=None)
    figures, quiet, shown = quiet_and_shown(train_job.task, train_job.init.model(), 4, capsys)
    assert figures[0] == figures[1]
    assert bar not in quiet, quiet
    examples = train_job.task().examples
    n = len(examples.splits["val"] if task == "classify" else examples.held_out)
    last = last_drawing(shown, bar)
    assert "100%" in last and f" {n}/{n} " in last, shown
