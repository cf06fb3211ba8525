"""``bench generate`` and ``bench sample`` run end to end at toy sizes."""

from __future__ import annotations

import json

import pytest

from scratchgpt.cli import main


def test_bench_generate_tiny_gpt_matches_transformers(capsys):
    pytest.importorskip("transformers")
    assert main(["bench", "generate", "--n-layer", "1", "--n-head", "2", "--n-embd", "32",
                 "--vocab-size", "60", "--block-size", "64", "--prompt-len", "8",
                 "--new-tokens", "10", "--repeats", "1", "--dtypes", "fp32",
                 "--recompute-tokens", "12", "--batch", "3", "--threads", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    fp32 = report["variants"]["fp32"]
    assert fp32["same_greedy_tokens_as_transformers"] is True
    assert fp32["ours"]["decode_tok_s_median"] > 0 and report["batched"]["tok_s"] > 0
    assert report["cache_vs_recompute"]["new_tokens"] == 12


def test_bench_sample_runs(capsys):
    assert main(["bench", "sample", "--tokens", "8", "--repeats", "1"]) == 0
    assert "8 tokens: median" in capsys.readouterr().out
