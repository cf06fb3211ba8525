"""Length batching and defaults of seq2seq training."""

import random
from typing import Any

import pytest
import torch

from scratchgpt import memory
from scratchgpt.data.translation import DataSpec
from scratchgpt.errors import ConfigError
from scratchgpt.training.epochs import length_batches
from scratchgpt.training.seq2seq import (
    Seq2SeqTask,
    length_bucket,
    longest_pair,
    plan,
    train_config,
    training_memory,
)
from scratchgpt.training.task import EvalSetting
from tests.training.test_budget_end import (
    assert_warm_up_batch_draws_nothing,
    assert_warm_up_is_exact,
)


def test_length_batches_cover_everything_once_and_group_lengths():
    lengths = [random.Random(i).randint(1, 30) for i in range(1000)]
    batches = length_batches(lengths, 64, torch.Generator().manual_seed(0))
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(1000))
    spread = [max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches]
    assert sum(spread) / len(spread) <= 2


def test_length_batches_follow_the_generator():
    lengths = [random.Random(i).randint(1, 30) for i in range(300)]
    a = length_batches(lengths, 16, torch.Generator().manual_seed(1))
    b = length_batches(lengths, 16, torch.Generator().manual_seed(1))
    c = length_batches(lengths, 16, torch.Generator().manual_seed(2))
    assert a == b and a != c


def test_length_bucket():
    assert length_bucket(1) == " 1-5" and length_bucket(5) == " 1-5" and length_bucket(6) == " 6-10"


def test_train_config_defaults_to_a_time_budget_unless_iterations_are_given():
    budget = train_config({})
    assert budget.time_budget_s == 600 and budget.max_iters > 10**9
    assert budget.min_lr == 0.05 * budget.learning_rate
    steps = train_config({"max_iters": 50, "learning_rate": 1e-3})
    assert steps.time_budget_s is None and steps.max_iters == 50
    assert steps.min_lr == 0.05 * 1e-3


def _tsv(path, pairs):
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs))
    return DataSpec(task=None, path=str(path), valid_fraction=0.3)


def test_memory_is_counted_from_the_pairs_not_the_position_table(tmp_path, monkeypatch):
    """A position table far longer than the pairs costs nothing to train (it was counted as
    if every pair filled it: --max-positions 20001 with dates of ~30 characters was refused
    as needing gigabytes), while a long pair's attention is counted: every attention keeps
    its weights, heads x length**2 per layer, for the backward pass (they were not counted,
    and a pair of 20,000 characters failed to allocate some 77 GB)."""
    monkeypatch.setenv("SCRATCHGPT_MEMORY_LIMIT", "1GiB")
    dates = DataSpec(task="dates", n_train=200, n_test=20)
    job = plan(dates, None, {"max_iters": 1}, {"max_positions": 20001, "d_model": 16},
               str(tmp_path / "run"), resume=False, overwrite=False)
    assert job.model.max_positions == 20001 and not (tmp_path / "run").exists()

    words = [("abc", "cba"), ("bca", "acb"), ("cab", "bac")] * 10
    task = Seq2SeqTask.from_spec(_tsv(tmp_path / "p.tsv", [*words, ("ab" * 1000, "ba")]))
    config = task.model_config("transformer", max_positions=2002)
    source, target = longest_pair(task)
    assert (source, target) == (2001, 4)
    fixed = {"weights": 0}
    one = training_memory(config, fixed, 1, source, target).parts["attention"]
    assert one >= config.n_layer * config.n_head * source**2 * 4  # the encoder's weights
    assert training_memory(config, fixed, 8, source, target).parts["attention"] == 8 * one
    table = task.model_config("transformer", max_positions=20001)
    assert training_memory(table, fixed, 1, source, target) == \
        training_memory(config, fixed, 1, source, target)


def test_the_final_evaluation_decodes_a_training_batch_at_a_time(tmp_path, monkeypatch):
    """The final evaluation decoded 256 held-out pairs at a time, whatever --batch-size: a
    batch small enough to train on long pairs could not be evaluated. It decodes a training
    batch at a time, and where even that does not fit, the run is refused before training."""
    from scratchgpt.models.seq2seq import build_seq2seq
    from scratchgpt.training import seq2seq as seq2seq_training

    letters = "abcdefgh"
    pairs = [(f"{a}{b}", (a + b) * 750) for a in letters for b in letters[:5]]
    spec = _tsv(tmp_path / "long-targets.tsv", pairs)
    task = Seq2SeqTask.from_spec(spec)
    assert task.held_examples and max(len(y) for _, y in task.held_examples) == 1500
    seen = []
    real = seq2seq_training.translate

    def spy(*args, batch_size=256, **kwargs):
        seen.append(batch_size)
        return real(*args, batch_size=batch_size, **kwargs)

    monkeypatch.setattr(seq2seq_training, "translate", spy)
    model = build_seq2seq(task.model_config("lstm", d_model=8))
    setting = EvalSetting(torch.device("cpu"), "float32", 3, 0)
    task.final_metrics(model, 1, setting)
    assert seen == [3]

    # decoding 4 outputs of up to 1,502 tokens (the longest target plus 2; it was 3,002,
    # which took more than training on them) takes less than training on 4 such pairs, so a
    # run that can train can evaluate; where the decodes alone do not fit, the check says so
    config = task.model_config("transformer", max_positions=4000)
    parts = memory.training_estimate(config, 1).parts
    fixed = {k: v for k, v in parts.items() if k != "activations"}
    training = training_memory(config, fixed, 4, *longest_pair(task)).total
    decoding = seq2seq_training.decode_estimate(config, 4, 3, 1502).total + fixed["weights"]
    assert decoding < training
    with pytest.raises(ConfigError, match=r"decoding the held-out pairs for the final "
                       r"evaluation, 4 at a time, needs about .*: give a smaller --batch-size"):
        seq2seq_training._check_final_eval_fits(task, config, 4, fixed["weights"],
                                                torch.device("cpu"), decoding - 1)
    seq2seq_training._check_final_eval_fits(task, config, 4, fixed["weights"],
                                            torch.device("cpu"), decoding)


def _varied_decoder(n_test: int) -> tuple[Seq2SeqTask, Any, list[int]]:
    """A reverse task with ``n_test`` held-out pairs and an untrained LSTM-attention model
    whose outputs differ from source to source and end at steps that differ from row to row
    (:func:`_ending_at_s`); -> (task, model, the steps each decode runs)."""
    from scratchgpt.models.seq2seq import build_seq2seq

    task = Seq2SeqTask.from_spec(DataSpec(task="reverse", n_train=200, n_test=n_test))
    torch.manual_seed(0)
    model = build_seq2seq(task.model_config("lstm-attention", d_model=16))
    with torch.no_grad():
        model.head.weight.mul_(10.0)  # outputs that differ from source to source
    return task, model, _ending_at_s(model, task.tgt_tok)


def _ending_at_s(model, tgt_tok) -> list[int]:
    """Make ``model`` write ``<eos>`` right after each ``s`` it writes (so its random outputs
    end at steps that differ from row to row, and some never end); -> the number of steps
    each decode ran (one call of ``next_token_logp`` a step)."""
    real, s_id, steps = model.next_token_logp, tgt_tok.stoi["s"], []

    def next_token_logp(state, prev):
        logp, attn = real(state, prev)
        steps.append(prev.shape[0])
        logp[prev == s_id, model.config.eos_id] = 1.0  # above every log-probability
        return logp, attn

    model.next_token_logp = next_token_logp
    return steps


def test_a_batch_decodes_as_each_pair_alone_and_stops_once_every_row_ended():
    """The final check decodes a batch at a time: rows that end early get the same output as
    decoded alone, a batch whose rows have all ended stops there, and no output runs past
    the longest target plus its <eos> and one token (it ran to twice the longest, plus 2)."""
    from scratchgpt.training.seq2seq import EVAL_MARGIN, evaluate

    task, model, steps = _varied_decoder(24)
    longest = max(len(t) for _, t in task.held_out)
    alone = evaluate(model, task.held_out, task.src_tok, task.tgt_tok, batch_size=1)
    ended = [p for p in alone.predictions if len(p) < longest + EVAL_MARGIN]
    assert 0 < len(ended) < len(alone.predictions)  # some rows end, at various steps
    assert len({len(p) for p in ended}) > 1
    assert max(steps) == 1 and len(steps) <= len(task.held_out) * (longest + EVAL_MARGIN)
    # targets that every other ended output matches, so that exact match is neither 0 nor 1
    pairs = [(s, p if i % 2 and p in ended else t) for i, ((s, t), p)
             in enumerate(zip(task.held_out, alone.predictions, strict=True))]
    matched = sum(1 for i, p in enumerate(alone.predictions) if i % 2 and p in ended)
    assert 0 < matched < len(pairs)
    steps.clear()
    per_pair = evaluate(model, pairs, task.src_tok, task.tgt_tok, batch_size=1)
    steps.clear()
    batched = evaluate(model, pairs, task.src_tok, task.tgt_tok, batch_size=len(pairs))
    assert batched.predictions == per_pair.predictions
    assert (batched.correct, batched.by_length) == (per_pair.correct, per_pair.by_length)
    assert batched.correct == matched
    longest = max(len(t) for _, t in pairs)
    assert len(steps) == longest + EVAL_MARGIN  # a row never ended: the longest, no more
    ending = [pair for pair, p in zip(pairs, alone.predictions, strict=True) if p in ended]
    steps.clear()
    evaluate(model, ending, task.src_tok, task.tgt_tok, batch_size=len(ending))
    assert len(steps) == max(len(p) for p in ended) + 1  # stopped at the last row's <eos>


def test_a_fresh_task_draws_as_a_new_one_on_the_same_pairs():
    """bench seq2seq made the pairs again for each model it trains: each now trains on
    task.fresh(), the pairs made and encoded once. It draws the batches a task made anew
    draws, whatever the task it came from drew, leaves that one's draws alone, and has no
    final evaluation."""
    from scratchgpt.training.seq2seq import EvalResult

    spec = DataSpec(task="reverse", n_train=200, n_test=24)

    def first_sources(task: Seq2SeqTask) -> list[list[int]]:
        gen = torch.Generator().manual_seed(0)
        return [task.train_batch(16, gen)[0].tolist() for _ in range(3)]

    new = first_sources(Seq2SeqTask.from_spec(spec))
    task = Seq2SeqTask.from_spec(spec)
    assert first_sources(task) == new
    task.final_eval = EvalResult(1, 1, {}, ["x"])
    drawn = task.epochs.state_dict()
    fresh = task.fresh()
    assert fresh.examples is task.examples and fresh.held_examples is task.held_examples
    assert fresh.final_eval is None and task.final_eval is not None
    assert first_sources(fresh) == new
    assert task.epochs.state_dict() == drawn


def test_the_final_check_decodes_batches_of_similar_targets_each_to_its_own_bound():
    """The final check decoded every batch to the longest held-out target plus 2, which an
    undertrained model (ending no output) filled every time. It decodes the pairs in batches
    of similar target length, each to its own longest target plus 2: the same figures as
    decoding every batch to the longest of all, in fewer steps."""
    from scratchgpt.training.seq2seq import EVAL_MARGIN, evaluate, evaluate_by_length

    task, model, steps = _varied_decoder(48)
    alone = evaluate(model, task.held_out, task.src_tok, task.tgt_tok, batch_size=1)
    # every other output that ended is made its pair's target: exact match neither 0 nor 1
    pairs = [(s, p if i % 2 and p.endswith("s") else t) for i, ((s, t), p)
             in enumerate(zip(task.held_out, alone.predictions, strict=True))]
    calls = _decode_calls(model, steps)
    steps.clear()
    whole = evaluate(model, pairs, task.src_tok, task.tgt_tok, batch_size=8)
    whole_steps, whole_calls = len(steps), calls[:]
    steps.clear()
    calls.clear()
    by_length = evaluate_by_length(model, pairs, task.src_tok, task.tgt_tok, batch_size=8)
    assert 0 < by_length.correct < len(pairs) and by_length.total == len(pairs)
    assert (by_length.correct, by_length.by_length) == (whole.correct, whole.by_length)
    targets = sorted(len(t) for _, t in pairs)
    bounds = [max(targets[i:i + 8]) + EVAL_MARGIN for i in range(0, len(pairs), 8)]
    assert [(rows, bound) for rows, bound, _ in calls] == [(8, b) for b in bounds]
    assert len(set(bounds)) > 1 and {b for _, b, _ in whole_calls} == {max(bounds)}
    assert all(0 < ran <= bound for _, bound, ran in calls)  # no batch ran past its bound
    assert len(steps) < whole_steps


def _decode_calls(model, steps: list[int]) -> list[tuple[int, int, int]]:
    """(rows, max_len, steps it ran) of each greedy decode of ``model`` from here on;
    ``steps``: :func:`_ending_at_s`'s list, one entry a step."""
    real, calls = model.greedy_decode, []

    def greedy_decode(src, lengths, max_len, out=None):
        before = len(steps)
        result = real(src, lengths, max_len, out=out)
        calls.append((src.size(0), max_len, len(steps) - before))
        return result

    model.greedy_decode = greedy_decode
    return calls


@pytest.mark.parametrize(("given", "decoded"), [("12", 12), ("0", 40)])
def test_a_seq2seq_run_its_budget_ended_says_how_many_pairs_it_decodes(
        cli_main, tmp_path, capsys, monkeypatch, given, decoded):
    """After its budget, a seq2seq run printed nothing while it scored the held-out pairs
    (minutes, once): it says how many it decodes and to what length, decodes as many, no
    output past its batch's longest target plus 2, and reports that count."""
    from scratchgpt.checkpoints import load_checkpoint
    from scratchgpt.models.seq2seq import Seq2Seq
    from scratchgpt.training.seq2seq import EVAL_MARGIN, seq2seq_task

    calls = []
    real = Seq2Seq.greedy_decode

    def greedy_decode(self, src, lengths, max_len, out=None):
        ids, attn = real(self, src, lengths, max_len, out=out)
        calls.append((src.size(0), max_len, max(len(x) for x in ids)))
        return ids, attn

    monkeypatch.setattr(Seq2Seq, "greedy_decode", greedy_decode)
    run = tmp_path / "run"
    assert cli_main(["seq2seq", "train", "--task", "reverse", "--out", str(run), "--n-train",
                     "300", "--n-test", "40", "--d-model", "16", "--batch-size", "32",
                     "--time-budget", "0.3s", "--eval-pairs", given, "--no-progress",
                     "--threads", "1"]) == 0
    out, err = capsys.readouterr()
    step = load_checkpoint(run / "last.pt").state.step
    which = f"the first {decoded}" if decoded < 40 else "all of them"
    assert (f"--time-budget 0.3s spent at step {step}; evaluating the loss over 40 held-out "
            f"pairs and greedy decodes of {which} (in batches of similar target length, each "
            f"to its longest target + {EVAL_MARGIN} tokens)...") in err.splitlines(), err
    assert f"/{decoded})\n" in out.split("source chars")[0], out
    ckpt = load_checkpoint(run / "last.pt")
    task = seq2seq_task(ckpt.data["seq2seq"], ckpt.tokenizers)
    targets = sorted(len(t) for _, t in task.held_out[:decoded])
    bounds = [max(targets[i:i + 32]) + EVAL_MARGIN for i in range(0, decoded, 32)]
    assert [(rows, bound) for rows, bound, _ in calls] == \
        [(min(32, decoded - i), b) for i, b in zip(range(0, decoded, 32), bounds, strict=True)]
    assert all(longest <= bound for _, bound, longest in calls)



def test_the_warm_up_batch_draws_nothing():
    spec = DataSpec(task="reverse", n_train=30, n_test=6)
    assert_warm_up_batch_draws_nothing(lambda: Seq2SeqTask.from_spec(spec), rows=8)


def test_a_seq2seq_runs_warm_up_changes_nothing_it_computes(cli_main, tmp_path, capsys,
                                                            monkeypatch):
    """seq2seq train (a time budget by default) paid its first step's one-off set-up inside
    the budget: its task had no warm-up batch, so the trainer skipped it. Its warm-up
    (dropout on, so the random state counts) leaves the run bit for bit as it was."""
    def train(out):
        assert cli_main(["seq2seq", "train", "--task", "reverse", "--out", str(out),
                         "--n-train", "100", "--n-test", "10", "--d-model", "16",
                         "--dropout", "0.1", "--batch-size", "8", "--max-iters", "4",
                         "--eval-pairs", "2", "--no-progress", "--threads", "1"]) == 0, \
            capsys.readouterr().err

    assert_warm_up_is_exact(train, Seq2SeqTask, tmp_path, monkeypatch)
