"""`scratchgpt bench seq2seq` runs end to end with a tiny budget and writes its figures."""

import json


def test_bench_seq2seq_tiny(cli_main, tmp_path, capsys):
    out = tmp_path / "b.json"
    rc = cli_main(["bench", "seq2seq", "--budget", "1s", "--archs", "lstm", "transformer",
                   "--n-train", "200", "--n-test", "20", "--no-progress", "--json", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    assert [r["arch"] for r in res["results"]] == ["lstm", "transformer"]
    for r in res["results"]:
        assert r["steps"] >= 1 and r["held_out"] == 20 and 0 <= r["exact_match"] <= 1
        assert r["train_seconds"] < 10
    assert "exact match" in capsys.readouterr().out
