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


@pytest.mark.parametrize("eval_generate", ["5", "0"])
def test_a_run_its_budget_ended_says_what_it_evaluates(ft_dir, tmp_path, capsys, monkeypatch,
                                                       eval_generate):
    """A run its --time-budget ended said only 'running the final evaluation': it names the
    held-out conversations whose response loss it takes and the greedy replies it generates
    (none without --eval-generate), as many as the run then reports."""
    import re

    from scratchgpt.checkpoints import load_checkpoint
    from scratchgpt.finetune import instruct

    said, real = [], instruct.InstructTask.final_metrics

    def final_metrics(self, *args, **kwargs):
        said.append(capsys.readouterr())  # (what the run printed by then)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(instruct.InstructTask, "final_metrics", final_metrics)
    out = tmp_path / "r"
    code, printed, err = run_cli(["finetune", "--task", "instruct", "--init-from",
                                  ft_dir / "base", "--data", ft_dir / "inst.json",
                                  "--held-out", "0.2", "--eval-generate", eval_generate,
                                  "--out", out, "--max-iters", "1000000", "--time-budget",
                                  "0.5s", "--batch-size", "4", "--eval-iters", "1",
                                  "--no-progress"], capsys)
    assert code == 0, err
    lines = re.findall(r"^--time-budget 0\.5s spent at step (\d+); evaluating the response "
                       r"loss over the (\d+) held-out conversations(?: and (\d+) greedy "
                       r"replies)?\.\.\.$", said[0].err, re.M) if len(said) == 1 else said
    assert len(lines) == 1, said  # before the evaluation began
    step, held, replies = lines[0]
    assert int(step) == load_checkpoint(out / "last.pt").state.step
    printed = said[0].out + printed
    assert f", {held} held out (seed" in printed, printed
    scored = re.findall(r"held-out exact match \S+ \(\d+/(\d+), greedy replies\)", printed)
    assert scored == ([replies] * 2 if replies else []), printed  # before and after training
    assert (replies == "5") == (eval_generate == "5")


@pytest.mark.parametrize("progress", [True, False])
def test_the_greedy_replies_show_a_progress_bar_unless_told_not_to(ft_dir, tmp_path, capsys,
                                                                   monkeypatch, progress):
    """--eval-generate N generated its replies before and after training (some 18 s on a busy
    machine) with nothing on the screen: a bar on stderr counts them, each time, once they
    have taken a second (here at once), and none under --no-progress (``progress=False``)."""
    import pickle

    from scratchgpt import bars
    from scratchgpt.finetune.plan import FinetuneRequest, plan, starting_figures
    from scratchgpt.training import job

    monkeypatch.setattr(bars, "PROGRESS_DELAY_S", 0.0)  # (a bar shows once it runs this long)
    train_job = plan(FinetuneRequest("instruct", str(ft_dir / "base"), str(tmp_path / "r"),
                                     str(ft_dir / "inst.json"), held_out=0.2, eval_generate=3,
                                     train_flags={"max_iters": 1, "batch_size": 4},
                                     progress=progress), log=None)
    starting_figures(train_job, log=None)
    before = capsys.readouterr().err
    # (--nproc's processes, each of which evaluates, make the task anew: without a bar)
    assert not pickle.loads(pickle.dumps(train_job.task))().progress
    result = job.run(train_job, progress=False)  # (the training's own bar aside)
    after = capsys.readouterr().err
    assert result.metrics["exact_match"] >= 0
    for err in (before, after):
        assert ("greedy replies: 100%" in err and " 3/3 " in err) == progress, err
        assert ("greedy replies" in err) == progress, err


@pytest.mark.parametrize("quiet, terminal", [(False, True), (True, True), (False, False)])
def test_finetune_draws_the_greedy_replies_bar_unless_no_progress(ft_dir, tmp_path, capsys,
                                                                  monkeypatch, quiet, terminal):
    """The command passes its --no-progress to the replies' bar: the bar was the library's
    alone, and ``finetune --eval-generate`` still said nothing while it generated. As every
    bar, it is drawn on a terminal only: a log or a pipe filled with its redraws."""
    import sys

    from scratchgpt import bars

    monkeypatch.setattr(bars, "PROGRESS_DELAY_S", 0.0)  # (a bar shows once it runs this long)
    monkeypatch.setattr(type(sys.stderr), "isatty", lambda self: terminal, raising=False)
    code, _, err = run_cli(["finetune", "--task", "instruct", "--init-from", ft_dir / "base",
                            "--data", ft_dir / "inst.json", "--held-out", "0.2",
                            "--eval-generate", "3", "--out", tmp_path / "r", "--max-iters", "1",
                            "--batch-size", "4", *(["--no-progress"] if quiet else [])], capsys)
    assert code == 0, err
    if quiet or not terminal:
        assert "greedy replies" not in err, err
    else:  # (before training and after it)
        assert err.count("greedy replies: 100%") >= 2 and " 3/3 " in err, err


def test_a_greedy_reply_stops_where_it_writes_another_turn_as_chats_does(monkeypatch):
    """A reply that goes on to write the next turn (``6\\n<|user|>\\n...``) is ``6`` to
    ``chat`` and ``serve``, which stop at any marker of the template: the exact match read
    the whole text and scored it a miss."""
    import torch

    import scratchgpt.generation.generate as generate
    from scratchgpt.chat import DEFAULT_TEMPLATE, TEMPLATES
    from scratchgpt.finetune.instruct import exact_match
    from scratchgpt.tokenizers import CharTokenizer

    template = TEMPLATES[DEFAULT_TEMPLATE]
    tok = CharTokenizer.train("<|system|>\n<|user|>\n<|assistant|>\n<|end|> What is+0123456789?")
    written = {"What is 3+3": "6\n<|user|>\nWhat is 1+1?", "What is 3+4": "7<|end|>"}

    def batch(model, ids, rule, sampling):  # (the tokens a model wrote, cut as the rule cuts)
        return [tok.encode(written[tok.decode(p).split("\n")[-3]]) for p in ids]

    monkeypatch.setattr(generate, "generate_batch", batch)
    chats = [[{"role": "user", "content": f"What is 3+{n - 3}"},
              {"role": "assistant", "content": str(n)}] for n in (6, 7)]
    ev = exact_match(torch.nn.Linear(1, 1), tok, template, chats)
    assert ev.replies == ["6", "7"] and ev.correct == 2  # (the line break is the template's)
