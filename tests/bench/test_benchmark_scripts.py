"""The shell benchmarks: --help prints their usage and runs nothing, and a missing
prerequisite is one line on stderr (exit 2) before any run starts."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ["core", "finetune", "int8_gguf", "cpu_medium_sweep", "nanogpt_throughput"]
NEEDS_SCRATCHGPT = ["core", "finetune", "int8_gguf", "cpu_medium_sweep"]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")


def _script(name: str, *args: str, data_dir: Path | None = None,
            bin_dir: Path | None = None) -> subprocess.CompletedProcess:
    """Run benchmarks/NAME.sh with a PATH that holds no scratchgpt command (but the one in
    ``bin_dir``, where given)."""
    path = "/usr/bin:/bin" if bin_dir is None else f"{bin_dir}:/usr/bin:/bin"
    env = {"PATH": path, "HOME": os.environ.get("HOME", "/tmp")}
    if data_dir is not None:
        env["SCRATCHGPT_DATA_DIR"] = str(data_dir)
    return subprocess.run(["bash", str(ROOT / "benchmarks" / f"{name}.sh"), *args],
                          capture_output=True, text=True, env=env, timeout=60)


def _one_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_prints_the_usage_and_runs_nothing(name):
    """--help started the benchmark (core.sh its first hour of training, had scratchgpt been
    on PATH), or failed with 'cd: --: invalid option'."""
    done = _script(name, "--help")
    assert done.returncode == 0, done.stderr
    assert f"benchmarks/{name}.sh" in done.stdout and "== machine" not in done.stdout
    assert not done.stdout.startswith("#")


@pytest.mark.parametrize("name", NEEDS_SCRATCHGPT)
def test_scratchgpt_missing_from_path_is_one_line(name):
    """It was 'scratchgpt: command not found' once the machine had been described."""
    line = _one_line(_script(name))
    assert line.startswith(f"{name}.sh: scratchgpt is not on PATH")


def test_a_folder_that_is_no_nanogpt_checkout_is_refused(tmp_path):
    line = _one_line(_script("nanogpt_throughput", str(tmp_path)))
    assert f"{tmp_path} is no nanoGPT checkout" in line


def test_nanogpt_throughput_without_its_folder_says_its_usage():
    line = _one_line(_script("nanogpt_throughput"))
    assert "usage: benchmarks/nanogpt_throughput.sh NANOGPT_DIR" in line


def _fake_scratchgpt(folder: Path) -> Path:
    """A folder holding a ``scratchgpt`` that only notes each call in ``scratchgpt.log``."""
    folder.mkdir()
    (folder / "scratchgpt").write_text("#!/bin/sh\necho \"$@\" >> \"$0.log\"\n")
    (folder / "scratchgpt").chmod(0o755)
    return folder


def test_finetune_names_a_missing_corpus_before_any_suite_runs(tmp_path):
    """Each suite found its corpus missing only when it came: instruction-data.json after
    the other two suites had run. Each is checked first, one line naming the file."""
    fake, data = _fake_scratchgpt(tmp_path / "bin"), tmp_path / "corpora"
    data.mkdir()
    # (sms-spam's file is read under its other name too, SMSSpamCollection)
    for file, put in (("sms-spam.tsv", "SMSSpamCollection"),
                      ("instruction-data.json", "instruction-data.json")):
        line = _one_line(_script("finetune", data_dir=data, bin_dir=fake))
        assert line == f"finetune.sh: no {file} in SCRATCHGPT_DATA_DIR ({data}): set " \
                       "SCRATCHGPT_DATA_DIR to the folder that holds it"
        (data / put).write_text("x")
    assert not (fake / "scratchgpt.log").exists()
    gone = tmp_path / "gpt2"
    line = _one_line(_script("finetune", str(gone), data_dir=data, bin_dir=fake))
    assert line.startswith(f"finetune.sh: GPT2_DIR {gone} does not exist")
    assert not (fake / "scratchgpt.log").exists()
    done = _script("finetune", data_dir=data, bin_dir=fake)
    assert done.returncode == 0, done.stderr
    calls = (fake / "scratchgpt.log").read_text().splitlines()
    assert [c.split()[3] for c in calls] == ["sms", "synthetic", "instruction-data"]


def test_an_unknown_sweep_pair_is_refused_before_any_pair_runs(tmp_path):
    """'optimiser' ran every pair before it (the first, 1000 updates) and then failed."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "scratchgpt").write_text("#!/bin/sh\necho ran >> \"$0.log\"\n")
    (fake / "scratchgpt").chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "cpu_medium_sweep.sh"),
                           "optimizer", "optimiser"], capture_output=True, text=True, env=env,
                          timeout=60)
    assert "unknown pair optimiser: optimizer, budget, dropout or schedule" in _one_line(done)
    assert not (fake / "scratchgpt.log").exists()


@pytest.mark.parametrize("script, flag", [
    ("c_step_rows", "--threads"), ("dropout", "--rounds"), ("dropout", "--threads"),
    ("top_p", "--vocab"), ("muon_step", "--steps"), ("alternate", "--rounds"),
    ("batch_slide", "--batch"), ("batch_slide", "--new-tokens"),
    ("block_products", "--calls"), ("block_products", "--threads"), ("block_products", "--rows"),
])
def test_python_benchmarks_refuse_a_count_below_one(script, flag):
    """Each was a traceback once the benchmark had set up: torch's set_num_threads, an
    empty median, a division by zero (top_p --vocab 0 printed a table of zeros)."""
    import sys

    argv = ["--name", "a", "--cmd", "true"] if script == "alternate" else []
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{script}.py"), *argv,
                           flag, "0"], capture_output=True, text=True, timeout=120)
    assert f"argument {flag}: expected " in _one_line_of_usage_error(done)


def _one_line_of_usage_error(done: subprocess.CompletedProcess) -> str:
    """argparse's refusal: its usage, then one line of error; no traceback."""
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    return done.stderr.strip().splitlines()[-1]


def _python_script(script: str, *argv: str) -> subprocess.CompletedProcess:
    import sys

    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{script}.py"), *argv],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("rows, bad", [("0", "'0'"), ("1,0", "'0'"), ("4,,8", "''"),
                                       ("x", "'x'")])
def test_c_step_rows_refuses_a_batch_size_below_one(rows, bad):
    """--rows 0 was taken: a row of the table timed steps of no rows (and "x" was a
    ValueError traceback)."""
    line = _one_line_of_usage_error(_python_script("c_step_rows", "--rows", rows))
    assert f"argument --rows: expected a positive integer, got {bad} in {rows!r}" in line


def test_eval_split_refuses_a_folder_that_is_no_prepared_dataset(tmp_path):
    """It ended in a DataError traceback."""
    line = _one_line_of_usage_error(_python_script("eval_split", str(tmp_path)))
    assert f"{tmp_path} is not a prepared dataset (no meta.json)" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("variants, bad", [("w0", "w0"), ("w32,wide", "wide"),
                                           ("w32,", "")])
def test_eval_split_refuses_a_variant_it_cannot_run(variants, bad, tmp_path):
    """'wide' was a ValueError traceback and 'w0' a batch of no windows, once the model was
    built; the flag is checked before the dataset is read."""
    line = _one_line_of_usage_error(_python_script("eval_split", str(tmp_path),
                                                   "--variants", variants))
    assert f"argument --variants: expected wN (N windows a batch, N >= 1) or modules, " \
           f"comma-separated, got {bad!r} in {variants!r}" in line


@pytest.mark.parametrize("variants, twice", [("w32,w32", "w32"), ("w32,modules,w032", "w32"),
                                            ("modules,w8,modules,w8", "modules, w8")])
def test_eval_split_refuses_a_variant_named_twice(variants, twice, tmp_path):
    """Each was timed again, a row of the table each time (w032 is w32), where the bench
    commands refuse a size or variant named twice; checked before the dataset is read."""
    line = _one_line_of_usage_error(_python_script("eval_split", str(tmp_path),
                                                   "--variants", variants))
    assert line.endswith(f"error: --variants names {twice} more than once"), line


def test_c_step_rows_refuses_more_steps_than_the_context_holds():
    """--steps 100 at cpu-small's context of 64 was a GenerationError traceback once the
    first round had reached the 65th position."""
    line = _one_line_of_usage_error(_python_script("c_step_rows", "--rows", "1",
                                                   "--steps", "57"))
    assert "argument --steps: at most 56 for --shape cpu-small" in line and "got 57" in line


def test_batch_slide_refuses_a_decode_file_that_is_not_there(tmp_path):
    """Checked before the model is built and the first variant timed."""
    missing = tmp_path / "decode.py"
    line = _one_line_of_usage_error(_python_script("batch_slide", "--against", str(missing)))
    assert f"argument --against: no such file: {str(missing)!r}" in line


def test_seq2seq_decode_refuses_an_against_file_that_is_not_there(tmp_path):
    missing = tmp_path / "seq2seq.py"
    line = _one_line_of_usage_error(_python_script("seq2seq_decode", "--against", str(missing)))
    assert f"argument --against: no such file: {str(missing)!r}" in line


@pytest.mark.parametrize("text, says", [("x = 1\n", "no TransformerSeq2Seq in"),
                                        ("def (\n", "cannot import")])
def test_seq2seq_decode_refuses_an_against_file_that_is_no_seq2seq_module(tmp_path, text, says):
    """Refused as a bad flag is, not by a traceback (AttributeError, SyntaxError) on loading."""
    other = tmp_path / "other.py"
    other.write_text(text)
    done = _python_script("seq2seq_decode", "--against", str(other), "--batch", "1",
                          "--tokens", "2", "--rounds", "1")
    assert f"argument --against: {says} {str(other)!r}" in _one_line_of_usage_error(done)


def test_seq2seq_decode_times_an_earlier_cache_against_this_one(tmp_path):
    """--against: both versions' KV-cache decodes (checked equal first), one row each."""
    before = tmp_path / "seq2seq_before.py"
    before.write_text((ROOT / "src" / "scratchgpt" / "models" / "seq2seq.py").read_text())
    done = _python_script("seq2seq_decode", "--against", str(before), "--batch", "2",
                          "--tokens", "3", "--rounds", "1")
    assert done.returncode == 0, done.stderr
    rows = [line.split("|")[1].strip() for line in done.stdout.splitlines()
            if line.startswith("| KV") or line.startswith("| whole")]
    assert rows == ["KV cache, seq2seq_before.py", "KV cache, this version"]


def test_block_products_refuses_rows_its_products_cannot_take():
    """Rows that are no multiple of 32 (or a CPU with neither AMX nor AVX512-BF16) are one
    line before anything is timed: the step would take PyTorch's products there."""
    line = _one_line_of_usage_error(_python_script("block_products", "--rows", "100"))
    assert "must be multiples of 32" in line or "neither AMX tiles nor AVX512-BF16" in line
