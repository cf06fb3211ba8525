"""`scratchgpt seq2seq` and `scratchgpt experiment` end to end, with tiny settings."""

import csv
import json

import pytest

from scratchgpt.cli import main

TINY = ["--n-train", "300", "--n-test", "40", "--steps", "15", "--d-model", "16",
        "--batch-size", "32", "--warmup", "3", "--no-progress", "--threads", "1"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt")
    rc = main(["seq2seq", "train", "--task", "dates", "--arch", "transformer",
               "--out", str(out), *TINY])
    assert rc == 0
    return out


def test_train_writes_checkpoint_with_config_and_tokenizers(checkpoint):
    info = json.loads((checkpoint / "seq2seq.json").read_text())
    assert info["model_config"]["arch"] == "transformer"
    assert info["model_config"]["d_model"] == 16
    assert "<" not in "".join(info["src_tokenizer"]["chars"])  # specials are implicit
    assert info["meta"]["data"]["task"] == "dates"
    assert info["meta"]["train"]["steps"] == 15
    assert (checkpoint / "seq2seq.pt").is_file()
    assert not list(checkpoint.glob(".*tmp*"))  # atomic write left no temp file


def test_translate_eval_and_attention(cli_main, checkpoint, tmp_path, capsys):
    capsys.readouterr()
    assert cli_main(["seq2seq", "translate", "--checkpoint", str(checkpoint),
                     "--source", "3 march 1999", "--source", "12/10/2001", "--beam", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2

    assert cli_main(["seq2seq", "eval", "--checkpoint", str(checkpoint), "--limit", "20"]) == 0
    out = capsys.readouterr().out
    assert "exact match" in out and "/20)" in out and "source chars" in out

    png = tmp_path / "heat.png"
    assert cli_main(["seq2seq", "attention", "--checkpoint", str(checkpoint),
                     "--source", "3 mar 99", "--out", str(png), "--layer", "0",
                     "--head", "1"]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(capsys.readouterr().out)["out"] == str(png)

    assert cli_main(["seq2seq", "attention", "--checkpoint", str(checkpoint),
                     "--source", "x", "--out", str(png), "--head", "9"]) == 2
    assert "--head must be in" in capsys.readouterr().err


def test_tsv_error_is_one_line_with_file_and_line(cli_main, tmp_path, capsys):
    bad = tmp_path / "pairs.tsv"
    bad.write_text("one\tun\ntwo deux\n", encoding="utf-8")
    rc = cli_main(["seq2seq", "train", "--data", str(bad), "--arch", "lstm",
                   "--out", str(tmp_path / "o"), *TINY])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert f"{bad}:2:" in err and "TAB" in err


def test_train_on_tsv_then_eval_on_file(cli_main, tmp_path, capsys):
    pairs = tmp_path / "rev.tsv"
    words = ["abc", "bca", "cab", "aab", "bba", "cca", "acb", "bac", "cba", "abb"] * 4
    pairs.write_text("".join(f"{w}{i % 7}\t{w[::-1]}\n" for i, w in enumerate(words)))
    out = tmp_path / "ckpt"
    assert cli_main(["seq2seq", "train", "--data", str(pairs), "--arch", "lstm-attention",
                     "--valid-fraction", "0.3", "--out", str(out), *TINY]) == 0
    assert cli_main(["seq2seq", "eval", "--checkpoint", str(out), "--data", str(pairs)]) == 0
    out = capsys.readouterr().out
    assert "/40)" in out  # every line of the file was scored


def test_missing_checkpoint_and_bad_flags(cli_main, tmp_path, capsys):
    assert cli_main(["seq2seq", "translate", "--checkpoint", str(tmp_path),
                     "--source", "x"]) == 2
    assert "no seq2seq checkpoint" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli_main(["seq2seq", "train", "--out", str(tmp_path), "--time-budget", "ten minutes"])
    assert e.value.code == 2
    assert "invalid duration" in capsys.readouterr().err
    assert cli_main(["seq2seq", "train", "--out", str(tmp_path), "--arch", "transformer",
                     "--d-model", "10", "--heads", "3", *TINY]) == 2
    assert "not divisible" in capsys.readouterr().err


def test_memory_quick_writes_csv_and_png(cli_main, tmp_path):
    assert cli_main(["experiment", "memory", "--quick", "--out", str(tmp_path),
                     "--max-len", "8"]) == 0
    rows = list(csv.reader((tmp_path / "memory.csv").open()))
    assert rows[0] == ["length", "rnn", "lstm"]
    assert [int(r[0]) for r in rows[1:]] == list(range(4, 9))
    assert all(0.0 <= float(x) <= 1.0 for r in rows[1:] for x in r[1:])
    assert (tmp_path / "memory.png").read_bytes()[:4] == b"\x89PNG"


def test_count_learns_to_count(cli_main, tmp_path, capsys):
    assert cli_main(["experiment", "count", "--out", str(tmp_path), "--steps", "150",
                     "--modulus", "10", "--prompt", "7 8"]) == 0
    res = json.loads((tmp_path / "count.json").read_text())
    assert res["next_number_accuracy"] > 0.9
    assert res["generated"][:4] == [9, 0, 1, 2]
    assert cli_main(["experiment", "count", "--out", str(tmp_path), "--prompt", "a b"]) == 2
