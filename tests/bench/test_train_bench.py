import json

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
