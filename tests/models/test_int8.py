"""int8 weight-only decode: the kernel computes the quantized product, quantization error stays
within its bound, and a trained model keeps its greedy output and its val loss."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from scratchgpt.checkpoints import load_model
from scratchgpt.generation.generate import generate
from scratchgpt.generation.sampling import SamplingConfig
from scratchgpt.models import int8_kernel
from scratchgpt.models.fast_decode import (
    Int8Linear,
    int8_available,
    prepare_for_decode,
    quantize_int8,
    quantize_rows_int8,
    torch_int8_available,
)
from scratchgpt.models.gpt import GPT, GPTConfig

pytestmark = pytest.mark.skipif(not int8_available(), reason="no int8 product here: neither "
                                "scratchgpt's kernel nor aten._weight_int8pack_mm")

GREEDY = SamplingConfig(temperature=0)


@pytest.fixture(params=["ours", "torch"])
def backend(request, monkeypatch):
    """Each int8 product: scratchgpt's AVX-512 kernel (where this CPU and a C compiler allow)
    and PyTorch's ``_weight_int8pack_mm``."""
    if request.param == "torch":
        monkeypatch.setenv("SCRATCHGPT_INT8_KERNEL", "torch")
    int8_kernel.load.cache_clear()
    if request.param == "ours" and int8_kernel.load() is None:
        pytest.skip("scratchgpt's int8 kernel needs AVX-512 and a C compiler")
    if request.param == "torch" and not torch_int8_available():
        pytest.skip("this PyTorch has no aten._weight_int8pack_mm")
    yield request.param
    int8_kernel.load.cache_clear()  # (monkeypatch restores the environment after this)


@pytest.mark.parametrize("k", [64, 36, 65])  # 36, 65: padded to the kernels' multiple of 16
def test_int8_linear_computes_the_quantized_product(k, backend):
    torch.manual_seed(0)
    linear = nn.Linear(k, 42)  # 42 output rows: blocks of 4 and a tail of 2
    q = Int8Linear(linear)
    assert q.weight.dtype == torch.int8 and q.dequantized().shape == (42, k)
    x = torch.randn(3, 5, k)
    y = q(x)
    assert y.shape == (3, 5, 42) and y.dtype == torch.float32
    if backend == "torch":
        # what its kernel is documented to compute: bf16 inputs times q * scale, fp32 sums,
        # rounded to bf16
        ref = x.bfloat16().float() @ q.dequantized().T  # (3, 5, 42)
        assert torch.allclose(y - linear.bias, ref, rtol=2**-8, atol=1e-5)  # 8-bit mantissa
    else:  # bf16 inputs, fp32 sums and outputs: only the order of the sums differs
        ref = x.bfloat16().double() @ q.dequantized().double().T + linear.bias.double()
        assert torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-5)


def test_our_kernel_needs_no_int8_kernel_from_pytorch(monkeypatch):
    """Where scratchgpt's kernel runs, int8 works with a PyTorch that lacks its own."""
    if int8_kernel.load() is None:
        pytest.skip("scratchgpt's int8 kernel needs AVX-512 and a C compiler")
    from scratchgpt.models import fast_decode

    monkeypatch.setattr(fast_decode, "torch_int8_available", lambda: False)
    assert fast_decode.int8_available()
    linear = nn.Linear(32, 8)
    x = torch.randn(2, 32)
    q = Int8Linear(linear)
    assert torch.allclose(q(x), x.bfloat16().float() @ q.dequantized().T + linear.bias, atol=1e-5)


def test_a_row_gets_the_same_bits_alone_in_a_batch_and_on_any_thread_count():
    """scratchgpt's kernel sums every output in one order whatever rows share the call, so a
    batch equals its rows alone, bit for bit (a cached step equals the uncached forward)."""
    if int8_kernel.load() is None:
        pytest.skip("scratchgpt's int8 kernel needs AVX-512 and a C compiler")
    torch.manual_seed(0)
    q = Int8Linear(nn.Linear(96, 45))
    x = torch.randn(11, 96)  # 11 rows: blocks of 4 and a tail of 3; from 8 rows on, the
    # kernel widens each block of weights once instead of at every step (the same sums)
    together = q(x)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.cat([q(x[i:i + 1]) for i in range(11)])
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(together, alone)


def test_the_kernel_falls_back_to_torch_when_it_cannot_be_built(monkeypatch):
    """No C compiler (or one that fails): int8 still works, on PyTorch's kernel."""
    monkeypatch.setenv("CC", "no-such-compiler")
    int8_kernel.load.cache_clear()
    try:
        assert int8_kernel.load() is None
        assert int8_kernel.describe().startswith("torch")
        q = Int8Linear(nn.Linear(32, 8))
        x = torch.randn(2, 32)
        ref = x.bfloat16().float() @ q.dequantized().T  # its bf16 product, then the bias
        assert torch.allclose(q(x) - q.bias, ref, rtol=2**-8, atol=1e-5)
    finally:
        int8_kernel.load.cache_clear()


def test_quantization_error_is_at_most_half_a_step():
    torch.manual_seed(0)
    w = torch.randn(50, 96) * torch.logspace(-3, 0, 50)[:, None]  # rows of very different scale
    w[7] = 0  # an all-zero row must not divide by zero
    q, scale = quantize_rows_int8(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.bfloat16
    assert int(q.abs().max()) <= 127
    deq = q.float() * scale.float()[:, None]
    # half a quantization step, plus the clamp where bf16 rounded the scale down (< 2^-8)
    bound = scale.float()[:, None] * (0.5 + 127 * 2**-8)
    assert bool(((deq - w).abs() <= bound).all())
    assert bool((deq[7] == 0).all())
    # so every row, small or large, keeps its relative precision: < 0.4% + 0.4% of its max
    rel = (deq - w).abs().amax(1) / w.abs().amax(1).clamp_min(1e-30)
    assert rel.max() < 1 / 254 + 2**-8


def test_quantize_replaces_every_linear_and_keeps_the_embedding():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=97, block_size=32, n_layer=2, n_head=2, n_embd=32)).eval()
    q = quantize_int8(copy.deepcopy(model))
    assert not any(isinstance(m, nn.Linear) for m in q.modules())
    assert sum(isinstance(m, Int8Linear) for m in q.modules()) == 2 * 4 + 1
    assert q.transformer.wte.weight.dtype == torch.float32  # the table stays exact
    assert q.new_cache(1).k.dtype == torch.float32  # activations and KV cache stay fp32
    int8_bytes = sum(m.weight.nbytes for m in q.modules() if isinstance(m, Int8Linear))
    fp32_bytes = sum(m.weight.nbytes for m in model.modules() if isinstance(m, nn.Linear))
    assert int8_bytes == fp32_bytes // 4  # 32 inputs: a multiple of 16, no padding


def test_int8_calls_an_int8_kernel(monkeypatch, backend):
    """The product runs in an int8-weight kernel, never a dequantized float matmul: the
    int8 weight itself is what the kernel receives."""
    calls = []
    if backend == "torch":
        kernel = torch.ops.aten._weight_int8pack_mm

        def spy(a, w, s):
            calls.append((a.dtype, w.dtype))
            return kernel(a, w, s)

        monkeypatch.setattr(torch.ops.aten, "_weight_int8pack_mm", spy)
        want = [(torch.bfloat16, torch.int8)]
    else:
        kernel = int8_kernel.int8_matmul

        def spy(x, w, scale, bias):
            calls.append((x.dtype, w.dtype))
            return kernel(x, w, scale, bias)

        monkeypatch.setattr(int8_kernel, "int8_matmul", spy)
        want = [(torch.float32, torch.int8)]
    monkeypatch.setattr(torch.nn.functional, "linear", None)  # no float product anywhere
    q = Int8Linear(nn.Linear(32, 8))
    q(torch.randn(2, 32))
    assert calls == want


# ---- a trained model


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """A small char GPT trained for a few seconds on generated text, so it predicts with
    confidence (a random model's logits are nearly flat, where any rounding flips the argmax)."""
    from scratchgpt.data.dataset import TokenDataset
    from scratchgpt.data.prepare import prepare_text
    from scratchgpt.models import model_config
    from scratchgpt.training.config import TrainConfig
    from scratchgpt.training.job import train
    from tests.golden.runs import corpus

    tmp = tmp_path_factory.mktemp("int8")
    prepare_text(corpus(), tmp / "data", "char", source="test")
    cfg = TrainConfig(batch_size=16, max_iters=150, eval_interval=150, eval_iters=2,
                      log_interval=50, learning_rate=1e-2, warmup_iters=10, dtype="fp32",
                      seed=1337)
    torch.manual_seed(0)
    data = TokenDataset(tmp / "data")
    config = model_config("gpt", vocab_size=data.vocab_size, n_layer=2, n_head=4, n_embd=64,
                          block_size=64, dropout=0.0)
    train(cfg, config, data, tmp / "run", progress=False)
    return tmp / "run"


def _prompt(run: Path) -> torch.Tensor:
    from scratchgpt.tokenizers import load_tokenizer

    return torch.tensor([load_tokenizer(run).encode("KING:\nThe king and")])


def test_trained_model_int8_logits_are_close_to_fp32(trained_run):
    fp32, _ = load_model(trained_run)
    int8 = prepare_for_decode(load_model(trained_run)[0], "int8")
    x = _prompt(trained_run)
    with torch.inference_mode():
        a, b = fp32(x), int8(x)
    # per-channel int8 (step = max|w| / 127) and bf16 product inputs/outputs (2^-8) both move a
    # logit by a fraction of a percent of the logits' range: 1% is the bound
    assert (a - b).abs().max() <= 0.01 * (a.max() - a.min())
    assert bool((a.argmax(-1) == b.argmax(-1)).all())


def test_trained_model_int8_greedy_output_matches_fp32(trained_run):
    fp32, _ = load_model(trained_run)
    int8 = prepare_for_decode(load_model(trained_run)[0], "int8")
    x = _prompt(trained_run)
    want = generate(fp32, x, 60, GREEDY)
    assert torch.equal(generate(int8, x, 60, GREEDY), want)


def test_eval_int8_val_loss_is_close_to_fp32(trained_run, capsys, cli_main):
    losses = {}
    for dtype in ("fp32", "int8"):
        assert cli_main(["eval", "--checkpoint", str(trained_run), "--dtype", dtype,
                         "--json"]) == 0
        figures = json.loads(capsys.readouterr().out)
        assert figures["dtype"] == dtype
        losses[dtype] = figures["val_loss"]
    assert abs(losses["int8"] - losses["fp32"]) <= 0.003  # nats: far below what training moves


def test_sample_int8_greedy_matches_fp32(trained_run, capsys, cli_main):
    texts = []
    for dtype in ("fp32", "int8"):
        assert cli_main(["sample", "--checkpoint", str(trained_run), "--prompt", "KING:\n",
                         "--temperature", "0", "--max-new-tokens", "40", "--dtype", dtype]) == 0
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1] and len(texts[0]) > 40


def test_int8_refuses_a_model_without_linear_layers(tmp_path, capsys):
    """A bigram model is one embedding table: int8 changed nothing, and eval reported the
    fp32 loss under int8's name."""
    from scratchgpt.checkpoints import Checkpoint, save_checkpoint
    from scratchgpt.cli import main
    from scratchgpt.errors import ConfigError
    from scratchgpt.models.bigram import BigramConfig, BigramLM
    from scratchgpt.models.fast_decode import to_inference_dtype

    model = BigramLM(BigramConfig(vocab_size=12))
    with pytest.raises(ConfigError, match="has none"):
        to_inference_dtype(model, "int8")
    save_checkpoint(tmp_path / "run" / "best.pt", Checkpoint("bigram", model.config,
                                                             model.state_dict()))
    assert main(["sample", "--checkpoint", str(tmp_path / "run"), "--dtype", "int8",
                 "--max-new-tokens", "3"]) == 2
    assert "int8 quantizes linear layers" in capsys.readouterr().err
