"""The exact match of greedy replies that ``finetune --task instruct --eval-generate N``
reports before and after training."""

from __future__ import annotations

import json

import pytest

from tests.finetune.conftest import addition_records, run_cli


@pytest.mark.parametrize("eval_generate, scored, note", [
    ("5", 2, "note: --eval-generate 5 is more than the 2 held-out conversations: the exact "
             "match scores 2 (a larger --held-out holds out more)"),
    ("2", 2, None),
    ("1", 1, None)])
def test_eval_generate_beyond_the_held_out_conversations_says_it_scores_fewer(
        ft_dir, tmp_path, capsys, eval_generate, scored, note):
    """N above the held-out conversations decoded those there are, and said nothing: the
    report's 'x/2' read as the N asked for. A note says so; N within them gets none."""
    (tmp_path / "six.json").write_text(json.dumps(addition_records(6)))
    code, printed, err = run_cli(["finetune", "--task", "instruct", "--init-from",
                                  ft_dir / "base", "--data", tmp_path / "six.json",
                                  "--held-out", "0.3", "--eval-generate", eval_generate,
                                  "--out", tmp_path / "r", "--max-iters", "1",
                                  "--batch-size", "4", "--no-progress"], capsys)
    assert code == 0, err
    assert "4 conversations, 2 held out" in printed, printed
    assert (note in printed) if note else ("--eval-generate" not in printed), printed
    counts = [line.split("(")[1].split(",")[0] for line in printed.splitlines()
              if "held-out exact match" in line]
    assert len(counts) == 2 and all(c.endswith(f"/{scored}") for c in counts), printed
