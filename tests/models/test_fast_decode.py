"""optimize_for_decode changes speed, not results."""

from __future__ import annotations

import copy

import pytest
import torch

from scratchgpt.generation.generate import generate
from scratchgpt.generation.sampling import SamplingConfig
from scratchgpt.models.fast_decode import PackedLinear, optimize_for_decode, packing_available
from scratchgpt.models.gpt import GPT, GPTConfig


def tiny() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=97, block_size=48, n_layer=2, n_head=4, n_embd=64)).eval()


def test_fp32_decode_layout_is_the_same_model():
    model = tiny()
    fast = copy.deepcopy(model).decode_layout_()
    assert fast.transformer.h[0].mlp.c_fc.weight.stride() == (1, 256)  # wide: column-major
    assert fast.transformer.h[0].mlp.c_proj.weight.is_contiguous()  # tall: row-major
    assert fast.lm_head.weight is fast.transformer.wte.weight  # still tied
    x = torch.randint(0, 97, (2, 30))
    with torch.no_grad():
        assert torch.allclose(fast(x), model(x), atol=1e-5)
    g = SamplingConfig(temperature=0)
    assert torch.equal(generate(fast, x[:, :4], 20, g), generate(model, x[:, :4], 20, g))


@pytest.mark.skipif(not packing_available(torch.float32), reason="oneDNN unavailable")
def test_fp32_optimize_packs_linears_and_keeps_results():
    model = tiny()
    fast = optimize_for_decode(copy.deepcopy(model), pack=0)  # pack them all
    block = fast.transformer.h[0]
    assert isinstance(block.mlp.c_fc, PackedLinear) and isinstance(fast.lm_head, PackedLinear)
    assert isinstance(block.mlp.c_proj, PackedLinear) and isinstance(block.attn.c_proj,
                                                                     PackedLinear)
    x = torch.randint(0, 97, (2, 30))
    with torch.no_grad():
        assert torch.allclose(fast(x), model(x), atol=1e-5)
    g = SamplingConfig(temperature=0)
    assert torch.equal(generate(fast, x[:, :4], 20, g), generate(model, x[:, :4], 20, g))


@pytest.mark.skipif(not packing_available(), reason="oneDNN bf16 packing unavailable")
def test_bf16_packed_linears_match_plain_bf16():
    plain = tiny().to(torch.bfloat16)
    packed = optimize_for_decode(copy.deepcopy(plain), pack=0)
    assert isinstance(packed.lm_head, PackedLinear)
    x = torch.randint(0, 97, (2, 30))
    with torch.no_grad():
        diff = (packed(x).float() - plain(x).float()).abs().max().item()
    assert diff <= 0.02, diff  # both bf16; only the summation order may differ
    cache = packed.new_cache(1)
    assert cache.k.dtype == torch.bfloat16


@pytest.mark.skipif(not packing_available(torch.float32), reason="oneDNN unavailable")
def test_only_linears_above_the_threshold_are_packed():
    model = tiny()  # c_fc: 64 x 256 fp32 = 64 KiB, lm_head (tied wte): 97 x 64
    assert not any(isinstance(m, PackedLinear)
                   for m in optimize_for_decode(copy.deepcopy(model)).modules())
    fast = optimize_for_decode(copy.deepcopy(model), pack=64 * 256 * 4)
    block = fast.transformer.h[0]
    assert isinstance(block.mlp.c_fc, PackedLinear) and isinstance(block.mlp.c_proj,
                                                                     PackedLinear)
    assert not isinstance(block.attn.c_attn, PackedLinear)  # 64 x 192: below
    assert block.attn.c_attn.weight.stride() == (1, 192)  # the rest: the decode layout
    x = torch.randint(0, 97, (2, 30))
    with torch.no_grad():
        assert torch.allclose(fast(x), model(x), atol=1e-5)
    g = SamplingConfig(temperature=0)
    assert torch.equal(generate(fast, x[:, :4], 20, g), generate(model, x[:, :4], 20, g))


def test_small_models_decode_on_one_thread(monkeypatch):
    from scratchgpt.models import fast_decode

    model = optimize_for_decode(tiny(), pack=0)  # packed weights count too
    size = sum(t.numel() * t.element_size() for t in fast_decode.model_weights(model))
    plain = tiny()
    assert size >= sum(p.nbytes for p in plain.parameters())  # every weight counted once
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert fast_decode.decode_threads(model) == 1
        monkeypatch.setattr(fast_decode, "SINGLE_THREAD_MAX_BYTES", size - 1)
        assert fast_decode.decode_threads(model) == 2  # larger: torch's setting
        assert fast_decode.decode_threads(object()) == 2  # not a torch model
    finally:
        torch.set_num_threads(threads)


@pytest.mark.skipif(not packing_available(torch.float32), reason="oneDNN unavailable")
def test_auto_packing_keeps_a_row_weight_for_mid_sized_fp32_linears(monkeypatch):
    """fp32 Linears between ROWS_MIN_BYTES and PACK_MIN_BYTES answer one row through their
    plain weight and several rows through the packed one: the same results either way."""
    from scratchgpt.models import fast_decode

    model = tiny()
    monkeypatch.setattr(fast_decode, "PACK_MIN_BYTES", 64 * 256 * 4)  # c_fc, mlp.c_proj
    monkeypatch.setattr(fast_decode, "ROWS_MIN_BYTES", 64 * 192 * 4)  # c_attn
    fast = optimize_for_decode(copy.deepcopy(model))
    block = fast.transformer.h[0]
    assert block.mlp.c_fc.row_weight is None and block.attn.c_attn.row_weight is not None
    assert not isinstance(block.attn.c_proj, PackedLinear)  # 64 x 64: below both
    lin, packed = model.transformer.h[0].attn.c_attn, block.attn.c_attn
    with torch.no_grad():
        for shape in ((64,), (1, 1, 64), (5, 64), (2, 3, 64)):
            x = torch.randn(shape)
            assert torch.allclose(packed(x), lin(x), atol=1e-5), shape
        x = torch.randint(0, 97, (2, 30))
        assert torch.allclose(fast(x), model(x), atol=1e-5)
    g = SamplingConfig(temperature=0)
    assert torch.equal(generate(fast, x[:, :4], 20, g), generate(model, x[:, :4], 20, g))


@pytest.mark.skipif(not packing_available(), reason="oneDNN bf16 packing unavailable")
def test_auto_packing_packs_every_bf16_linear():
    fast = optimize_for_decode(tiny().to(torch.bfloat16))
    linears = [m for m in fast.modules() if isinstance(m, torch.nn.Linear | PackedLinear)]
    assert linears and all(isinstance(m, PackedLinear) and m.row_weight is None
                           for m in linears)


@pytest.mark.skipif(not packing_available(torch.float32), reason="oneDNN unavailable")
def test_auto_packing_of_a_model_that_decodes_on_several_threads(monkeypatch):
    """Over SINGLE_THREAD_MAX_BYTES (decoded with several threads), fp32 Linears from
    ROWS_MIN_BYTES up are packed alone: with two threads the packed one-row product wins."""
    from scratchgpt.models import fast_decode

    model = tiny()
    monkeypatch.setattr(fast_decode, "SINGLE_THREAD_MAX_BYTES", 1)
    monkeypatch.setattr(fast_decode, "ROWS_MIN_BYTES", 64 * 192 * 4)  # c_attn and up
    fast = optimize_for_decode(copy.deepcopy(model))
    block = fast.transformer.h[0]
    for linear in (block.attn.c_attn, block.mlp.c_fc, block.mlp.c_proj):
        assert isinstance(linear, PackedLinear) and linear.row_weight is None
    assert not isinstance(block.attn.c_proj, PackedLinear)  # 64 x 64: below
    x = torch.randint(0, 97, (2, 30))
    with torch.no_grad():
        assert torch.allclose(fast(x), model(x), atol=1e-5)
