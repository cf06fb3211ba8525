"""Every benchmark's ``--json [FILE]``: without FILE one JSON object on stdout (what the
benchmark prints otherwise going to stderr), with FILE the same object written there; and a
run stopped by Ctrl-C gives what it measured, marked interrupted, exit 130."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from scratchgpt.cli import main
from scratchgpt.commands.bench import BENCHMARKS
from tests.bench.test_bench_flags import RANDOM_PAIR, RECURRENT, SAMPLE
from tests.bench.test_decode_step_bench import SHAPE as DECODE_SHAPE
from tests.bench.test_generate_bench import SHAPE as GENERATE_SHAPE
from tests.bench.test_train_bench import SHAPE as TRAIN_SHAPE
from tests.requires import optional

SMALLEST = {
    "train": ["bench", "train", *TRAIN_SHAPE, "--variants", "fp32", "--attn-dropout", "0"],
    "sample": [*SAMPLE, "--repeats", "1"],
    "recurrent": RECURRENT,
    "generate": ["bench", "generate", *GENERATE_SHAPE, "--dtypes", "fp32"],
    "decode-step": ["bench", "decode-step", *DECODE_SHAPE, "--tokens", "1", "--variants",
                    "plain"],
    "speculative": RANDOM_PAIR,
    "seq2seq": ["bench", "seq2seq", "--budget", "1s", "--archs", "lstm", "--n-train", "50",
                "--n-test", "5", "--no-progress"],
    "serve": ["bench", "serve", "--engine-only", "--clients", "1", "--requests", "1",
              "--prompt-tokens", "2", "--max-tokens", "2", "--threads", "1"],
}


def shape_of(value: Any) -> Any:
    """``value`` with every number replaced by its kind: two runs of a benchmark measure other
    times, but name the same settings, rows and keys."""
    if isinstance(value, dict):
        return {k: shape_of(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape_of(v) for v in value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return "number"
    return value


def test_every_benchmark_with_json_is_in_the_table():
    assert set(SMALLEST) | {"finetune", "tokenize"} == set(BENCHMARKS)


@pytest.mark.parametrize("name", sorted(SMALLEST))
def test_json_on_stdout_and_in_a_file_is_the_same_object(name, tmp_path, capsys):
    """bench train, generate, decode-step, speculative and serve took --json as a switch
    (stdout), recurrent, sample, seq2seq and finetune as --json FILE: a user could not guess
    which. Both forms work for every benchmark, and give the same object."""
    if name == "serve":
        optional("httpx")
    assert main([*SMALLEST[name], "--json"]) == 0
    printed = capsys.readouterr()
    on_stdout = json.loads(printed.out)  # the object alone: the table went to stderr
    assert on_stdout["interrupted"] is False
    assert printed.err.strip()
    file = tmp_path / "figures.json"
    assert main([*SMALLEST[name], "--json", str(file)]) == 0
    table = capsys.readouterr().out
    in_file = json.loads(file.read_text())
    assert shape_of(in_file) == shape_of(on_stdout)
    assert table.strip() and not table.lstrip().startswith("{")  # the table, as without --json


@pytest.mark.parametrize("name", ["train", "generate", "decode-step", "speculative", "serve"])
def test_json_file_is_checked_before_the_benchmark_and_kept(name, tmp_path, capsys,
                                                             monkeypatch):
    """The benchmarks that printed JSON take a FILE as those that wrote one do: one holding
    earlier results is kept without --overwrite, and one no folder can hold is refused, both
    before the benchmark runs."""
    import importlib

    module = importlib.import_module(f"scratchgpt.bench.{name.replace('-', '_')}")
    earlier = tmp_path / "figures.json"
    earlier.write_text("earlier results")
    from tests.cli_errors import error_of

    for spy in ("matmul_peak", "read_bandwidth", "build", "random_setup", "write_random_run"):
        if hasattr(module, spy):
            monkeypatch.setattr(module, spy, lambda *a, **k: pytest.fail("the benchmark ran"))
    assert "pass --overwrite" in error_of(capsys, [*SMALLEST[name], "--json", str(earlier)])
    assert earlier.read_text() == "earlier results"
    if Path("/proc/self").is_dir():  # /proc takes no new file, whoever runs the test
        where = Path("/proc/scratchgpt-bench/figures.json")
        assert f"--json {where}: no file can be written in /proc (" in error_of(
            capsys, [*SMALLEST[name], "--json", str(where)])


def test_bench_finetune_json_on_stdout_and_in_a_file_is_the_same_object(tmp_path, capsys,
                                                                       monkeypatch):
    """bench finetune took --json FILE alone. Its suites train for minutes on corpora; here
    the suite is one that reports at once, what bench finetune does with its figures is
    what is tested."""
    from scratchgpt.bench import finetune

    def suite(args, out, rows=None):
        print("a row of the table")
        return {"suite": "sms", "rows": [{"mode": "full fine-tuning", "accuracy": 0.5}]}

    monkeypatch.setattr(finetune, "sms_suite", suite)
    argv = ["bench", "finetune", "--suite", "sms", "--out", str(tmp_path / "runs")]
    assert main([*argv, "--json"]) == 0
    printed = capsys.readouterr()
    on_stdout = json.loads(printed.out)
    assert "a row of the table" in printed.err
    file = tmp_path / "figures.json"
    assert main([*argv, "--overwrite", "--json", str(file)]) == 0
    assert "a row of the table" in capsys.readouterr().out
    assert shape_of(json.loads(file.read_text())) == shape_of(on_stdout)
    assert on_stdout["rows"] == [{"mode": "full fine-tuning", "accuracy": 0.5}]


def _stop_at(monkeypatch, owner: Any, name: str, call: int) -> None:
    """Ctrl-C as ``owner.name`` is called the ``call``-th time (the calls before run)."""
    real, calls = getattr(owner, name), {"n": 0}

    def stopping(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == call:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, stopping)


def _interrupted(capsys, argv: list[str], name: str) -> dict:
    """The object ``argv --json`` printed, the run stopped by Ctrl-C (exit 130)."""
    assert main([*argv, "--json"]) == 130
    printed = capsys.readouterr()
    assert printed.err.endswith(f"scratchgpt bench {name}: interrupted\n")
    figures = json.loads(printed.out)
    assert figures["interrupted"] is True
    return figures


def test_bench_generate_stopped_keeps_the_dtypes_measured(capsys, monkeypatch):
    """bench generate --json printed nothing when Ctrl-C stopped it: the dtypes measured
    were lost."""
    from scratchgpt.bench import generate

    _stop_at(monkeypatch, generate, "measure", 2)  # fp32 measured, then Ctrl-C in bf16's
    figures = _interrupted(capsys, [*SMALLEST["generate"][:-1], "fp32,bf16"], "generate")
    assert list(figures["variants"]) == ["fp32"]
    assert figures["variants"]["fp32"]["ours"]["decode_tok_s_median"] > 0


def test_bench_speculative_stopped_keeps_the_ks_measured(capsys, monkeypatch):
    from scratchgpt.bench import speculative

    _stop_at(monkeypatch, speculative.Runner, "measure", 2)
    argv = [*RANDOM_PAIR[:RANDOM_PAIR.index("--k") + 1], "1,2", "--repeats", "1"]
    figures = _interrupted(capsys, argv, "speculative")
    assert [row["k"] for row in figures["results"]] == [1]


def test_bench_decode_step_stopped_keeps_the_calls_timed(capsys, monkeypatch):
    from scratchgpt.bench import decode_step

    _stop_at(monkeypatch, decode_step, "replay", 2)  # one repeat replayed, then Ctrl-C
    figures = _interrupted(capsys, SMALLEST["decode-step"], "decode-step")
    [call] = figures["calls"]
    assert (call["variant"], call["tokens"]) == ("plain", 1) and call["call_ms"] > 0
    assert figures["context"] == 8


def stop_train_in_second_turn(monkeypatch) -> None:
    """bench train's steps, with Ctrl-C at the third call of each variant's step: after the
    warm-up and the first turn's step (one step a turn)."""
    from scratchgpt.bench import train

    real = train.variant_step

    def stopping_step(args, variant):
        step, model = real(args, variant)
        calls = {"n": 0}

        def counted():
            calls["n"] += 1
            if calls["n"] == 3:  # the warm-up, the first turn's step, then Ctrl-C
                raise KeyboardInterrupt
            return step()

        return counted, model

    monkeypatch.setattr(train, "variant_step", stopping_step)


def test_bench_train_stopped_keeps_the_turns_timed(capsys, monkeypatch):
    """Ctrl-C in the second of bench train's three turns (one step each): the results are
    the first turn's."""
    stop_train_in_second_turn(monkeypatch)
    figures = _interrupted(capsys, SMALLEST["train"], "train")
    [result] = figures["results"]
    assert result["variant"] == "fp32" and result["ms_per_step"] > 0
    assert "serial" not in figures  # a figure of every turn's steps


def test_bench_seq2seq_stopped_keeps_the_models_scored(tmp_path, capsys, monkeypatch):
    """Ctrl-C in the second model's training wrote no --json file: the first model's row,
    printed, was lost to it."""
    from scratchgpt.bench import seq2seq

    _stop_at(monkeypatch, seq2seq, "_run_arch", 2)
    out = tmp_path / "b.json"
    argv = [*SMALLEST["seq2seq"][:5], "lstm", "transformer", *SMALLEST["seq2seq"][6:]]
    assert main([*argv, "--json", str(out)]) == 130
    assert capsys.readouterr().err.endswith("scratchgpt bench seq2seq: interrupted\n")
    figures = json.loads(out.read_text())
    assert figures["interrupted"] is True
    assert [row["arch"] for row in figures["results"]] == ["lstm"]


def test_bench_serve_stopped_keeps_the_phase_measured(capsys, monkeypatch):
    optional("httpx")
    optional("uvicorn")
    from scratchgpt.serve import loadtest

    _stop_at(monkeypatch, loadtest, "load", 3)  # the warm-up, one at a time, then Ctrl-C
    argv = [a for a in SMALLEST["serve"] if a != "--engine-only"]
    figures = _interrupted(capsys, argv, "serve")
    assert figures["one_at_a_time"]["requests"] == 1 and "concurrent" not in figures


def test_bench_serve_engine_only_stopped_keeps_the_one_row_figure(capsys, monkeypatch):
    """bench serve --engine-only stopped by Ctrl-C printed and wrote nothing: the one row at
    a time figure, measured, was lost."""
    from scratchgpt.bench import serve

    # the warm-up, one row, then Ctrl-C (a count of ContinuousBatch's made counted the
    # server's own too, where serve/engine.py was first imported after the patch)
    _stop_at(monkeypatch, serve, "engine_run", 3)
    figures = _interrupted(capsys, SMALLEST["serve"], "serve")
    assert figures["engine_one_at_a_time_tokens_per_s"] > 0 and figures["tokens"] == [2]
    assert "engine_concurrent_tokens_per_s" not in figures


def test_bench_serve_soak_stopped_keeps_the_warm_up_answers(capsys, monkeypatch):
    """bench serve --soak stopped by Ctrl-C printed and wrote nothing: the warm-up's answers
    and the memory measured after it were lost."""
    optional("httpx")
    optional("uvicorn")
    from scratchgpt.serve import loadtest

    _stop_at(monkeypatch, loadtest, "soak", 2)  # the warm-up, then Ctrl-C in the soak
    argv = [a for a in SMALLEST["serve"] if a != "--engine-only"]
    figures = _interrupted(capsys, [*argv, "--soak", "--soak-requests", "6",
                                    "--soak-clients", "2"], "serve")["soak"]
    assert figures["warm_up"]["requests"] == 6 and figures["warm_up"]["server_errors"] == 0
    assert figures["rss_before_mb"] > 0 and "passed" not in figures


def test_bench_finetune_stopped_keeps_the_rows_measured(tmp_path, capsys, monkeypatch):
    """bench finetune --suite sms stopped by Ctrl-C in its first fine-tuning run wrote
    nothing: the baseline's row was lost. The suite's corpus, pretraining and baseline are
    stand-ins here (they take minutes and a downloaded corpus)."""
    from scratchgpt.bench import finetune
    from scratchgpt.data import prepare
    from scratchgpt.finetune import data

    pairs = [(f"text {i}", "spam" if i % 4 else "ham") for i in range(40)]
    monkeypatch.setattr(data, "read_labelled", lambda *a, **k: (pairs, "sms-spam", None))
    monkeypatch.setattr(prepare, "prepare_text", lambda *a, **k: None)
    monkeypatch.setattr(finetune, "pretrain", lambda *a, **k: 1.0)
    baseline = {"mode": "TF-IDF + logistic regression", "test_accuracy": 0.9}
    monkeypatch.setattr(finetune, "tfidf_baseline", lambda *a: dict(baseline))

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(finetune, "finetune", stopped)
    figures = _interrupted(capsys, ["bench", "finetune", "--out", str(tmp_path / "runs")],
                           "finetune")
    assert figures["suite"] == "sms" and figures["rows"] == [baseline]
