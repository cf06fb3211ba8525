"""The tokenize benchmark runs end to end and checks its encoders agree."""

from __future__ import annotations

import argparse

import pytest

from scratchgpt.bench import tokenize
from scratchgpt.errors import ScratchGPTError


def _args(**kw) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    tokenize.add_arguments(parser)
    args = parser.parse_args([])
    vars(args).update(kw)
    return args


def test_tokenize_bench_runs(english_text, tmp_path, capsys):
    data = tmp_path / "small.txt"
    data.write_text(english_text[:20_000] + "\n😀 it's  \n", encoding="utf-8")
    assert tokenize.run(_args(data=data, repeat=1, vocab_size=300)) == 0
    out = capsys.readouterr().out
    assert "all encodings equal: yes" in out
    assert "tiktoken gpt2 (reference)" in out and "python, cold cache" in out
    assert "BPE training to vocab 300" in out


def test_tokenize_bench_needs_data(monkeypatch, tmp_path):
    monkeypatch.delenv("SCRATCHGPT_DATA_DIR", raising=False)
    with pytest.raises(ScratchGPTError, match="SCRATCHGPT_DATA_DIR"):
        tokenize.run(_args())
    with pytest.raises(ScratchGPTError, match="does not exist"):
        tokenize.run(_args(data=tmp_path / "missing.txt"))


@pytest.mark.parametrize("content,message", [(b"", "is empty"), (b"caf\xe9", "not valid UTF-8")])
def test_tokenize_bench_refuses_text_it_cannot_encode_in_one_line(tmp_path, capsys, content,
                                                                   message):
    from tests.cli_errors import error_of

    (tmp_path / "t.txt").write_bytes(content)
    assert message in error_of(capsys, ["bench", "tokenize", "--data", str(tmp_path / "t.txt"),
                                        "--repeat", "1"])


def test_tokenize_bench_refuses_counts_below_one(capsys):
    from tests.cli_errors import error_of

    assert "--train-repeat" in error_of(capsys, ["bench", "tokenize", "--train-repeat", "0"])


def test_a_data_dir_without_the_corpus_says_so_and_what_to_do(monkeypatch, tmp_path, capsys):
    from tests.cli_errors import error_of

    monkeypatch.setenv("SCRATCHGPT_DATA_DIR", str(tmp_path))
    line = error_of(capsys, ["bench", "tokenize", "--repeat", "1"])
    assert f"SCRATCHGPT_DATA_DIR is {tmp_path}, which holds no tinyshakespeare.txt" in line
    assert "--data FILE" in line


def test_counts_of_one_read_in_the_singular(tmp_path, capsys):
    (tmp_path / "t.txt").write_text("   \n", encoding="utf-8")  # three merges, then one token
    assert tokenize.run(_args(data=tmp_path / "t.txt", repeat=1, vocab_size=300)) == 0
    out = capsys.readouterr().out
    assert "(best of 1), 3 merges; this text is then 1 token (4.00 chars/token)" in out


def test_run_as_a_module_it_is_the_command_and_refuses_in_one_line(tmp_path):
    """docs/bench_tokenize.md runs it as python -m scratchgpt.bench.tokenize, which printed a
    refusal as a traceback: it had a parser of its own and no error handling."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "SCRATCHGPT_DATA_DIR"}
    done = subprocess.run([sys.executable, "-m", "scratchgpt.bench.tokenize", "--repeat", "1"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "scratchgpt bench tokenize: error: no text to encode: pass --data FILE, or put "
        "tinyshakespeare.txt in a folder and set SCRATCHGPT_DATA_DIR to it"]


def test_json_on_stdout_and_in_a_file_is_the_same_object(tmp_path, capsys):
    """bench tokenize was the one benchmark without --json: its figures could only be read
    off the printed table. It takes --json [FILE] as the others do."""
    import json

    from scratchgpt.cli import main
    from tests.bench.test_json_output import shape_of

    (tmp_path / "t.txt").write_text("to be or not to be\n" * 50, encoding="utf-8")
    args = ["bench", "tokenize", "--data", str(tmp_path / "t.txt"), "--repeat", "1",
            "--vocab-size", "300"]
    assert main([*args, "--json"]) == 0
    printed = capsys.readouterr()
    figures = json.loads(printed.out)  # the object alone: the table went to stderr
    assert "all encodings equal: yes" in printed.err
    assert figures["interrupted"] is False and figures["all_equal"] is True
    assert {e["tokens"] for e in figures["encoders"]} == {figures["encoders"][0]["tokens"]}
    assert figures["bpe_training"]["vocab_size"] == 300
    assert main([*args, "--json", str(tmp_path / "f.json")]) == 0
    assert "all encodings equal: yes" in capsys.readouterr().out
    assert shape_of(json.loads((tmp_path / "f.json").read_text())) == shape_of(figures)


def test_ctrl_c_in_bpe_training_keeps_the_encoders_measured(tmp_path, capsys, monkeypatch):
    import json

    from scratchgpt.cli import main
    from scratchgpt.tokenizers.bpe import BPETokenizer

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(BPETokenizer, "train", interrupted)
    (tmp_path / "t.txt").write_text("to be or not to be\n" * 50, encoding="utf-8")
    out = tmp_path / "f.json"
    assert main(["bench", "tokenize", "--data", str(tmp_path / "t.txt"), "--repeat", "1",
                 "--json", str(out)]) == 130
    figures = json.loads(out.read_text())
    assert figures["interrupted"] is True and figures["bpe_training"] is None
    assert len(figures["encoders"]) >= 3 and figures["all_equal"] is True
