"""A benchmark that prints its table at the end, stopped by Ctrl-C without --json, prints the
rows it had measured (it printed nothing of them: only '... interrupted'), exit 130."""

from __future__ import annotations

from scratchgpt.cli import main
from tests.bench.test_json_output import SMALLEST, _stop_at, stop_train_in_second_turn


def _stopped(capsys, argv: list[str], name: str) -> str:
    """What ``argv`` printed on stdout, stopped by Ctrl-C (exit 130)."""
    assert main(argv) == 130
    printed = capsys.readouterr()
    assert printed.err.endswith(f"scratchgpt bench {name}: interrupted\n")
    return printed.out


def test_bench_train_stopped_prints_the_variants_timed(capsys, monkeypatch):
    """Ctrl-C in the second turn: the table has the variant's row of the first turn."""
    stop_train_in_second_turn(monkeypatch)
    out = _stopped(capsys, SMALLEST["train"], "train")
    [row] = [line.split() for line in out.splitlines() if line.startswith("fp32 ")]
    ms_per_step, tokens_per_s = float(row[1]), float(row[2].replace(",", ""))
    assert ms_per_step > 0 and tokens_per_s > 0


def test_bench_sample_stopped_prints_the_runs_timed(capsys, monkeypatch):
    """Ctrl-C in the second timed run: the line of the first one."""
    from scratchgpt.generation import generate

    _stop_at(monkeypatch, generate, "generate", 3)  # warm-up, a timed run, then Ctrl-C
    out = _stopped(capsys, [*SMALLEST["sample"][:-1], "2"], "sample")
    assert "3 tokens: median" in out and "over 1 run (" in out


def test_bench_speculative_stopped_prints_the_ks_measured(capsys, monkeypatch):
    from scratchgpt.bench import speculative

    _stop_at(monkeypatch, speculative.Runner, "measure", 2)
    argv = [*SMALLEST["speculative"][:SMALLEST["speculative"].index("--k") + 1], "1,2",
            "--repeats", "1"]
    out = _stopped(capsys, argv, "speculative")
    rows = [line.split()[0] for line in out.splitlines()[2:] if line[:4].strip().isdigit()]
    assert rows == ["1"]


def test_bench_generate_stopped_prints_the_dtypes_measured(capsys, monkeypatch):
    from scratchgpt.bench import generate

    _stop_at(monkeypatch, generate, "measure", 2)  # fp32 measured, then Ctrl-C in bf16's
    out = _stopped(capsys, [*SMALLEST["generate"][:-1], "fp32,bf16"], "generate")
    rows = [line.split()[:2] for line in out.splitlines() if line.startswith(("fp32", "bf16"))]
    assert ["fp32", "ours"] in rows and not any(r[0] == "bf16" for r in rows)


def test_bench_decode_step_stopped_prints_the_calls_timed(capsys, monkeypatch):
    from scratchgpt.bench import decode_step

    _stop_at(monkeypatch, decode_step, "replay", 2)  # one repeat replayed, then Ctrl-C
    out = _stopped(capsys, SMALLEST["decode-step"], "decode-step")
    assert "[plain] 1 new token(s):" in out and "ms per call" in out


def test_bench_serve_engine_only_stopped_prints_the_one_row_figure(capsys, monkeypatch):
    from scratchgpt.bench import serve

    _stop_at(monkeypatch, serve, "engine_run", 3)  # the warm-up, one row, then Ctrl-C
    out = _stopped(capsys, SMALLEST["serve"], "serve")
    [line] = [line for line in out.splitlines() if line.startswith("1 row at a time: ")]
    assert float(line.split()[5]) > 0 and "rows:" not in line


def test_bench_serve_stopped_prints_the_phase_measured(capsys, monkeypatch):
    from tests.requires import optional

    optional("httpx")
    optional("uvicorn")
    from scratchgpt.serve import loadtest

    _stop_at(monkeypatch, loadtest, "load", 3)  # the warm-up, one at a time, then Ctrl-C
    out = _stopped(capsys, [a for a in SMALLEST["serve"] if a != "--engine-only"], "serve")
    rows = [line.split() for line in out.splitlines() if line.startswith(("1 client", "16 "))]
    assert [r[:2] for r in rows] == [["1", "client"]] and float(rows[0][2]) > 0


def test_bench_tokenize_stopped_prints_the_encoders_timed(tmp_path, capsys, monkeypatch):
    """Ctrl-C while the third encoder is timed: the two timed are in the table."""
    from scratchgpt.bench import tokenize

    _stop_at(monkeypatch, tokenize, "_best_of", 3)
    (tmp_path / "t.txt").write_text("to be or not to be\n" * 50, encoding="utf-8")
    out = _stopped(capsys, ["bench", "tokenize", "--data", str(tmp_path / "t.txt"),
                            "--repeat", "1"], "tokenize")
    rows = [line for line in out.splitlines() if line.startswith(("tiktoken", "scratchgpt"))]
    assert len(rows) == 2 and all(float(r.split()[-5]) > 0 for r in rows)  # MB/s
