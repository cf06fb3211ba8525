"""`scratchgpt bench seq2seq` runs end to end with a tiny budget and writes its figures."""

import json
import re


def test_bench_seq2seq_tiny(cli_main, tmp_path, capsys, monkeypatch):
    from scratchgpt.data.translation import DataSpec

    made = []  # the pairs were made for the memory check, then again for each model
    real = DataSpec.load
    monkeypatch.setattr(DataSpec, "load", lambda self: made.append(self) or real(self))
    out = tmp_path / "b.json"
    rc = cli_main(["bench", "seq2seq", "--budget", "1s", "--archs", "lstm", "transformer",
                   "--n-train", "200", "--n-test", "20", "--no-progress", "--json", str(out)])
    assert rc == 0 and len(made) == 1
    res = json.loads(out.read_text())
    assert [r["arch"] for r in res["results"]] == ["lstm", "transformer"]
    for r in res["results"]:
        assert r["steps"] >= 1 and r["held_out"] == 20 and 0 <= r["exact_match"] <= 1
        assert r["train_seconds"] < 10
    printed = capsys.readouterr().out
    assert "exact match" in printed
    for r in res["results"]:  # source-length buckets as keys: "1-5", no table padding
        assert r["by_length"] and all(k == k.strip() for k in r["by_length"])
    # each bucket's "(correct/pairs)" printed is in the figures: pairs, and their fraction
    shown = re.findall(r"^ *(\d+-\d+) +[\d.]+%  \((\d+)/(\d+)\)$", printed, re.M)
    assert len(shown) == sum(len(r["by_length"]) for r in res["results"])
    from_json = [(k, round(f * n), n) for r in res["results"]
                 for k, f, n in zip(r["by_length"], r["by_length"].values(),
                                    r["by_length_pairs"].values(), strict=True)]
    assert [(k, int(c), int(n)) for k, c, n in shown] == from_json
    assert all(sum(r["by_length_pairs"].values()) == r["held_out"] for r in res["results"])


def test_bench_seq2seq_names_the_machine_without_a_stray_comma(cli_main, capsys, monkeypatch):
    """Where platform.processor() is empty (Linux, often) the first line read 'machine:
    x86_64 , 1 torch thread(s)'."""
    import platform

    monkeypatch.setattr(platform, "processor", lambda: "")
    assert cli_main(["bench", "seq2seq", "--budget", "1s", "--archs", "lstm", "--n-train", "50",
                     "--n-test", "5", "--no-progress"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"machine: {platform.machine()}, ")


def test_bench_seq2seq_stopped_by_ctrl_c_writes_nothing(cli_main, tmp_path, capsys,
                                                         monkeypatch):
    import signal

    from scratchgpt.training.seq2seq import Seq2SeqTask

    real = Seq2SeqTask.train_batch

    def interrupted(self, *args, **kwargs):  # Ctrl-C during the second model's training
        if self.spec.n_train == 200 and getattr(self, "_seen", 0) == 1:
            signal.raise_signal(signal.SIGINT)
        self._seen = getattr(self, "_seen", 0) + 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Seq2SeqTask, "train_batch", interrupted)
    out = tmp_path / "b.json"
    rc = cli_main(["bench", "seq2seq", "--budget", "1s", "--archs", "lstm", "--n-train", "200",
                   "--n-test", "20", "--no-progress", "--json", str(out)])
    assert rc == 130 and not out.exists()
    assert capsys.readouterr().err.endswith("scratchgpt bench seq2seq: interrupted\n")
