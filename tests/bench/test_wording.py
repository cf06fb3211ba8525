"""The benchmarks' reports count threads and runs in words: "1 thread", "over 1 run"."""

from __future__ import annotations

import argparse

import pytest

from scratchgpt.cli import main
from tests.bench.test_bench_flags import RECURRENT, speculative_header


@pytest.fixture
def one_thread(monkeypatch):
    """torch says it runs on one thread (whatever this machine has)."""
    import torch

    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)


def test_a_one_core_machine_is_named_in_the_singular(monkeypatch):
    from scratchgpt import cpu
    from scratchgpt.bench import bench_threads_positive

    monkeypatch.setattr(cpu, "cores", lambda: 1)
    with pytest.raises(argparse.ArgumentTypeError, match=r"expected 1 to 1 thread \(this "):
        bench_threads_positive("2")


def test_sample_reports_one_thread_and_one_run(capsys):
    from scratchgpt.bench.sample import _print_report

    _print_report({"model": "cpu-small", "params": 1000, "dtype": "fp32", "threads": 1,
                   "decode_step": "plain", "tokens": 3,
                   "results": [{"variant": "eager", "runs": 1, "median_s": 0.5, "min_s": 0.5,
                                "max_s": 0.5, "tokens_per_s": 6.0}]}, compiled=False)
    header, line = capsys.readouterr().out.splitlines()
    assert "fp32, 1 thread; decode step" in header
    assert " s over 1 run (min " in line


def test_speculative_reports_one_run_per_k(capsys):
    header = speculative_header(capsys, 2)
    assert "8 tokens x 1 run per K and method;" in header and "; 2 threads;" in header


def test_decode_step_and_generate_report_one_thread():
    from scratchgpt.bench import decode_step, generate

    step = decode_step.format_report({"model": "m", "dtype": "fp32", "threads": 1,
                                      "clock": "wall", "context": 4,
                                      "read_bandwidth_gb_s": 10.0, "calls": []})
    assert "fp32, 1 thread, clock: wall" in step.splitlines()[0]
    gen = generate.format_report({"shape": "1L", "prompt_len": 4, "new_tokens": 2,
                                  "threads": 1, "weights": "random", "decode_step": {},
                                  "read_bandwidth_gb_s": 10.0, "variants": {},
                                  "bf16_hardware": True})
    assert "batch 1, 1 thread, weights random" in gen.splitlines()[0]


def test_train_reports_its_matmul_peak_on_one_thread(capsys):
    from scratchgpt.bench.train import _print_report

    args = argparse.Namespace(nanogpt=False, n_layer=1, n_head=2, n_embd=16, block_size=8,
                              batch_size=2, bias=False)
    _print_report(args, {"results": [], "threads": 1, "attention": "sdpa",
                         "block_products": "fp32"}, {"fp32": 1e12})
    assert capsys.readouterr().out.startswith("matmul peak (2048^3, 1 thread): fp32 1.000")


def test_recurrent_names_one_thread(one_thread, capsys):
    assert main(RECURRENT) == 0
    assert "; 1 thread, torch " in capsys.readouterr().out.splitlines()[0]


def test_seq2seq_names_one_torch_thread(one_thread, capsys, monkeypatch):
    from scratchgpt.training.trainer import Trainer

    def stop(*args, **kwargs):  # (the header is printed; no model need train)
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "__init__", stop)
    assert main(["bench", "seq2seq", "--task", "reverse", "--n-train", "50", "--n-test", "10",
          "--archs", "lstm", "--budget", "1s", "--no-progress"]) == 130
    assert ", 1 torch thread, torch " in capsys.readouterr().out.splitlines()[0]


def test_finetune_names_one_torch_thread(one_thread, tmp_path, capsys, monkeypatch):
    from scratchgpt.training import job

    def stop(*args, **kwargs):  # (the header is printed; nothing need pretrain)
        raise KeyboardInterrupt

    monkeypatch.setattr(job, "train", stop)
    assert main(["bench", "finetune", "--suite", "synthetic", "--out", str(tmp_path / "b"),
          "--pretrain-budget", "1s"]) == 130
    assert ", 1 torch thread; " in capsys.readouterr().out.splitlines()[0]
