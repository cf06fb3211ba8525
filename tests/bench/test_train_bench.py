import json

from scratchgpt.bench.breakdown import ORDER, kind_of
from scratchgpt.cli import main

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
