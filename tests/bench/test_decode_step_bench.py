"""bench decode-step on a tiny shape: the recorded kernels are the call's, the weight bytes are
the model's, and the report covers every variant and token count asked for."""

import json

import torch

from scratchgpt.bench.decode_step import forward_call, model_tensors, record, replay
from scratchgpt.cli import main
from scratchgpt.models.fast_decode import PackedLinear, optimize_for_decode, packing_available
from scratchgpt.models.gpt import GPT, GPTConfig

SHAPE = ["--n-layer", "2", "--n-head", "2", "--n-embd", "32", "--vocab-size", "50",
         "--block-size", "32", "--context", "8", "--repeats", "3", "--threads", "1"]


def _linear_bytes(model: GPT) -> int:
    return sum(m.weight.nbytes + (m.bias.nbytes if m.bias is not None else 0)
               for m in model.modules() if isinstance(m, torch.nn.Linear))


def test_replayed_kernels_compute_the_call():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, block_size=32, n_layer=2, n_head=2, n_embd=32)).eval()
    with torch.inference_mode():
        call = forward_call(model, 8, 3)
        kernels = record(call, model_tensors(model))
        call()
        expected = call.cache.k[..., 8:11, :].clone()  # the keys of the call's 3 tokens
        call.cache.k[..., 8:11, :] = 0
        replay(kernels, lambda: 0)  # the recorded kernels, cache writes included, run again
    assert expected.abs().sum() > 0 and torch.equal(call.cache.k[..., 8:11, :], expected)
    # every Linear weight and bias is read once by the products (lm_head = the tied wte)
    assert sum(k.weight_bytes for k in kernels if k.kind == "matmul") == _linear_bytes(model)


def test_packed_weights_are_counted():
    if not packing_available(torch.float32):
        return
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, block_size=32, n_layer=1, n_head=2, n_embd=32)).eval()
    plain_bytes = _linear_bytes(model)
    optimize_for_decode(model, pack=0)
    assert isinstance(model.lm_head, PackedLinear)
    with torch.inference_mode():
        kernels = record(forward_call(model, 4, 1), model_tensors(model))
    assert sum(k.weight_bytes for k in kernels if k.kind == "matmul") >= plain_bytes


def test_bench_decode_step_reports_each_call(capsys):
    assert main(["bench", "decode-step", *SHAPE, "--tokens", "1,3", "--variants",
                 "plain,layout", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert [(c["variant"], c["tokens"]) for c in r["calls"]] == [
        ("plain", 1), ("plain", 3), ("layout", 1), ("layout", 3)]
    for c in r["calls"]:
        assert c["call_ms"] > 0 and c["kernels_ms"] > 0 and c["n_kernels"] > 10
        assert "matmul" in c["kinds"]
    assert set(r["sampling_ms"]) == {"greedy", "temperature 0.8, top-p 0.95"}


def test_bench_decode_step_rejects_unknown_variant(capsys):
    assert main(["bench", "decode-step", *SHAPE, "--variants", "fastest"]) == 2
    assert "--variants" in capsys.readouterr().err


def test_a_context_the_model_has_no_room_for_is_refused(capsys):
    """--context past the room the model's positions leave beside --tokens was lowered in
    silence to that room, and the report timed a context nobody asked for."""
    from tests.cli_errors import error_of

    shape = [a for a in SHAPE if a not in ("--context", "8")]  # block size 32
    line = error_of(capsys, ["bench", "decode-step", *shape, "--tokens", "1,3",
                             "--context", "30"])
    assert "--context must be in [1, 29] (the model's 32 positions less --tokens 3), got 30" \
        in line
    assert main(["bench", "decode-step", *shape, "--tokens", "1,3", "--context", "29",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["context"] == 29
    # without --context: 64 cached tokens where they fit, else the room, named in the report
    assert main(["bench", "decode-step", *shape, "--tokens", "3", "--variants", "plain"]) == 0
    assert "29 tokens cached" in capsys.readouterr().out


def test_decode_step_docstring_examples_run():
    import doctest

    from scratchgpt.bench import decode_step

    assert doctest.testmod(decode_step, raise_on_error=True).attempted > 0
