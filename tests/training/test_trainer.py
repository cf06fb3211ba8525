import csv
import math
import os
import signal

import pytest
import torch

from scratchgpt.checkpoints import load_checkpoint
from scratchgpt.data.dataset import TokenDataset
from scratchgpt.errors import ScratchGPTError
from scratchgpt.generation.sampling import SamplingConfig
from scratchgpt.models import model_config
from scratchgpt.models.bigram import BigramConfig
from scratchgpt.models.classifier import GPTClassifierConfig
from scratchgpt.models.gpt import GPTConfig
from scratchgpt.models.lora import GPTLoRAConfig, LoRAConfig
from scratchgpt.models.rnn import RecurrentClassifierConfig, RecurrentConfig
from scratchgpt.models.seq2seq import Seq2SeqConfig
from scratchgpt.training.config import TrainConfig, parse_duration
from scratchgpt.training.job import train
from scratchgpt.training.optim import lr_at
from tests.interrupts import interrupt_at

MODEL = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, dropout=0.1)


def cfg(**kw) -> TrainConfig:
    base = dict(batch_size=8, max_iters=40, eval_interval=20, eval_iters=4, log_interval=5,
                learning_rate=3e-3, warmup_iters=5, dtype="fp32")
    base.update(kw)
    return TrainConfig(**base)


def gpt(data: TokenDataset, **kw):
    return model_config("gpt", vocab_size=data.vocab_size, **{**MODEL, **kw})


def test_training_lowers_val_loss_and_writes_run_files(small_dataset, tmp_path):
    data = TokenDataset(small_dataset)
    res = train(cfg(max_iters=80), gpt(data), data, tmp_path / "run", progress=False)
    uniform = math.log(data.vocab_size)  # the loss of a uniform guess
    assert res.val_loss < uniform - 0.75, (res.val_loss, uniform)
    for f in ("last.pt", "best.pt", "config.json", "metrics.csv", "loss.png", "tokenizer.json"):
        assert (tmp_path / "run" / f).is_file(), f
    rows = list(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))
    vals = [float(r["val_loss"]) for r in rows if r["val_loss"]]
    assert vals[-1] < vals[0]


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_resume_gives_the_same_result_as_an_uninterrupted_run(small_dataset, tmp_path, optimizer):
    data = TokenDataset(small_dataset)
    # The same schedule (decay over 40 updates) in both; the second run stops at 20 and resumes.
    # The resumed call gives the run's own optimizer (its TrainConfig names one; another is
    # refused, as its saved state is that optimizer's).
    full = train(cfg(max_iters=40, lr_decay_iters=40, optimizer=optimizer), gpt(data), data,
                 tmp_path / "a", progress=False)
    train(cfg(max_iters=20, lr_decay_iters=40, optimizer=optimizer), gpt(data), data,
          tmp_path / "b", progress=False)
    resumed = train(cfg(max_iters=40, lr_decay_iters=40, optimizer=optimizer), None, data,
                    tmp_path / "b", resume=True, progress=False)
    assert resumed.step == 40
    assert resumed.val_loss == full.val_loss
    a = load_checkpoint(tmp_path / "a" / "last.pt").model
    b = load_checkpoint(tmp_path / "b" / "last.pt").model
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_best_pt_is_the_model_of_the_lowest_val_loss_once_val_rises(small_dataset, tmp_path,
                                                                     monkeypatch):
    """A small text over-fits: val falls, then rises. best.pt must be the model of the lowest
    evaluation (scripted here: update 20 of 40), last.pt the last one."""
    from scratchgpt.training.task import LanguageModelTask

    data = TokenDataset(small_dataset)
    real = LanguageModelTask.estimate
    # val at updates 20 and 40; the exact final loss (real, so above 0) comes after
    scripted = iter([0.0, 1e-3])

    def estimate(self, model, split, iters, setting):
        loss = real(self, model, split, iters, setting)
        return next(scripted) if split == "val" else loss

    monkeypatch.setattr(LanguageModelTask, "estimate", estimate)
    schedule = dict(lr_decay_iters=40, eval_interval=20)
    res = train(cfg(max_iters=40, **schedule), gpt(data), data, tmp_path / "run", progress=False)
    monkeypatch.undo()
    best = load_checkpoint(tmp_path / "run" / "best.pt")
    assert res.step == 40 and res.val_loss > 0 and res.best_val_loss == 0.0
    assert best.state.step == 20
    # best.pt's weights are the model after update 20 of the same 40-update schedule.
    train(cfg(max_iters=20, **schedule), gpt(data), data, tmp_path / "half", progress=False)
    at_20 = load_checkpoint(tmp_path / "half" / "last.pt").model
    last = load_checkpoint(tmp_path / "run" / "last.pt").model
    assert all(torch.equal(best.model[k], at_20[k]) for k in at_20)
    assert not all(torch.equal(last[k], at_20[k]) for k in at_20)


@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stop_signal_finishes_the_step_saves_and_resumes_exactly(small_dataset, tmp_path,
                                                                   monkeypatch, signum, code):
    data = TokenDataset(small_dataset)
    full = train(cfg(), gpt(data), data, tmp_path / "full", progress=False)
    interrupt_at(monkeypatch, 30, signum)
    res = train(cfg(), gpt(data), data, tmp_path / "run", progress=False)
    assert res.interrupted and res.step == 30 and res.exit_code == code
    assert load_checkpoint(tmp_path / "run" / "last.pt").state.step == 30
    assert load_checkpoint(tmp_path / "run" / "best.pt").state.step == 20
    monkeypatch.undo()
    done = train(cfg(), None, data, tmp_path / "run", resume=True, progress=False)
    assert done.step == 40 and not done.interrupted
    assert done.val_loss == full.val_loss  # the stop landed between steps: nothing lost
    # and the record is the same: the stopped step's row was logged before the save
    rows = [(tmp_path / name / "metrics.csv").read_text().splitlines() for name in ("full", "run")]
    assert [r.split(",")[:2] + r.split(",")[3:] for r in rows[0]] == \
        [r.split(",")[:2] + r.split(",")[3:] for r in rows[1]]


@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stop_signal_during_the_final_evaluation_saves_and_resumes_into_it(
        small_dataset, tmp_path, monkeypatch, signum, code):
    """The steps are done, the whole-split evaluation is running: a signal stops it at once
    and saves last.pt (the run had been lost: nothing was saved), and --resume then runs
    the final evaluation and ends where an uninterrupted run ends."""
    import time

    from scratchgpt.training.task import LanguageModelTask

    data = TokenDataset(small_dataset)
    full = train(cfg(), gpt(data), data, tmp_path / "full", progress=False)

    def interrupted(self, *args, **kw):
        os.kill(os.getpid(), signum)
        time.sleep(30)  # a long evaluation, cut short by the signal
        raise AssertionError("the signal did not stop the evaluation")

    monkeypatch.setattr(LanguageModelTask, "final_metrics", interrupted)
    res = train(cfg(), gpt(data), data, tmp_path / "run", progress=False)
    assert res.interrupted and res.step == 40 and res.exit_code == code
    assert load_checkpoint(tmp_path / "run" / "last.pt").state.step == 40
    monkeypatch.undo()
    done = train(cfg(), None, data, tmp_path / "run", resume=True, progress=False)
    assert done.step == 40 and not done.interrupted and done.val_loss == full.val_loss


def test_time_budget_ends_cleanly(small_dataset, tmp_path):
    data = TokenDataset(small_dataset)
    res = train(cfg(max_iters=100_000, time_budget="2s"), gpt(data), data, tmp_path / "r",
                progress=False)
    assert 2.0 <= res.elapsed_s < 10 and res.step < 100_000
    assert (tmp_path / "r" / "last.pt").is_file() and res.val_loss == res.val_loss  # not NaN


def test_a_generous_budget_still_decays_the_rate_by_the_last_update(small_dataset, tmp_path):
    """With both limits the schedule follows whichever ends first: an hour's budget on a
    40-update run anneals as the 40 updates alone would (not stopping at a high rate)."""
    data = TokenDataset(small_dataset)
    for name, extra in (("steps", {}), ("both", {"time_budget": "1h"})):
        train(cfg(max_iters=40, eval_interval=1000, log_interval=1, min_lr=0.0, **extra),
              gpt(data), data, tmp_path / name, progress=False)
    lrs = {name: [float(r["lr"]) for r in csv.DictReader((tmp_path / name / "metrics.csv").open())
                  if r["lr"]] for name in ("steps", "both")}
    assert lrs["both"][-1] < 3e-3 * 0.01  # annealed to (nearly) zero by update 40
    assert lrs["both"] == pytest.approx(lrs["steps"], rel=0.05, abs=1e-6)


def test_refuses_to_overwrite_another_run(small_dataset, tmp_path):
    """In the keywords a Python caller passes: it said "pass --resume ... or --overwrite"."""
    data = TokenDataset(small_dataset)
    train(cfg(max_iters=2, eval_interval=1), gpt(data), data, tmp_path / "r", progress=False)
    with pytest.raises(ScratchGPTError) as refused:
        train(cfg(max_iters=2), gpt(data), data, tmp_path / "r", progress=False)
    assert str(refused.value) == (f"{tmp_path / 'r'} already holds a run; pass resume=True to "
                                  "continue it or overwrite=True to replace it")
    with pytest.raises(ScratchGPTError) as refused:
        train(cfg(max_iters=4), None, data, tmp_path / "none", resume=True, progress=False)
    assert str(refused.value).endswith("(start the run without resume=True)")
    # both: the run was resumed and not replaced, as the command refuses --resume --overwrite
    with pytest.raises(ScratchGPTError, match="resume=True continues .* give one of them"):
        train(cfg(max_iters=4), None, data, tmp_path / "r", resume=True, overwrite=True,
              progress=False)
    assert load_checkpoint(tmp_path / "r" / "last.pt").state.step == 2
    res = train(cfg(max_iters=2), gpt(data), data, tmp_path / "r", overwrite=True,
                progress=False)
    assert res.step == 2


@pytest.mark.parametrize("model,message", [
    ("small vocabulary", r"vocab_size is 5, smaller than the dataset's vocabulary of \d+ ids"),
    ("none", "a new run needs a model config"),
    ("seq2seq", "'seq2seq' model is not a language model"),
    ("cfg dict", "cfg is a TrainConfig"),
])
def test_the_python_api_refuses_what_cannot_train_before_writing(small_dataset, tmp_path,
                                                                  model, message):
    """Each failed inside the training loop or torch (a model of a smaller vocabulary at its
    embedding, on the first batch), not with a line naming the argument."""
    data = TokenDataset(small_dataset)
    args = {"small vocabulary": (cfg(), model_config("gpt", **{**MODEL, "vocab_size": 5})),
            "none": (cfg(), None),
            "seq2seq": (cfg(), model_config("seq2seq", arch="lstm", src_vocab=9, tgt_vocab=9)),
            "cfg dict": ({"max_iters": 2}, gpt(data))}[model]
    with pytest.raises(ScratchGPTError, match=message):
        train(*args, data, tmp_path / "r", progress=False)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("out, message", [
    ("", "out is empty (''); give the run its own directory (an empty path would be the "
         "current one)"),
    ("  ", "out is empty ('  '); give the run its own directory"),
    (None, "out is the run directory to write (a str or Path), got None"),
])
def test_the_python_api_refuses_an_out_that_names_no_directory(small_dataset, tmp_path,
                                                                monkeypatch, out, message):
    """out='' (an unset variable's value) trained into the current directory, which Path('')
    is, and out=None was a TypeError from pathlib; the command refuses --out '' alike."""
    data = TokenDataset(small_dataset)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ScratchGPTError) as refused:
        train(cfg(max_iters=2), gpt(data), data, out, progress=False)
    assert str(refused.value).startswith(message)
    assert list(tmp_path.iterdir()) == []


def test_a_new_lora_run_from_python_is_told_how_to_start_one(small_dataset, tmp_path):
    """A GPTLoRAConfig for a new run was 'not a language model', which it is: what train
    cannot do is load the trained GPT its adapters adapt."""
    data = TokenDataset(small_dataset)
    with pytest.raises(ScratchGPTError) as refused:
        train(cfg(max_iters=2), GPTLoRAConfig(gpt(data), LoRAConfig(rank=4)), data,
              tmp_path / "r", progress=False)
    assert str(refused.value) == ("a 'gpt-lora' model adapts a trained GPT, which a new run of "
                                  "train does not load: start it with 'scratchgpt train "
                                  "--init-from BASE --lora' (train(..., resume=True) continues "
                                  "it)")
    assert not (tmp_path / "r").exists()


def test_the_python_api_trains_on_a_dataset_named_by_its_directory(small_dataset, tmp_path):
    data = TokenDataset(small_dataset)
    res = train(cfg(max_iters=2), gpt(data), str(small_dataset), tmp_path / "r", progress=False)
    assert res.step == 2 and (tmp_path / "r" / "last.pt").is_file()


def test_lr_schedule_warmup_then_cosine():
    lrs = [lr_at(s, 10, 1.0, 0.1, s / 100) for s in range(101)]
    assert lrs[0] < lrs[5] < lrs[9] <= 1.0
    assert lrs[10] == pytest.approx(1.0 - 0.9 * (1 - torch.cos(torch.tensor(0.1 * 3.14159265)))
                                    .item() / 2, rel=1e-3)
    assert lrs[100] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:], strict=False))


@pytest.mark.parametrize("text,seconds", [("90s", 90), ("10m", 600), ("1.5h", 5400), ("45", 45)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", [dict(batch_size=0), dict(learning_rate=-1),
                                 dict(min_lr=1.0, learning_rate=0.1), dict(dtype="fp8"),
                                 dict(time_budget="soon"), dict(optimizer="sgd"),
                                 dict(muon_lr_scale=0.0), dict(learning_rate=float("inf")),
                                 dict(weight_decay=float("nan")), dict(grad_clip=float("nan")),
                                 dict(muon_lr_scale=float("inf")), dict(batch_size="12"),
                                 dict(beta2=1.0), dict(max_iters=True),
                                 dict(embed_lr_scale=0.0)])
def test_invalid_train_config(bad):
    with pytest.raises(ScratchGPTError):
        TrainConfig(**bad)


def test_resuming_a_finished_run_reports_it_without_evaluating_or_logging_again(
        small_dataset, tmp_path):
    """Its final evaluation is in last.pt: the figures come back, metrics.csv gains no
    second final row, and the checkpoints stay as they were."""
    data = TokenDataset(small_dataset)
    first = train(cfg(max_iters=20), gpt(data), data, tmp_path / "run", progress=False)
    record = (tmp_path / "run" / "metrics.csv").read_text()
    best = (tmp_path / "run" / "best.pt").read_bytes()
    again = train(cfg(max_iters=20), None, data, tmp_path / "run", resume=True, progress=False)
    assert (again.step, again.val_loss, again.train_loss) == (20, first.val_loss,
                                                              first.train_loss)
    assert (tmp_path / "run" / "metrics.csv").read_text() == record
    assert (tmp_path / "run" / "best.pt").read_bytes() == best
    longer = train(cfg(max_iters=25), None, data, tmp_path / "run", resume=True,
                   progress=False)  # extended: trained, then evaluated anew
    assert longer.step == 25 and longer.val_loss != first.val_loss


def test_a_resumed_run_trains_with_the_optimizer_settings_it_is_given(small_dataset, tmp_path):
    """A new --weight-decay and --beta2 on resume change the updates from there on: the run
    resumed with them ends where one started with them at the same step would."""
    data = TokenDataset(small_dataset)
    new = dict(weight_decay=0.5, beta2=0.9)
    for name in ("kept", "changed"):
        train(cfg(max_iters=10, lr_decay_iters=20), gpt(data), data, tmp_path / name,
              progress=False)
    kept = train(cfg(max_iters=20, lr_decay_iters=20), None, data, tmp_path / "kept",
                 resume=True, progress=False)
    changed = train(cfg(max_iters=20, lr_decay_iters=20, **new), None, data,
                    tmp_path / "changed", resume=True, progress=False)
    assert changed.val_loss != kept.val_loss
    # the same run stopped at 10 and resumed with the same settings: the same model
    train(cfg(max_iters=10, lr_decay_iters=20), gpt(data), data, tmp_path / "again",
          progress=False)
    again = train(cfg(max_iters=20, lr_decay_iters=20, **new), None, data, tmp_path / "again",
                  resume=True, progress=False)
    assert again.val_loss == changed.val_loss


def test_the_embedding_rate_cannot_move_to_or_from_one_on_resume(small_dataset, tmp_path,
                                                                 cli_main, capsys):
    """Named as the caller gives it: a keyword from Python (a config there gives every
    setting, so the remedy is the run's own value, not a flag to drop), a flag from the CLI."""
    from tests.cli_errors import error_of

    data = TokenDataset(small_dataset)
    train(cfg(max_iters=5, warmup_iters=1), gpt(data), data, tmp_path / "run", progress=False)
    with pytest.raises(ScratchGPTError) as refused:
        train(cfg(max_iters=10, embed_lr_scale=2.0), None, data, tmp_path / "run",
              resume=True, progress=False)
    assert str(refused.value) == (
        "a run started with embed_lr_scale=1.0 keeps 1 (the embedding tables' optimizer group "
        "is saved as it was): this run has embed_lr_scale=2.0 (give embed_lr_scale=1.0, or "
        "start a new run)")
    line = error_of(capsys, ["train", "--out", str(tmp_path / "run"), "--resume",
                             "--embed-lr-scale", "2"])
    assert line.endswith("a run started with --embed-lr-scale 1 keeps 1 (the embedding "
                         "tables' optimizer group is saved as it was): this run has "
                         "--embed-lr-scale 2 (drop --embed-lr-scale, or start a new run)"), line
    train(cfg(max_iters=5, embed_lr_scale=2.0), gpt(data), data, tmp_path / "own",
          progress=False)
    resumed = train(cfg(max_iters=10, embed_lr_scale=3.0), None, data, tmp_path / "own",
                    resume=True, progress=False)  # between values other than 1: applied
    assert resumed.step == 10


def test_the_largest_seed_trains_and_evaluates(small_dataset, tmp_path):
    """The evaluation's stream is seeded one past the run's seed: wrapped at the top of the
    range, not an overflow once training is done."""
    data = TokenDataset(small_dataset)
    res = train(cfg(max_iters=2, eval_interval=2, seed=2**64 - 1), gpt(data), data,
                tmp_path / "run", progress=False)
    assert res.step == 2 and math.isfinite(res.val_loss)


def test_a_resumed_runs_progress_bar_shows_a_loss_before_its_first_metrics_row(
        small_dataset, tmp_path, capsys):
    """Resumed at update 10, logging every 25: the bar shows the first update's loss, not
    nan until update 25 (and metrics.csv gains no extra row for it)."""
    data = TokenDataset(small_dataset)
    train(cfg(max_iters=10, log_interval=25), gpt(data), data, tmp_path / "run", progress=False)
    capsys.readouterr()
    train(cfg(max_iters=12, log_interval=25), None, data, tmp_path / "run", resume=True)
    drawn = [part for part in capsys.readouterr().err.split("\r") if "step=1" in part]
    assert drawn and all("loss=nan" not in part for part in drawn), drawn
    assert "loss=" in drawn[-1]
    rows = list(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))
    assert [r["step"] for r in rows if r["loss"]] == ["1"]  # (update 1 only: every 25)


def test_resuming_with_fewer_updates_than_the_run_has_made_is_refused(small_dataset, tmp_path,
                                                                      capsys):
    """--max-iters below the run's step cannot be honoured: refused, the run's files (its
    config.json, which would have recorded the smaller figure) left as they were. From
    Python the refusal names the keyword (it named --max-iters and a flag to drop)."""
    from tests.cli_errors import error_of

    data = TokenDataset(small_dataset)
    train(cfg(max_iters=10), gpt(data), data, tmp_path / "run", progress=False)
    before = {f.name: f.read_bytes() for f in (tmp_path / "run").iterdir() if f.is_file()}
    with pytest.raises(ScratchGPTError) as refused:
        train(cfg(max_iters=4), None, data, tmp_path / "run", resume=True, progress=False)
    assert str(refused.value) == ("this run is already at update 10: max_iters=4 would end it "
                                  "before where it is (give more than 10 to train on, or give "
                                  "max_iters=10 to finish as planned)")
    line = error_of(capsys, ["train", "--out", str(tmp_path / "run"), "--resume",
                             "--max-iters", "4"])
    assert line.endswith("this run is already at update 10: --max-iters 4 would end it before "
                         "where it is (give more than 10 to train on, or drop --max-iters to "
                         "finish as planned)"), line
    after = {f.name: f.read_bytes() for f in (tmp_path / "run").iterdir() if f.is_file()}
    assert after == before


@pytest.mark.parametrize("make,keyword,message", [
    (TrainConfig, "lr", "TrainConfig does not take lr; did you mean 'learning_rate'?"),
    (TrainConfig, "max_iter", "TrainConfig does not take max_iter; did you mean 'max_iters'?"),
    (TrainConfig, "zzz", "TrainConfig does not take zzz"),
    (GPTConfig, "n_layers", "GPTConfig does not take n_layers; did you mean 'n_layer'?"),
    (SamplingConfig, "temprature", "SamplingConfig does not take temprature; did you mean "
                                   "'temperature'?"),
    (lambda **kw: model_config("gpt", vocab_size=9, **kw), "n_layers",
     "model 'gpt' does not take n_layers; did you mean 'n_layer'?"),
    # every other model's config too (a user may build any of them directly)
    (BigramConfig, "vocab", "BigramConfig does not take vocab; did you mean 'vocab_size'?"),
    (RecurrentConfig, "hiden", "RecurrentConfig does not take hiden; did you mean 'hidden'?"),
    (RecurrentClassifierConfig, "n_clases", "RecurrentClassifierConfig does not take "
                                            "n_clases; did you mean 'n_classes'?"),
    (Seq2SeqConfig, "d_modle", "Seq2SeqConfig does not take d_modle; did you mean 'd_model'?"),
    (GPTClassifierConfig, "n_clases", "GPTClassifierConfig does not take n_clases; did you "
                                      "mean 'n_classes'?"),
    (LoRAConfig, "rnak", "LoRAConfig does not take rnak; did you mean 'rank'?"),
    (GPTLoRAConfig, "loras", "GPTLoRAConfig does not take loras; did you mean 'lora'?"),
])
def test_a_config_built_from_python_names_an_unknown_setting(make, keyword, message):
    """Each was the dataclass's TypeError, '__init__() got an unexpected keyword argument',
    which names no setting it does take (and was not a ScratchGPTError)."""
    with pytest.raises(ScratchGPTError) as e:
        make(**{keyword: 1})
    assert str(e.value) == message


def _budgeted_run(cli_main, data, out, capsys) -> int:
    """A CLI run that ends on its --time-budget of 0.3 s; returns the step it ended at. What
    it printed is read off (its stderr says where the budget ran out)."""
    assert cli_main(["train", "--dataset", str(data), "--n-layer", "1", "--n-head", "2",
                     "--n-embd", "16", "--block-size", "16", "--batch-size", "4",
                     "--eval-iters", "1", "--max-iters", "1000000", "--time-budget", "0.3s",
                     "--out", str(out), "--no-progress"]) == 0
    step = load_checkpoint(out / "last.pt").state.step
    assert 0 < step < 1_000_000
    assert f"--time-budget 0.3s spent at step {step};" in capsys.readouterr().err
    return step


def test_a_run_ended_on_its_budget_resumes_to_a_new_max_iters(small_dataset, tmp_path,
                                                               cli_main, capsys):
    """--max-iters on resume extends a run that its spent --time-budget ended; without one,
    the note says the budget is spent and how to go on."""
    step = _budgeted_run(cli_main, small_dataset, tmp_path / "r", capsys)
    capsys.readouterr()
    assert cli_main(["train", "--resume", "--out", str(tmp_path / "r"), "--no-progress"]) == 0
    assert "already used its --time-budget" in capsys.readouterr().out
    assert load_checkpoint(tmp_path / "r" / "last.pt").state.step == step
    assert cli_main(["train", "--resume", "--out", str(tmp_path / "r"), "--max-iters",
                     str(step + 5), "--no-progress"]) == 0
    assert load_checkpoint(tmp_path / "r" / "last.pt").state.step == step + 5


def test_a_resume_refuses_a_budget_it_has_already_used(small_dataset, tmp_path, cli_main,
                                                       capsys):
    """A --time-budget shorter than the run has trained would train nothing: one line."""
    from tests.cli_errors import error_of

    step = _budgeted_run(cli_main, small_dataset, tmp_path / "r", capsys)
    before = (tmp_path / "r" / "last.pt").read_bytes()
    line = error_of(capsys, ["train", "--resume", "--out", str(tmp_path / "r"),
                             "--time-budget", "0.1s", "--max-iters", str(step + 5)])
    assert "already trained for" in line and "--time-budget 0.1s" in line, line
    assert (tmp_path / "r" / "last.pt").read_bytes() == before
    assert cli_main(["train", "--resume", "--out", str(tmp_path / "r"), "--time-budget", "",
                     "--max-iters", str(step + 3), "--no-progress"]) == 0
    assert load_checkpoint(tmp_path / "r" / "last.pt").state.step == step + 3


def test_a_resume_that_repeats_its_used_up_budget_with_more_iterations_is_refused(
        small_dataset, tmp_path, cli_main, capsys):
    """The budget the run was started with, given again with a new --max-iters, printed the
    finished run's note and trained nothing: the spent budget stood in the way of the
    updates asked for. One line, saying what to give (without the budget it trains on, as a
    resume with --max-iters alone does); the run's own command repeated gets the note."""
    from tests.cli_errors import error_of

    out = tmp_path / "r"
    step = _budgeted_run(cli_main, small_dataset, out, capsys)
    before = (out / "last.pt").read_bytes()
    resume = ["train", "--resume", "--out", str(out), "--time-budget", "0.3s"]
    line = error_of(capsys, [*resume, "--max-iters", str(step + 5)])
    assert f"--time-budget 0.3s is used up: it would stop the run before --max-iters " \
           f"{step + 5}" in line, line
    assert line.endswith(f"drop --time-budget to train to --max-iters {step + 5})"), line
    assert (out / "last.pt").read_bytes() == before
    for again in ([], ["--max-iters", "1000000"]):  # the run's own budget (and iterations)
        assert cli_main([*resume, *again, "--no-progress"]) == 0
        assert "already used its --time-budget" in capsys.readouterr().out
        assert (out / "last.pt").read_bytes() == before
    assert cli_main(["train", "--resume", "--out", str(out), "--max-iters", str(step + 5),
                     "--no-progress"]) == 0
    assert load_checkpoint(out / "last.pt").state.step == step + 5


def test_a_resume_from_python_refuses_a_model_config_other_than_the_runs(small_dataset,
                                                                       tmp_path, capsys):
    """train(..., resume=True) with a model config of another shape or type kept the run's
    own in silence, as its docstring said: a caller who passed it expected that model. It is
    refused, naming what differs by keyword, as the command refuses --n-layer 3 on a 2-layer
    run; the run's own config, or None, resumes, and a new dropout applies as --dropout
    does."""
    from tests.cli_errors import error_of

    data = TokenDataset(small_dataset)
    out = tmp_path / "r"
    train(cfg(max_iters=2, eval_interval=2, eval_iters=1, warmup_iters=1), gpt(data), data, out,
          progress=False)
    before = (out / "last.pt").read_bytes()
    refused = [
        (gpt(data, n_layer=3), "this run has n_layer=2 (give n_layer=2, or start"),
        (gpt(data, n_layer=3, n_embd=64), "this run has n_embd=32, n_layer=2 (give n_embd=32, "
                                          "n_layer=2, or start"),
        (model_config("lstm", vocab_size=data.vocab_size, n_layer=2, block_size=32),
         "this run has model='gpt' (give model='gpt', or start"),
        (model_config("gpt", **{**MODEL, "vocab_size": data.vocab_size + 1}),
         f"this run has vocab_size={data.vocab_size}"),
    ]
    for config, says in refused:
        with pytest.raises(ScratchGPTError) as e:
            train(cfg(max_iters=4), config, data, out, resume=True, progress=False)
        assert str(e.value).startswith(f"a resumed run keeps its model, optimizer and seed: "
                                       f"{says}"), str(e.value)
        assert "--" not in str(e.value) and "\n" not in str(e.value)
        assert (out / "last.pt").read_bytes() == before
    line = error_of(capsys, ["train", "--out", str(out), "--resume", "--n-layer", "3"])
    assert line.endswith("this run has --n-layer 2 (drop --n-layer, or start a new run)"), line
    assert train(cfg(max_iters=3), gpt(data), data, out, resume=True, progress=False).step == 3
    assert train(cfg(max_iters=4), gpt(data, dropout=0.2), data, out, resume=True,
                 progress=False).step == 4
    assert load_checkpoint(out / "last.pt").model_config.dropout == 0.2
    assert train(cfg(max_iters=5), None, data, out, resume=True, progress=False).step == 5


def test_a_resume_from_python_refuses_other_adapters_or_another_optimizer(small_dataset,
                                                                          tmp_path, capsys,
                                                                          cli_main):
    """train(..., resume=True) compared only the GPT inside a GPTLoRAConfig and left the
    optimizer out: a LoRA run resumed with another rank, alpha or targets, or with
    optimizer='muon', went on with the run's own in silence. Both are refused by keyword, as
    the command refuses --lora-rank and --optimizer by flag; the same layers named in another
    order are the run's own adapters."""
    from tests.cli_errors import error_of

    data = TokenDataset(small_dataset)
    base, out = tmp_path / "base", tmp_path / "lora"
    short = dict(eval_interval=2, eval_iters=1, batch_size=4)
    train(cfg(max_iters=2, **short), gpt(data), data, base, progress=False)
    assert cli_main(["train", "--init-from", str(base), "--dataset", str(small_dataset),
                     "--lora-rank", "4", "--lora-targets", "attn,mlp", "--max-iters", "2",
                     "--eval-interval", "2", "--eval-iters", "1", "--batch-size", "4",
                     "--out", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    own = load_checkpoint(out / "last.pt").model_config
    before = (out / "last.pt").read_bytes()
    keeps = "a resumed run keeps its model, optimizer and seed: this run has "
    runs = repr(own.lora)
    refused = [
        (GPTLoRAConfig(own.gpt, LoRAConfig(rank=8, targets="attn,mlp")), {},
         f"lora={runs} (give lora={runs}, or start a new run)"),
        (GPTLoRAConfig(own.gpt, LoRAConfig(rank=4, alpha=4.0, targets="attn,mlp")), {},
         f"lora={runs} (give lora={runs}, or start a new run)"),
        (GPTLoRAConfig(own.gpt, LoRAConfig(rank=4, targets="qkv")), {},
         f"lora={runs} (give lora={runs}, or start a new run)"),
        (None, dict(optimizer="muon"), "optimizer='adamw' (give optimizer='adamw', or start a "
                                       "new run)"),
    ]
    for config, change, says in refused:
        with pytest.raises(ScratchGPTError) as e:
            train(cfg(max_iters=4, **short, **change), config, data, out, resume=True,
                  progress=False)
        assert str(e.value) == keeps + says
        assert (out / "last.pt").read_bytes() == before
    for flags, says in ((["--optimizer", "muon"], "--optimizer adamw (drop --optimizer, or "),
                        (["--lora-rank", "8"], "adapters included: drop --lora-rank, or start "
                                               "a new run (this run has --lora-rank 4)"),
                        (["--lora-rank", "4", "--lora-alpha", "2"],
                         "this run has --lora-alpha 16)")):
        line = error_of(capsys, ["train", "--out", str(out), "--resume", *flags])
        assert says in line, line
    assert (out / "last.pt").read_bytes() == before
    same = GPTLoRAConfig(own.gpt, LoRAConfig(rank=4, targets="mlp,attn"))  # the same layers
    assert train(cfg(max_iters=3, **short), same, data, out, resume=True,
                 progress=False).step == 3
    # the command takes the run's own LoRA values given again, as finetune --resume does
    assert cli_main(["train", "--out", str(out), "--resume", "--max-iters", "4", "--lora",
                     "--lora-rank", "4", "--lora-targets", "mlp,attn", "--no-progress"]) == 0
    assert load_checkpoint(out / "last.pt").state.step == 4


def test_lora_flags_on_resuming_a_run_without_adapters_are_refused(small_dataset, tmp_path,
                                                                    capsys):
    """A run without adapters has no LoRA value to give again: its resume refuses them."""
    from tests.cli_errors import error_of

    data = TokenDataset(small_dataset)
    train(cfg(max_iters=2, eval_interval=2, eval_iters=1, warmup_iters=1), gpt(data), data,
          tmp_path / "r", progress=False)
    before = (tmp_path / "r" / "last.pt").read_bytes()
    line = error_of(capsys, ["train", "--out", str(tmp_path / "r"), "--resume", "--lora-rank",
                             "4", "--max-iters", "4"])
    assert line.endswith("adapters included: drop --lora-rank, or start a new run (this run "
                         "has no adapters)"), line
    assert (tmp_path / "r" / "last.pt").read_bytes() == before


def test_a_refused_resume_from_python_names_the_keywords_it_was_given(small_dataset, tmp_path):
    """scratchgpt.train's refusals of a resume named flags (--seed, --schedule wsd,
    --time-budget 0.1s) and said to drop them: a Python caller has neither, and its config
    gives every setting. They name TrainConfig's keywords and say what to give instead (the
    command line's own words are tested beside each command's refusal)."""
    data = TokenDataset(small_dataset)
    out = tmp_path / "r"
    train(cfg(max_iters=10**6, time_budget="0.3s", eval_interval=10**6), gpt(data), data, out,
          progress=False)
    state = load_checkpoint(out / "last.pt").state
    spent = f"this run has already trained for {state.elapsed_s:.1f} s"
    cases = [
        (dict(seed=7), "a resumed run keeps its model, optimizer and seed: this run has "
                       "seed=1337 (give seed=1337, or start a new run)"),
        (dict(decay_fraction=0.5), "decay_fraction applies with schedule='wsd'; this run has "
                                   "schedule='cosine'"),
        (dict(time_budget="0.1s"), f"{spent}: time_budget='0.1s' would end it before where it "
                                   f"is (give more than {state.elapsed_s:.1f}s, or '' for no "
                                   "budget)"),
        (dict(time_budget="0.3s", max_iters=state.step + 5),
         f"{spent}: time_budget='0.3s' is used up: it would stop the run before "
         f"max_iters={state.step + 5} (give more than {state.elapsed_s:.1f}s, or '' for no "
         "budget)"),
    ]
    for change, message in cases:
        with pytest.raises(ScratchGPTError) as refused:
            train(cfg(**{"max_iters": 10**6, **change}), None, data, out, resume=True,
                  progress=False)
        assert str(refused.value) == message
    assert load_checkpoint(out / "last.pt").state.step == state.step
    resumed = train(cfg(max_iters=state.step + 2), None, data, out, resume=True,
                    progress=False)  # TrainConfig's own time_budget, '': no budget
    assert resumed.step == state.step + 2


@pytest.mark.parametrize("lr, wd, first", [(1e-3, 1e5, "weight_decay"), (0.5, 2.0, "weight_decay"),
                                            (1e-3, 500.0, "learning_rate"),  # product 0.5
                                            (10.0, 0.1, "learning_rate"),  # a usual decay
                                            (1e30, 0.1, "learning_rate")])
def test_a_diverged_run_names_the_weight_decay_first_where_it_flips_the_weights(lr, wd, first):
    """A huge weight decay diverges through 1 - lr * wd: it was told to lower the rate."""
    from scratchgpt.training.config import TrainConfig
    from scratchgpt.training.trainer import _remedy
    from scratchgpt.validation import KEYWORDS

    said = _remedy(TrainConfig(learning_rate=lr, min_lr=0.0, weight_decay=wd), KEYWORDS)
    assert said.startswith(f"lower {first}"), said
    assert said.endswith("lower learning_rate or keep grad_clip on"), said


def test_a_run_from_python_that_ends_inside_its_warmup_says_so_on_stderr(small_dataset,
                                                                          tmp_path, capsys):
    """The command said that a run ending inside its warmup never reaches its learning rate;
    train() said nothing. It says so on stderr, by keyword; a shorter warmup says nothing."""
    data = TokenDataset(small_dataset)
    short = dict(max_iters=2, eval_interval=2, eval_iters=1)
    train(cfg(warmup_iters=100, **short), gpt(data), data, tmp_path / "a", progress=False)
    err = capsys.readouterr().err
    assert err == ("note: warmup_iters=100 is not below max_iters=2: the learning rate rises for "
                   "the whole run, to 2% of learning_rate=0.003, and the cosine schedule never "
                   "starts; give a smaller warmup_iters\n"), err
    train(cfg(warmup_iters=1, **short), gpt(data), data, tmp_path / "b", progress=False)
    assert "note:" not in capsys.readouterr().err


def test_a_call_refused_late_says_no_start_of_run_note(small_dataset, tmp_path, capsys):
    """train() printed its warmup note before the checks that come last: a call refused
    once the model was built (Muon has nothing to train in a recurrent model) first said
    how the run would train. Every refusal now comes before any note."""
    data = TokenDataset(small_dataset)
    lstm = model_config("lstm", vocab_size=data.vocab_size, n_layer=1, hidden=16,
                        block_size=16)
    short = dict(max_iters=2, eval_interval=2, eval_iters=1, warmup_iters=100)
    with pytest.raises(ScratchGPTError, match="optimizer='muon' has nothing to train"):
        train(cfg(optimizer="muon", **short), lstm, data, tmp_path / "r", progress=False)
    assert capsys.readouterr().err == "" and not (tmp_path / "r").exists()
    train(cfg(**short), lstm, data, tmp_path / "r", progress=False)  # said, then trained
    assert capsys.readouterr().err.startswith("note: warmup_iters=100 is not below")


def test_a_resume_from_python_in_another_process_count_says_so(small_dataset, tmp_path,
                                                                capsys, monkeypatch):
    """A 2-process run resumed by train() with cfg's default nproc=1 went on in one process
    in silence (the command keeps the run's count: it names only the flags typed). cfg gives
    every setting and its default cannot be told from nproc=1 given, so its count applies and
    stderr says so and how to keep the run's. The run's count recorded as 2 stands in for
    starting two processes; the resume in two is planned, not run."""
    from scratchgpt.training import job

    data = TokenDataset(small_dataset)
    out = tmp_path / "r"
    # (a schedule as long as the resumes: no note of where it ends)
    short = dict(eval_interval=2, eval_iters=1, warmup_iters=1, lr_decay_iters=4)
    train(cfg(max_iters=2, **short), gpt(data), data, out, progress=False)
    for name in ("last.pt", "best.pt"):
        saved = torch.load(out / name, weights_only=True)
        saved["train_config"]["nproc"] = 2
        torch.save(saved, out / name)
    capsys.readouterr()
    planned = []
    with monkeypatch.context() as m:
        m.setattr(job, "run", lambda plan, progress: planned.append(plan))
        train(cfg(max_iters=4, nproc=2, **short), None, data, out, resume=True,
              progress=False)
    assert planned[0].train.nproc == 2 and planned[0].notes == ()
    assert train(cfg(max_iters=4, **short), None, data, out, resume=True,
                 progress=False).step == 4
    assert capsys.readouterr().err == (
        f"note: the run in {out} trained in 2 processes; it goes on in 1 process (cfg's "
        "nproc=1); give nproc=2 to keep its count\n")
