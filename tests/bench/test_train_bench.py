import argparse
import json
import os

import pytest
import torch

from scratchgpt.bench.breakdown import ORDER, kind_of
from scratchgpt.bench.train import add_arguments, variant_step
from scratchgpt.cli import main
from scratchgpt.models import attention_kernel, fused_block

SHAPE = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "8",
         "--batch-size", "2", "--steps", "3", "--warmup", "1"]


def test_bench_train_reports_each_variant(capsys):
    assert main(["bench", "train", *SHAPE, "--variants", "fp32,fp32-muon", "--dropout", "0.1",
                 "--attn-dropout", "0", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["variant"] for r in report["results"]] == ["fp32", "fp32-muon"]
    assert all(r["tokens_per_s"] > 0 and r["tflops"] > 0 for r in report["results"])
    assert report["matmul_peak_tflops"]["fp32"] > 0


def test_bench_train_rejects_an_unknown_variant(capsys):
    assert main(["bench", "train", *SHAPE, "--variants", "fp16"]) == 2
    err = capsys.readouterr().err
    assert "unknown variant 'fp16'" in err and "Traceback" not in err


@pytest.mark.parametrize("flag", [["--rounds", "0"], ["--steps", "0"], ["--warmup", "-1"]])
def test_bench_train_rejects_counts_it_cannot_take(flag, capsys):
    """At least one round and one timed step; no negative warm-up."""
    assert main(["bench", "train", *SHAPE, "--variants", "fp32", *flag]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and flag[0] in err and "Traceback" not in err


@pytest.mark.skipif(attention_kernel.load() is None, reason="fused blocks need the kernel")
def test_the_modules_variant_is_the_same_step_without_the_fused_block(monkeypatch):
    """bf16 and bf16-modules train to the same losses bit for bit; only bf16 runs fused
    blocks, and the switch is back as it was after each modules step."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(SHAPE)
    calls = []
    real = fused_block._Block.forward
    monkeypatch.setattr(fused_block._Block, "forward",
                        staticmethod(lambda *a: calls.append(1) or real(*a)))
    monkeypatch.delenv(fused_block.SWITCH, raising=False)
    modules, _ = variant_step(args, "bf16-modules")
    modules_losses = [modules() for _ in range(3)]
    assert not calls and fused_block.SWITCH not in os.environ
    fused, _ = variant_step(args, "bf16")
    assert [fused() for _ in range(3)] == modules_losses and len(calls) == 3
    assert all(torch.isfinite(loss) for loss in modules_losses)


def test_bench_train_breakdown_accounts_for_the_profiled_step(capsys):
    assert main(["bench", "train", *SHAPE, "--variants", "fp32", "--breakdown", "--json"]) == 0
    parts = json.loads(capsys.readouterr().out)["results"][0]["breakdown_ms"]
    assert set(parts) == {*ORDER, "total"}
    assert parts["products"] > 0 and parts["activation"] > 0 and parts["autograd"] > 0
    assert min(parts.values()) >= 0
    assert abs(sum(parts[k] for k in ORDER) - parts["total"]) < 1e-9


def test_breakdown_kinds_go_by_exact_aten_names_and_words():
    assert kind_of("aten::mm") == kind_of("aten::addmm") == "products"
    assert kind_of("aten::to") == kind_of("aten::_to_copy") == "casts"
    assert kind_of("aten::topk") == "other ops"  # not a cast for starting like one
    assert kind_of("aten::_scaled_dot_product_flash_attention_for_cpu_backward") == "attention"
    assert kind_of("attention_kernel.backward") == kind_of("_AttentionQKV") == "attention"
    assert kind_of("AddmmBackward0") == kind_of("autograd::engine::evaluate_function: X") \
        == "autograd"
    assert kind_of("aten::gelu_backward") == "activation"
    assert kind_of("aten::_fused_adamw_") == kind_of("aten::linalg_vector_norm") \
        == "clip + optimizer"


def test_breakdown_docstring_example_runs():
    import doctest

    from scratchgpt.bench import breakdown

    result = doctest.testmod(breakdown)
    assert result.attempted > 0 and result.failed == 0
