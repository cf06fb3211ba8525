import argparse
import json
import os

import pytest
import torch

from scratchgpt.bench.breakdown import ORDER, kind_of
from scratchgpt.bench.train import add_arguments, serial_line, serial_parts, variant_step
from scratchgpt.cli import main
from scratchgpt.models import (
    attention_kernel,
    block_kernel,
    block_ops,
    c_kernels,
    fused_block,
    tile_matmul,
)

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
    assert main(["bench", "train", *SHAPE, "--variants", "fp32, fp32"]) == 2
    assert "names a variant twice" in capsys.readouterr().err


FAKE_NANOGPT = """import sys
open("argv.txt", "w").write(" ".join(sys.argv[1:]))
if "--n_layer=1" not in sys.argv:
    sys.exit("FileNotFoundError: data/shakespeare_char/train.bin")
for i in range(20):
    print(f"iter {i}: loss 4.0, time 10.0ms")
"""


def test_nanogpt_runs_the_shape_ours_runs(tmp_path, capsys):
    """nanoGPT ran its recipe's 4-layer, batch-12 shape whatever the flags said, so 'vs ref'
    compared two different models; a train.py that fails is one line, not a traceback."""
    (tmp_path / "train.py").write_text(FAKE_NANOGPT)
    assert main(["bench", "train", *SHAPE, "--variants", "fp32", "--nanogpt", str(tmp_path),
                 "--json"]) == 0
    ref = json.loads(capsys.readouterr().out)["results"][0]
    argv = (tmp_path / "argv.txt").read_text().split()
    for flag in ("--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=8",
                 "--batch_size=2", "--bias=False", "--dropout=0.0"):
        assert flag in argv, argv
    assert ref["tokens_per_s"] == pytest.approx(2 * 8 / 0.010)  # batch x context / 10 ms
    assert main(["bench", "train", *SHAPE, "--n-layer", "2", "--variants", "fp32",
                 "--nanogpt", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "train.bin" in err and err.count("\n") == 1, err



@pytest.mark.parametrize("flag", [["--activation", "relu"], ["--vocab-size", "300"],
                                  ["--attn-dropout", "0.1"]])
def test_nanogpt_is_not_run_at_a_model_it_cannot_train(tmp_path, capsys, flag):
    """nanoGPT has the exact GELU, one dropout and 65 characters: beside another model of
    ours, 'vs ref' would compare two models."""
    (tmp_path / "train.py").write_text(FAKE_NANOGPT)
    assert main(["bench", "train", *SHAPE, *flag, "--variants", "fp32", "--nanogpt",
                 str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert flag[0] in err and err.count("\n") == 1, err
    assert not (tmp_path / "argv.txt").exists()


@pytest.mark.parametrize("flag", [["--rounds", "0"], ["--steps", "0"], ["--warmup", "-1"]])
def test_bench_train_rejects_counts_it_cannot_take(flag, capsys):
    """At least one round and one timed step; no negative warm-up."""
    assert main(["bench", "train", *SHAPE, "--variants", "fp32", *flag]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and flag[0] in err and "Traceback" not in err


def test_bench_train_refuses_more_rounds_than_steps(capsys):
    """--rounds past --steps was lowered to --steps in silence: the variants took fewer turns
    than asked. Without --rounds, its default 5 is lowered to 3 steps' 3 turns, as documented."""
    from tests.cli_errors import error_of

    line = error_of(capsys, ["bench", "train", *SHAPE, "--variants", "fp32", "--rounds", "4"])
    assert "--rounds must be in [1, 3] (at most --steps: a step at least per turn), got 4" \
        in line
    from scratchgpt.bench.train import turns

    assert turns(None, 3) == 3 and turns(None, 200) == 5 and turns(3, 3) == 3


@pytest.mark.skipif(attention_kernel.load() is None, reason="fused blocks need the kernel")
def test_the_modules_variant_is_the_same_step_without_the_fused_block(monkeypatch):
    """bf16-modules and bf16-torchops (the fused block on PyTorch's operators, which it
    matches exactly) train to the same losses bit for bit; only the latter runs fused blocks,
    and each switch is back as it was after each step."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(SHAPE)
    calls = []
    real = fused_block._Block.forward
    monkeypatch.setattr(fused_block._Block, "forward",
                        staticmethod(lambda *a: calls.append(1) or real(*a)))
    monkeypatch.delenv(fused_block.SWITCH, raising=False)
    monkeypatch.delenv(block_ops.SWITCH, raising=False)
    modules, _ = variant_step(args, "bf16-modules")
    modules_losses = [modules() for _ in range(3)]
    assert not calls and fused_block.SWITCH not in os.environ
    fused, _ = variant_step(args, "bf16-torchops")
    assert [fused() for _ in range(3)] == modules_losses and len(calls) == 3
    assert block_ops.SWITCH not in os.environ
    assert all(torch.isfinite(loss) for loss in modules_losses)


@pytest.mark.skipif(tile_matmul.kind() != "tiles",
                    reason="PyTorch's products' bits are reproduced on AMX tiles")
def test_the_torchmm_and_calls_variants_are_the_same_step(monkeypatch):
    """bf16 (its blocks in one C call each way, products on AMX tiles), bf16-calls (the same
    kernels called one by one), bf16-torchmm (on PyTorch's products) and bf16-static (each
    kernel's threads kept to their own rows) train to the same losses bit for bit, at a shape
    the tiles take (32 rows of 64 features); each runs the path it names, and the switches are
    back as they were after each step."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([*SHAPE, "--n-embd", "64", "--block-size", "16", "--batch-size",
                              "2"])
    products, one_calls = [], []
    real, real_block = tile_matmul._product, block_kernel.forward
    monkeypatch.setattr(tile_matmul, "_product", lambda *a: products.append(1) or real(*a))
    monkeypatch.setattr(block_kernel, "forward", lambda *a: one_calls.append(
        os.environ.get(c_kernels.SHARES_SWITCH, "shared")) or real_block(*a))
    for switch in (tile_matmul.SWITCH, block_kernel.SWITCH, c_kernels.SHARES_SWITCH):
        monkeypatch.delenv(switch, raising=False)
    torchmm, _ = variant_step(args, "bf16-torchmm")
    losses = [torchmm() for _ in range(3)]
    assert not products and not one_calls and tile_matmul.SWITCH not in os.environ
    calls, _ = variant_step(args, "bf16-calls")
    assert [calls() for _ in range(3)] == losses and products and not one_calls
    assert block_kernel.SWITCH not in os.environ
    tiles, _ = variant_step(args, "bf16")
    products.clear()
    assert [tiles() for _ in range(3)] == losses and not products
    assert set(one_calls) == {"shared"}
    static, _ = variant_step(args, "bf16-static")
    one_calls.clear()
    assert [static() for _ in range(3)] == losses and set(one_calls) == {"static"}
    assert c_kernels.SHARES_SWITCH not in os.environ


def test_bench_train_breakdown_accounts_for_the_profiled_step(capsys):
    assert main(["bench", "train", *SHAPE, "--variants", "fp32", "--breakdown", "--json"]) == 0
    parts = json.loads(capsys.readouterr().out)["results"][0]["breakdown_ms"]
    assert set(parts) == {*ORDER, "total"}
    assert parts["products"] > 0 and parts["activation"] > 0 and parts["autograd"] > 0
    assert min(parts.values()) >= 0
    assert abs(sum(parts[k] for k in ORDER) - parts["total"]) < 1e-9


def test_breakdown_kinds_go_by_exact_aten_names_and_words():
    assert kind_of("aten::mm") == kind_of("aten::addmm") == "products"
    assert kind_of("tile_matmul.weight_grad") == kind_of("tile_matmul.linear") == "products"
    assert kind_of("tile_matmul.pack") == "casts"
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


def test_the_one_thread_variant_runs_on_one_thread_and_puts_the_count_back(monkeypatch):
    """-1thread trains on one thread, and the process's thread count is as it was after each
    step; the losses are those of the same step on every thread, up to the order of sums."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(SHAPE)
    before = torch.get_num_threads()
    seen = []
    real = torch.nn.functional.cross_entropy
    monkeypatch.setattr(torch.nn.functional, "cross_entropy",
                        lambda *a, **k: seen.append(torch.get_num_threads()) or real(*a, **k))
    one, _ = variant_step(args, "fp32-1thread")
    one_losses = [one() for _ in range(3)]
    assert seen == [1, 1, 1] and torch.get_num_threads() == before
    every, _ = variant_step(args, "fp32")
    # the same arithmetic; a library may split a sum differently between threads
    assert torch.allclose(torch.stack([every() for _ in range(3)]), torch.stack(one_losses),
                          rtol=1e-5, atol=0)


def test_serial_parts_follow_amdahls_law():
    """S + P / N is the time on N threads and S + P the time on one; variants without their
    one-thread twin, or on a one-thread machine, get none."""
    results = [{"variant": "bf16", "ms_per_step": 20.0},
               {"variant": "bf16-1thread", "ms_per_step": 32.0},
               {"variant": "fp32-muon", "ms_per_step": 50.0},
               {"variant": "fp32-1thread-muon", "ms_per_step": 90.0},
               {"variant": "bf16-modules", "ms_per_step": 21.0}]
    for threads in (2, 4):
        parts = serial_parts(results, threads)
        assert set(parts) == {"bf16", "fp32-muon"}
        for name, one in (("bf16", 32.0), ("fp32-muon", 90.0)):
            every = next(r["ms_per_step"] for r in results if r["variant"] == name)
            s = parts[name]["serial_ms"]
            p = one - s
            assert s + p / threads == pytest.approx(every) and parts[name]["of_step"] * every \
                == pytest.approx(s)
    assert serial_parts(results, 1) == {}
    assert all("by_kind_ms" not in part for part in serial_parts(results, 2).values())
    # with breakdowns on both sides, the serial part of each kind too
    results[0]["breakdown_ms"] = {"products": 12.0, "outside ops": 3.0, "total": 15.0}
    results[1]["breakdown_ms"] = {"products": 22.0, "outside ops": 3.0, "total": 25.0}
    kinds = serial_parts(results, 2)["bf16"]["by_kind_ms"]
    assert set(kinds) == set(results[0]["breakdown_ms"])
    for kind, s in kinds.items():
        one, every = results[1]["breakdown_ms"][kind], results[0]["breakdown_ms"][kind]
        assert s + (one - s) / 2 == pytest.approx(every)
    assert kinds["outside ops"] == pytest.approx(3.0)  # no faster on two threads: all serial


def test_no_serial_part_is_given_where_amdahls_law_does_not_hold():
    """A step slower on N threads than on one (threads waiting on each other on a busy
    machine) gave a serial part longer than the step: '30.93 ms of its step on one core while
    the other threads wait (165%)'. So did one faster than N times, a negative part."""
    for every, one in ((18.73, 6.52), (2.0, 6.52)):
        results = [{"variant": "fp32", "ms_per_step": every},
                   {"variant": "fp32-1thread", "ms_per_step": one}]
        part = serial_parts(results, 2)["fp32"]
        assert part["serial_ms"] is None and part["of_step"] is None
        line = serial_line("fp32", part, 2)
        assert line.startswith(f"fp32: no serial part by Amdahl's law: {every:.2f} ms/step on "
                               "2 threads is ") and "%" not in line
        assert ("slower than 6.52 on 1" in line) == (every > one)
    # at the law's two ends the part is the whole step, or nothing
    for every, share in ((6.52, 1.0), (3.26, 0.0)):
        results = [{"variant": "fp32", "ms_per_step": every},
                   {"variant": "fp32-1thread", "ms_per_step": 6.52}]
        part = serial_parts(results, 2)["fp32"]
        assert part["of_step"] == pytest.approx(share, abs=1e-12)
        assert serial_line("fp32", part, 2).endswith(f"({share:.0%}; Amdahl's law from 1 and "
                                                     "2 threads)")


def test_bench_train_reports_the_serial_part_beside_a_one_thread_variant(capsys):
    assert main(["bench", "train", *SHAPE, "--variants", "fp32,fp32-1thread"]) == 0
    out = capsys.readouterr().out
    if torch.get_num_threads() > 1:  # (a part, or why there is none: timings of the moment)
        assert "fp32: " in out and "Amdahl's law" in out
    else:
        assert "Amdahl" not in out


def test_train_bench_docstring_example_runs():
    import doctest

    from scratchgpt.bench import train

    assert doctest.testmod(train, raise_on_error=True).attempted > 0


def test_the_fused_blocks_c_calls_are_counted_by_what_they_do():
    assert kind_of("block_ops.layer_norm") == kind_of("block_ops.layer_norm_backward")
    assert kind_of("block_ops.layer_norm") == "normalization"
    assert kind_of("block_ops.activate") == kind_of("block_ops.activation_backward")
    assert kind_of("block_ops.activate") == "activation"
    assert kind_of("block_ops.to_bf16") == kind_of("block_ops.to_fp32") == "casts"
    assert kind_of("block_ops.residual") == "other ops"


def test_bench_train_json_has_the_of_peak_column_it_prints(tmp_path, capsys):
    """The table's "of peak" was not in --json: each result's FLOP/s over its precision's
    matmul peak, one thread's share of that peak for a -1thread variant."""
    out = tmp_path / "t.json"
    assert main(["bench", "train", *SHAPE, "--variants", "fp32,fp32-1thread", "--json",
                 str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    peak = report["matmul_peak_tflops"]["fp32"]
    for r in report["results"]:
        n = report["threads"] if r["variant"].endswith("-1thread") else 1
        # the peak in the report is rounded to 0.001 TFLOP/s
        low, high = (r["tflops"] * n / (peak + 5e-4), r["tflops"] * n / max(peak - 5e-4, 1e-9))
        assert low * (1 - 1e-9) <= r["of_peak"] <= high * (1 + 1e-9)
        [row] = [line.split() for line in printed.splitlines()
                 if line.split()[:1] == [r["variant"]]]
        assert row[4] == f"{r['of_peak']:.1%}"
