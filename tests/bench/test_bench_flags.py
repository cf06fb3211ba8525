"""The benchmarks' flags: nonsense values are one line before any work, and the figures and
runs of an earlier benchmark are kept unless --overwrite."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from scratchgpt.cli import main
from scratchgpt.commands.bench import BENCHMARKS
from tests.cli_errors import error_of

THREADED = [name for name in BENCHMARKS if name not in ("train", "tokenize")]


@pytest.mark.parametrize("name", THREADED)
def test_a_negative_thread_count_is_refused(name, capsys):
    """torch.set_num_threads(-1) raised a RuntimeError traceback (or -1 passed unnoticed)."""
    assert "--threads" in error_of(capsys, ["bench", name, "--threads", "-1"])


OWN_THREADS = ["sample", "generate", "decode-step", "speculative", "recurrent", "finetune",
               "seq2seq", "serve"]


@pytest.mark.parametrize("name", OWN_THREADS)
def test_more_threads_than_cores_is_refused_before_the_benchmark(name, monkeypatch, capsys):
    """--threads 3 on a 2-core machine ran: its threads took turns on the cores, and the
    figures timed the turns, not the benchmark."""
    import importlib

    from scratchgpt import cpu

    monkeypatch.setattr(cpu, "cores", lambda: 2)
    module = importlib.import_module(f"scratchgpt.bench.{name.replace('-', '_')}")
    monkeypatch.setattr(module, "run", lambda args: pytest.fail("the benchmark ran"))
    line = error_of(capsys, ["bench", name, "--threads", "3"])
    assert "--threads" in line and "to 2 threads (this machine's CPU cores" in line
    assert "got '3'" in line


def test_threads_up_to_the_cores_are_taken():
    from scratchgpt.bench import bench_threads, bench_threads_positive
    from scratchgpt.cpu import cores

    assert bench_threads(str(cores())) == cores()
    assert bench_threads_positive(str(cores())) == cores()


RANDOM_PAIR = ["bench", "speculative", "--random-target", "1,1,16", "--random-draft", "1,1,8",
               "--vocab-size", "50", "--tokens", "2", "--k", "1", "--repeats", "1"]


@pytest.mark.parametrize("flag", ["--block-size", "--vocab-size", "--prompt-len", "--repeats"])
def test_bench_speculative_sizes_are_positive(flag, capsys):
    """--block-size 0 was refused as '--prompt-len must be in [1, 0], got 64', a flag nobody
    typed; --block-size -1 as the same, and a negative --repeats as '>= 1', unnamed."""
    for value in ("0", "-1"):
        line = error_of(capsys, [*RANDOM_PAIR, flag, value])
        assert f"argument {flag}: expected a positive integer, got '{value}'" in line


def test_bench_speculative_prompt_fits_a_short_block_size(capsys):
    """Without --prompt-len a --block-size below 64 was refused: '--prompt-len must be in
    [1, 16], got 64', the default of a flag nobody typed; the prompt now fills the context."""
    assert main([*RANDOM_PAIR, "--block-size", "16", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["prompt_tokens"] == 16 and report["results"][0]["k"] == 1


RECURRENT = ["bench", "recurrent", "--cells", "rnn", "--hidden", "8", "--n-layer", "1",
             "--batch-size", "2", "--seq-len", "4", "--decode-tokens", "2", "--repeats", "1"]


@pytest.mark.parametrize("name", ["recurrent", "seq2seq", "finetune", "sample"])
def test_json_file_is_checked_before_the_benchmark_and_kept(name, tmp_path, capsys):
    """--json FILE holding earlier results is kept without --overwrite, and a FILE that
    cannot be written is refused at once, not when the benchmark has run."""
    earlier = tmp_path / "figures.json"
    earlier.write_text("earlier results")
    for where, needle in ((earlier, "pass --overwrite"), (tmp_path, "is a directory"),
                          (earlier / "x.json", "is a file, not a directory")):
        argv = ["bench", name, "--json", str(where), "--out", str(tmp_path / "runs")] \
            if name == "finetune" else ["bench", name, "--json", str(where)]
        assert needle in error_of(capsys, argv)
    assert earlier.read_text() == "earlier results"
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name", ["recurrent", "seq2seq", "finetune", "sample"])
def test_a_json_file_no_folder_can_hold_is_refused_before_the_benchmark(name, tmp_path,
                                                                         capsys):
    """A --json FILE in a folder nobody may write was found by the write after the benchmark
    (30 minutes of bench seq2seq), its figures lost: 'Permission denied'. /proc takes no
    new file, whoever runs the test (a read-only folder takes one from root)."""
    if not Path("/proc/self").is_dir():
        pytest.skip("no /proc on this system")
    where = Path("/proc/scratchgpt-bench/figures.json")
    argv = ["bench", name, "--json", str(where)]
    if name == "finetune":
        argv += ["--out", str(tmp_path / "runs")]
    assert f"--json {where}: no file can be written in /proc (" in error_of(capsys, argv)
    assert not (tmp_path / "runs").exists()


def test_json_file_is_replaced_with_overwrite(tmp_path, capsys):
    out = tmp_path / "new" / "figures.json"  # a missing folder is made
    assert main([*RECURRENT, "--json", str(out)]) == 0
    out.write_text("earlier results")
    assert main([*RECURRENT, "--json", str(out), "--overwrite"]) == 0
    assert json.loads(out.read_text())["results"][0]["cell"] == "rnn"
    capsys.readouterr()


def test_bench_recurrent_json_holds_the_table_and_its_settings(tmp_path, capsys):
    """The figures file left out the sampling length and the repeats that the tokens/s of
    its sampling columns depend on (the table's header names the length)."""
    out = tmp_path / "figures.json"
    assert main([*RECURRENT, "--json", str(out)]) == 0
    table = capsys.readouterr().out.splitlines()
    figures = json.loads(out.read_text())
    assert (figures["decode_tokens"], figures["repeats"]) == (2, 1)
    assert figures["interrupted"] is False
    assert "sampling 2 tokens" in table[0]
    row = figures["results"][0]
    cells = table[2].split()
    assert cells[0] == row["cell"] == "rnn"
    assert cells[1:3] == [f"{row['torch_train_tokens_per_s']:,.0f}",
                          f"{row['scratch_train_tokens_per_s']:,.0f}"]


def test_bench_recurrent_stopped_keeps_the_rows_measured(tmp_path, capsys, monkeypatch):
    """Ctrl-C after the first cell's row wrote no --json file: the printed rows were lost
    to it. Now the file holds them, marked as interrupted, and the exit is still 130."""
    from scratchgpt.bench import recurrent

    measured = recurrent.measure

    def stop_at_the_second(cell, args):
        if cell == "gru":
            raise KeyboardInterrupt
        return measured(cell, args)

    monkeypatch.setattr(recurrent, "measure", stop_at_the_second)
    out = tmp_path / "figures.json"
    argv = [*RECURRENT[:3], "rnn", "gru", *RECURRENT[4:], "--json", str(out)]
    assert main(argv) == 130
    assert capsys.readouterr().err.endswith("scratchgpt bench recurrent: interrupted\n")
    figures = json.loads(out.read_text())
    assert figures["interrupted"] is True
    assert [row["cell"] for row in figures["results"]] == ["rnn"]


def test_bench_recurrent_stopped_before_any_row_writes_no_file(tmp_path, capsys, monkeypatch):
    from scratchgpt.bench import recurrent

    def stopped(cell, args):
        raise KeyboardInterrupt

    monkeypatch.setattr(recurrent, "measure", stopped)
    out = tmp_path / "figures.json"
    assert main([*RECURRENT, "--json", str(out)]) == 130
    assert not out.exists()
    capsys.readouterr()


SAMPLE = ["bench", "sample", "--tokens", "3", "--prompt-len", "2", "--threads", "1"]


def test_bench_sample_json_holds_the_figures_it_prints(tmp_path, capsys):
    """bench sample had no --json where the other benchmarks write their figures: its
    tokens/s could only be read off the printed line."""
    out = tmp_path / "figures.json"
    assert main([*SAMPLE, "--repeats", "2", "--json", str(out)]) == 0
    header, line = capsys.readouterr().out.splitlines()
    figures = json.loads(out.read_text())
    assert figures["interrupted"] is False
    assert (figures["tokens"], figures["prompt_len"], figures["repeats"]) == (3, 2, 2)
    assert figures["threads"] == 1 and figures["dtype"] == "fp32"
    assert header.startswith(f"model: {figures['model']}, {figures['params']:,} parameters")
    [row] = figures["results"]
    assert row["variant"] == "eager" and row["runs"] == 2
    assert row["min_s"] <= row["median_s"] <= row["max_s"]
    assert row["tokens_per_s"] == pytest.approx(3 / row["median_s"])
    assert line == (f"3 tokens: median {row['median_s']:.3f} s over 2 runs (min "
                    f"{row['min_s']:.3f}, max {row['max_s']:.3f}) = "
                    f"{row['tokens_per_s']:,.0f} tokens/s")


def _stop_sampling_at(monkeypatch, call: int) -> None:
    """Ctrl-C as bench sample's ``call``-th generation (the first is its warm-up) starts."""
    from scratchgpt.generation import generate

    real, calls = generate.generate, {"n": 0}

    def stopping(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == call:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(generate, "generate", stopping)


def test_bench_sample_stopped_keeps_the_runs_timed(tmp_path, capsys, monkeypatch):
    """As bench recurrent's --json: Ctrl-C after a timed run writes what was measured,
    marked as interrupted, and the exit is still 130."""
    _stop_sampling_at(monkeypatch, 3)  # the warm-up and one timed run, then Ctrl-C
    out = tmp_path / "figures.json"
    assert main([*SAMPLE, "--repeats", "4", "--json", str(out)]) == 130
    assert capsys.readouterr().err.endswith("scratchgpt bench sample: interrupted\n")
    figures = json.loads(out.read_text())
    assert figures["interrupted"] is True and figures["repeats"] == 4
    assert [(r["variant"], r["runs"]) for r in figures["results"]] == [("eager", 1)]


def test_bench_sample_stopped_in_its_warm_up_writes_no_file(tmp_path, capsys, monkeypatch):
    _stop_sampling_at(monkeypatch, 1)
    out = tmp_path / "figures.json"
    assert main([*SAMPLE, "--json", str(out)]) == 130
    assert not out.exists()
    capsys.readouterr()


@pytest.mark.parametrize("suite, there", [("sms", "sms-base"), ("synthetic", "stdlib-base"),
                                          ("instruction-data", "instruction-data-sft")])
def test_bench_finetune_keeps_an_earlier_run_without_overwrite(suite, there, tmp_path,
                                                               capsys):
    """A second run into the same --out was refused by prepare with a hint at --overwrite,
    a flag bench finetune lacked (or replaced the earlier runs silently)."""
    (tmp_path / there).mkdir()
    (tmp_path / there / "best.pt").write_text("earlier run")
    line = error_of(capsys, ["bench", "finetune", "--suite", suite, "--out", str(tmp_path)])
    assert there in line and "pass --overwrite" in line
    assert (tmp_path / there / "best.pt").read_text() == "earlier run"


@pytest.mark.parametrize("flags, needle", [
    (["--finetune-budget", "4x"], "--finetune-budget"),
    (["--pretrain-budget", "0s"], "--pretrain-budget"),
    (["--epochs", "0"], "--epochs"), (["--lora-rank", "0"], "--lora-rank"),
    # refused as every setting refuses them (it said "--epochs must be > 0, got inf")
    (["--epochs", "inf"], "--epochs must be a finite number, got inf"),
    (["--epochs", "nan"], "--epochs must be a finite number, got nan"),
    (["--last-k", "0"], "--last-k"), (["--last-k", "5"], "--last-k"),
    # (refused by the LoRA run, after pretraining and two other fine-tuning runs)
    (["--lora-rank", "129"], "--lora-rank must be at most 128 (the width of the pretrained"),
    (["--base", "x"], "--base"), (["--suite", "synthetic", "--records", "5"], "--records"),
])
def test_bench_finetune_refuses_nonsense_before_pretraining(flags, needle, tmp_path, capsys,
                                                           suites_must_not_run):
    """Each was found only minutes in: after pretraining, or after the first fine-tuning."""
    assert needle in error_of(capsys, ["bench", "finetune", "--out", str(tmp_path / "b"),
                                       *flags])
    assert not (tmp_path / "b").exists()


@pytest.fixture
def suites_must_not_run(monkeypatch):
    """A refusal that does not come makes the test fail at once, not run a benchmark (the
    synthetic suite still writes its generated data for a --base, as it did before the
    base was checked)."""
    from scratchgpt.bench import finetune as bench

    for name in ("sms_suite", "_char_base", "pretrain", "finetune"):
        monkeypatch.setattr(bench, name, lambda *a, **k: pytest.fail("the suite ran"))


@pytest.mark.parametrize("suite, flags, uses", [
    ("sms", ["--records", "1000"], "--suite synthetic only"),
    ("instruction-data", ["--records", "1000"], "--suite synthetic only"),
    ("synthetic", ["--lora-rank", "8"], "--suite sms only"),
    ("instruction-data", ["--lora-rank", "4"], "--suite sms only"),  # even the default value
    ("synthetic", ["--last-k", "2"], "--suite sms only"),
    ("instruction-data", ["--last-k", "1"], "--suite sms only"),
    ("sms", ["--base", "x"], "--suite synthetic and instruction-data"),
    ("synthetic", ["--base", "x", "--pretrain-budget", "1m"], "only without --base"),
])
def test_bench_finetune_refuses_a_flag_its_suite_ignores(suite, flags, uses, tmp_path, capsys,
                                                         suites_must_not_run):
    """--lora-rank, --last-k and --records were accepted by suites that never read them, so a
    run silently differed from what its command line said."""
    line = error_of(capsys, ["bench", "finetune", "--suite", suite, "--out", str(tmp_path / "b"),
                             *flags])
    assert line.split(": error: ")[1].startswith(flags[-2]) and uses in line, line
    assert suite in line or "--base" in line
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("suite, run", [("synthetic", "synthetic-sft"),
                                        ("instruction-data", "instruction-data-sft")])
@pytest.mark.parametrize("base, says", [
    ("missing", "does not exist"), ("lstm.pt", "{where}: holds an lstm model"),
    ("its own run", "would replace the model"),
    # (refused once the suite had made --out, pretrained nothing and read the data)
    ("gpt.pt", "{where}: the base's tokenizer cannot write the chat template's marker "
               "'<|system|>' (its vocabulary lacks")])
def test_bench_finetune_checks_its_base_before_writing_anything(suite, run, base, says,
                                                                other_models, tmp_path, capsys,
                                                                suites_must_not_run):
    """A bad --base was found only by the fine-tuning, after the synthetic suite had written
    its generated data (and either suite had made --out)."""
    out = tmp_path / "b"
    where = {"missing": tmp_path / "missing", "lstm.pt": other_models / "lstm.pt",
             "gpt.pt": other_models / "gpt.pt", "its own run": out / run}[base]
    if base == "its own run":  # an earlier run of the suite, replaced by --overwrite
        where.mkdir(parents=True)
    line = error_of(capsys, ["bench", "finetune", "--suite", suite, "--out", str(out),
                             "--base", str(where), "--overwrite"])
    # (a base that is no GPT was named as finetune's --init-from, a flag nobody typed here)
    assert says.format(where=f"--base {where}") in line and "--base" in line, line
    assert "--init-from" not in line, line
    left = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    assert left == (["b", f"b/{run}"] if base == "its own run" else [])


TINY_GPT = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--vocab-size", "50",
            "--block-size", "32"]


@pytest.mark.parametrize("argv, needle", [
    (["sample", "--repeats", "0"], "--repeats"), (["sample", "--tokens", "0"], "--tokens"),
    (["sample", "--preset", "nope"], "--preset"),
    (["generate", "--repeats", "0"], "--repeats"), (["generate", "--new-tokens", "0"],
                                                   "--new-tokens"),
    (["generate", "--batch", "-1"], "--batch"),
    (["generate", *TINY_GPT, "--prompt-len", "4", "--new-tokens", "29"], "--block-size 32"),
    (["generate", *TINY_GPT, "--prompt-len", "4", "--new-tokens", "2", "--recompute-tokens",
      "29"], "--recompute-tokens"),
    (["decode-step", "--repeats", "-1"], "--repeats"), (["decode-step", "--ops", "-1"], "--ops"),
    (["decode-step", *TINY_GPT, "--tokens", "32"], "--tokens 32"),
    (["decode-step", "--preset", "warandpeace-lstm"], "trains an lstm model"),
    # a random model's shape beside a preset was silently dropped for the preset's
    (["decode-step", "--preset", "cpu-small", "--n-layer", "3"], "--preset gives the shape"),
    (["decode-step", "--n-embd", "0"], "--n-embd"),
])
def test_counts_a_benchmark_cannot_run_are_one_line(argv, needle, capsys):
    """Each was a traceback (an empty median, an index or shape error) or a wrong figure:
    sample --tokens 0 gave 0 tokens/s, and decode-step timed a GPT it named after the LSTM
    preset."""
    assert needle in error_of(capsys, ["bench", *argv])


@pytest.fixture(scope="module")
def other_models(tmp_path_factory):
    """A GPT classifier and an LSTM language model, each a .pt file beside a tokenizer."""
    from scratchgpt.checkpoints import Checkpoint, save_checkpoint
    from scratchgpt.models import build_model, model_config
    from scratchgpt.models.classifier import GPTClassifierConfig
    from scratchgpt.models.gpt import GPTConfig
    from scratchgpt.tokenizers import CharTokenizer

    root = tmp_path_factory.mktemp("models")
    CharTokenizer(list("abc \n")).save(root)
    configs = {"gpt-classifier": GPTClassifierConfig(GPTConfig(
        vocab_size=5, block_size=8, n_layer=1, n_head=1, n_embd=8), 2),
        "lstm": model_config("lstm", vocab_size=5),
        "gpt": model_config("gpt", vocab_size=5, block_size=8, n_layer=1, n_head=1, n_embd=8)}
    for kind, cfg in configs.items():
        save_checkpoint(root / f"{kind}.pt",
                        Checkpoint(kind, cfg, build_model(cfg).state_dict()))
    # a GPT whose characters write the chat template, as the instruction suites need
    chars = CharTokenizer.train("<|system|>\n<|user|>\n<|assistant|>\n<|end|> abc")
    chars.save(root / "chat")
    cfg = model_config("gpt", vocab_size=chars.vocab_size, block_size=8, n_layer=1, n_head=1,
                       n_embd=8)
    save_checkpoint(root / "chat" / "gpt.pt", Checkpoint("gpt", cfg, build_model(cfg).state_dict()))
    return root


@pytest.mark.parametrize("suite", ["synthetic", "instruction-data"])
def test_bench_finetune_tunes_the_base_it_checked_without_loading_it_again(
        suite, other_models, tmp_path, monkeypatch):
    """--base was loaded to be checked before anything was written, then loaded a second time
    when the fine-tuning began (minutes, for a large base)."""
    from scratchgpt.bench import finetune as bench
    from scratchgpt.finetune import base as bases

    loads, real = [], bases.load_base
    monkeypatch.setattr(bases, "load_base", lambda *a, **k: loads.append(a) or real(*a, **k))

    class Requested(Exception):
        pass

    def requested(args, **request):  # where the suite would fine-tune
        raise Requested(request)

    monkeypatch.setattr(bench, "finetune", requested)
    base = str(other_models / "chat" / "gpt.pt")
    with pytest.raises(Requested) as asked:
        main(["bench", "finetune", "--suite", suite, "--out", str(tmp_path / "b"), "--base",
              base])
    request = asked.value.args[0]
    assert len(loads) == 1 and loads[0][0] == base, loads
    assert request["init_from"] == base and request["base"].source == base, request


@pytest.mark.parametrize("argv, needle", [
    (["sample", "--checkpoint", "gpt-classifier.pt"], "scratchgpt classify"),
    (["decode-step", "--checkpoint", "gpt-classifier.pt"], "scratchgpt classify"),
    (["speculative", "--checkpoint", "gpt-classifier.pt", "--draft", "ngram"],
     "scratchgpt classify"),
    (["decode-step", "--checkpoint", "lstm.pt"], "not a recurrent model"),
    # a preset beside a checkpoint was silently dropped for the checkpoint's model
    (["sample", "--checkpoint", "lstm.pt", "--preset", "cpu-medium"],
     "--checkpoint gives the model"),
    (["decode-step", "--checkpoint", "lstm.pt", "--n-layer", "3"], "--checkpoint gives the shape"),
])
def test_models_a_benchmark_cannot_time_are_one_line(argv, needle, other_models, capsys,
                                                     monkeypatch):
    """They were AttributeError ('no attribute new_cache', 'block_size') and ValueError
    (a recurrent state cannot roll back) tracebacks."""
    monkeypatch.chdir(other_models)
    assert needle in error_of(capsys, ["bench", *argv])


@pytest.mark.parametrize("argv, says", [
    (["bench", "train", "--n-embd", str(10**30)], "too large to build"),
    (["bench", "train", "--n-embd", "200064"], "this training step needs about"),
    (["bench", "recurrent", "--hidden", str(10**30)], "too large to build"),
    (["bench", "recurrent", "--seq-len", str(10**12)], "timing the rnn needs about"),
    (["bench", "decode-step", "--n-embd", str(12 * 10**30)], "too large to build"),
    (["bench", "seq2seq", "--n-train", str(10**30)], "pairs needs about"),
    (["bench", "speculative", "--random-target", f"1,2,{10**30}"], "too large to build"),
    (["bench", "speculative", "--random-target", "1,2,32", "--block-size", "64",
      "--prompt-len", str(10**30)], "--prompt-len must be in [1, 64]"),
])
def test_a_shape_beyond_memory_is_refused_before_anything_is_built(argv, says, capsys):
    """A size past any memory was an OverflowError or an allocation failure (traceback),
    or for --n-train a generator making pairs for ever."""
    assert says in error_of(capsys, argv)


def test_bench_finetune_stopped_while_pretraining_ends_there(tmp_path, capsys, monkeypatch):
    """Ctrl-C stopped the pretraining alone: the fine-tunings then ran on the half-trained
    base, and the table came out as if nothing had happened."""
    import math

    from scratchgpt.training import job
    from scratchgpt.training.trainer import TrainResult

    def stopped(*args, **kwargs):  # as train returns when a Ctrl-C arrived during the run
        return TrainResult(1, math.nan, math.nan, math.nan, 0.1, 0.0, True, None,
                           exit_code=130)

    monkeypatch.setattr(job, "train", stopped)
    monkeypatch.setattr(job, "run", lambda *a, **k: pytest.fail("a fine-tuning ran"))
    assert main(["bench", "finetune", "--suite", "synthetic", "--out", str(tmp_path / "b"),
                 "--pretrain-budget", "1s"]) == 130
    assert capsys.readouterr().err.endswith("scratchgpt bench finetune: interrupted\n")


@pytest.mark.parametrize("budget", ["", "0s", "abc"])
def test_bench_seq2seq_budget_is_a_positive_duration(budget, capsys):
    """--budget '' (no budget: no time limit) ended in a TypeError traceback after the data
    was made, and --budget 0s was refused as 'time_budget: ...', a flag no one typed."""
    line = error_of(capsys, ["bench", "seq2seq", f"--budget={budget}", "--archs", "lstm"])
    assert "error: argument --budget: expected a positive duration" in line
    assert repr(budget) in line


@pytest.mark.parametrize("argv, says", [
    (["seq2seq", "--archs", "lstm", "transformer", "lstm", "--budget", "1s"],
     "--archs names lstm more than once"),
    (["recurrent", "--cells", "gru", "rnn", "gru", "rnn"], "--cells names gru, rnn more than once"),
])
def test_a_model_named_twice_is_refused(argv, says, tmp_path, capsys, monkeypatch):
    """Each name ran again, a row of the table each time: another 10-minute budget of
    training in bench seq2seq. Refused before anything is made, the --json file too."""
    from scratchgpt.training.seq2seq import Seq2SeqTask

    def never(*args, **kwargs):
        raise AssertionError("the pairs were made before the flags were checked")

    monkeypatch.setattr(Seq2SeqTask, "from_spec", never)
    assert says in error_of(capsys, ["bench", *argv, "--json", str(tmp_path / "r.json")])
    assert not (tmp_path / "r.json").exists()


def test_bench_sample_prompt_longer_than_the_context_is_refused(capsys):
    """A --prompt-len past the model's context was cut to its last context-length tokens in
    silence, and the figure reported for a prompt the run never had."""
    from scratchgpt.training.config import PRESETS

    ctx = PRESETS["cpu-small"]["block_size"]
    line = error_of(capsys, ["bench", "sample", "--prompt-len", str(ctx + 1), "--tokens", "2",
                             "--repeats", "1"])
    assert f"--prompt-len must be in [1, {ctx}] (the model's context), got {ctx + 1}" in line
    assert main(["bench", "sample", "--prompt-len", str(ctx), "--tokens", "2",
                 "--repeats", "1"]) == 0
    capsys.readouterr()


def speculative_header(capsys, threads: int) -> str:
    """The first line bench speculative prints for a report of no rows: an n-gram drafter,
    8 tokens x 1 run per K, on ``threads`` threads."""
    from scratchgpt.bench.speculative import print_report

    print_report({"target": "random GPT 1,2,32", "target_params": 12_345, "draft": "ngram",
                  "draft_params": 0, "prompt_tokens": 64, "tokens": 8, "repeats": 1,
                  "sampling": {"temperature": 0.8, "top_k": None, "top_p": 0.9},
                  "threads": threads, "dtype": "fp32", "draft_dtype": "fp32", "compiled": [],
                  "results": []})
    return capsys.readouterr().out.splitlines()[0]


def test_bench_speculative_header_reads_as_words(capsys):
    """The header showed a Python dict of the sampling settings, "(0.00M)" for a drafter with
    no weights and "1 threads"."""
    header = speculative_header(capsys, 1)
    assert "draft ngram (no weights)" in header and "; 1 thread;" in header
    assert "sampling: temperature 0.8, top-k off, top-p 0.9;" in header


@pytest.mark.parametrize("top_k, top_p, says", [
    (0, None, "top-k off, top-p off;"), (5, 1.0, "top-k 5, top-p off;"),
    (None, 0.5, "top-k off, top-p 0.5;"),
])
def test_bench_speculative_header_says_off_for_a_setting_that_means_off(top_k, top_p, says,
                                                                         capsys):
    """--top-k 0 keeps every token, as no --top-k does, but the header said "top-k 0"."""
    from scratchgpt.bench.speculative import print_report

    print_report({"target": "random GPT 1,2,32", "target_params": 12_345, "draft": "ngram",
                  "draft_params": 0, "prompt_tokens": 64, "tokens": 8, "repeats": 1,
                  "sampling": {"temperature": 0.8, "top_k": top_k, "top_p": top_p},
                  "threads": 1, "dtype": "fp32", "draft_dtype": "fp32", "compiled": [],
                  "results": []})
    header = capsys.readouterr().out.splitlines()[0]
    assert f"sampling: temperature 0.8, {says}" in header


def test_bench_seq2seq_refuses_a_batch_beyond_memory_before_training(capsys, monkeypatch):
    """Memory is counted as 'seq2seq train' counts it, before any model trains: a huge
    --batch-size of long reverse pairs was stopped only by the allocator, in a traceback,
    after the models before it had trained (here the lstm, which fits: the transformer's
    attention does not)."""
    from scratchgpt.training.trainer import Trainer

    def never(*args, **kwargs):
        raise AssertionError("a model was built before memory was checked")

    monkeypatch.setattr(Trainer, "__init__", never)
    monkeypatch.setenv("SCRATCHGPT_MEMORY_LIMIT", "2.5GiB")
    line = error_of(capsys, ["bench", "seq2seq", "--task", "reverse", "--n-train", "2000",
                             "--n-test", "20", "--batch-size", "100000", "--archs", "lstm",
                             "transformer", "--budget", "1s", "--no-progress"])
    assert "training on these pairs, 2,000 to a batch, needs about" in line
    assert re.search(r"attention [1-9]", line) and "give --batch-size" in line


@pytest.mark.parametrize("argv, says", [
    (["decode-step", *TINY_GPT, "--tokens", "1,5,1"], "--tokens names 1 more than once"),
    (["decode-step", *TINY_GPT, "--variants", "plain,prepared,plain"],
     "--variants names plain more than once"),
    (["generate", *TINY_GPT, "--prompt-len", "4", "--new-tokens", "2", "--no-hf",
      "--dtypes", "int8,fp32,int8"], "--dtypes names int8 more than once"),
    (["speculative", "--random-target", "1,2,16", "--random-draft", "1,1,8", "--vocab-size",
      "50", "--block-size", "32", "--tokens", "2", "--k", "2,auto,2"],
     "--k names 2 more than once"),
])
def test_a_size_or_variant_named_twice_is_refused(argv, says, capsys):
    """Each was timed again, a row of the table each time, with nothing to compare it to
    (the tiny model's benchmark ran to the end and printed both)."""
    assert says in error_of(capsys, ["bench", *argv])
