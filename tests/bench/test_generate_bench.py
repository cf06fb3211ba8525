"""bench generate on a tiny shape: every dtype, transformers and llama.cpp beside ours;
bench sample at toy size."""

import json

import pytest

from scratchgpt.cli import main
from tests.requires import optional

SHAPE = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--vocab-size", "300",
         "--block-size", "64", "--prompt-len", "8", "--new-tokens", "6", "--repeats", "1",
         "--threads", "1", "--recompute-tokens", "0", "--batch", "0", "--no-hf"]


def test_bench_generate_reports_every_dtype(capsys):
    assert main(["bench", "generate", *SHAPE, "--dtypes", "fp32,bf16,int8", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert list(r["variants"]) == ["fp32", "bf16", "int8"]
    for v in r["variants"].values():
        ours = v["ours"]
        assert ours["decode_tok_s_median"] > 0 and ours["prefill_tok_s_median"] > 0
        assert ours["ceiling_tok_s"] > 0
    bytes_ = {name: v["bytes_per_token"]["ours"] for name, v in r["variants"].items()}
    assert bytes_["int8"] < bytes_["bf16"] < bytes_["fp32"]  # int8: 1 byte + scales
    assert set(r["accuracy_vs_fp32"]) == {"bf16", "int8"}
    assert r["int8_kernel"]["shape"] == [300, 32] and r["int8_kernel"]["int8_kernel_ms"] > 0


def test_bench_generate_against_llama_cpp(capsys):
    optional("llama_cpp")
    optional("gguf")
    assert main(["bench", "generate", *SHAPE, "--llama-cpp"]) == 0
    out = capsys.readouterr().out
    for name, gguf_type in (("fp32", "f32"), ("bf16", "f16"), ("int8", "q8_0")):
        ours = next(line for line in out.splitlines() if line.startswith(f"{name} ")
                    and " ours " in line)
        theirs = next(line for line in out.splitlines() if line.startswith(f"{name} ")
                      and f"llama.cpp {gguf_type}" in line)
        assert float(ours.split()[2]) > 0 and float(theirs.split()[3]) > 0  # decode tok/s
    assert "read bandwidth" in out


def test_bench_generate_rejects_an_unknown_dtype(capsys):
    assert main(["bench", "generate", *SHAPE, "--dtypes", "fp16"]) == 2
    err = capsys.readouterr().err
    assert "fp16" in err and "Traceback" not in err


def test_bench_generate_tiny_gpt_matches_transformers(capsys):
    pytest.importorskip("transformers")
    assert main(["bench", "generate", "--n-layer", "1", "--n-head", "2", "--n-embd", "32",
                 "--vocab-size", "60", "--block-size", "64", "--prompt-len", "8",
                 "--new-tokens", "10", "--repeats", "1", "--dtypes", "fp32",
                 "--batch", "3", "--threads", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    fp32 = report["variants"]["fp32"]
    assert fp32["transformers"]["greedy_first_divergence"] is None  # the same greedy tokens
    assert fp32["ours"]["decode_tok_s_median"] > 0 and report["batched"]["tok_s"] > 0
    # --recompute-tokens not given: its 512, cut to what the context leaves after the prompt
    assert report["cache_vs_recompute"]["new_tokens"] == 64 - 8


def test_bench_sample_runs(capsys):
    assert main(["bench", "sample", "--tokens", "8", "--repeats", "1"]) == 0
    assert "8 tokens: median" in capsys.readouterr().out
