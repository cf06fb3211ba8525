"""The training progress bar: what it writes where stderr is a log file, not a terminal."""

import pytest

from scratchgpt.training.progress import Progress


@pytest.mark.parametrize("budget", [None, 90.0])
def test_a_log_file_gets_a_few_redraws_not_one_per_step(capsys, budget):
    bar = Progress(True, total_steps=1000, step=0, budget_s=budget, elapsed_s=0.0)
    for step in range(1, 1001):  # a thousand steps within the first redraw interval
        bar.update(step, loss=2.0, tokens_per_s=1e4, elapsed_s=step * 0.005)
    bar.close()
    err = capsys.readouterr().err
    assert 1 <= err.count("\r") <= 5, err[-300:]
    # the last drawing shows where training ended: step 1000, 5 s into a budget
    assert "step=1000" in err.split("\r")[-1]
    if budget:
        assert " 5/90s" in err.split("\r")[-1]


@pytest.mark.parametrize("step, elapsed", [(1000, 1.0), (10, 90.0)])
def test_a_run_with_nothing_left_to_train_draws_no_bar(capsys, step, elapsed):
    """A finished run resumed (at its last step, or past its budget) trains nothing: its
    bar would be a full one drawn twice under the note that says so."""
    bar = Progress(True, total_steps=1000, step=step, budget_s=90.0 if elapsed >= 90 else None,
                   elapsed_s=elapsed)
    bar.close()
    assert capsys.readouterr().err == ""
    Progress(True, total_steps=1000, step=999, budget_s=None, elapsed_s=1.0).close()
    assert "999/1000" in capsys.readouterr().err  # one step left: drawn
