"""A block's elementwise work in C (models/block_ops.c) against PyTorch's operators, which it
replaces in a fused block's training step: activations bit for bit on every bf16 value, the
residual add exactly, LayerNorms to float rounding, and results the same on every call."""

from __future__ import annotations

import doctest

import pytest
import torch

from scratchgpt.models import block_ops
from scratchgpt.models.block_ops import C_OPS, TORCH_OPS

needs_c = pytest.mark.skipif(block_ops._load() is None,
                             reason="the C kernels need AVX-512 and a C compiler")
BF16 = torch.bfloat16
ACTIVATIONS = ["none", "tanh", "relu", "relu2"]  # exact GELU, GELU's tanh form, ReLU, ReLU²
# odd sizes: rows that are no multiple of 16 features, counts that leave a ragged tail
SHAPES = [(7, 40), (96, 128), (5, 16)]


def _every_bf16() -> torch.Tensor:
    return torch.arange(65536, dtype=torch.int32).to(torch.int16).view(BF16)


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


def test_docstring_examples_run():
    assert doctest.testmod(block_ops, raise_on_error=True).attempted > 0


@needs_c
@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activations_equal_pytorch_on_every_bf16_value(name):
    f = _every_bf16()
    _same(C_OPS.activate(f, name)[1], TORCH_OPS.activate(f, name)[1])
    dg = torch.randn(65536, generator=torch.Generator().manual_seed(0)).to(BF16)
    r = TORCH_OPS.activate(f, name)[0]
    _same(C_OPS.activation_backward(dg, f, None, name),
          TORCH_OPS.activation_backward(dg, f, r, name))


@needs_c
@pytest.mark.parametrize("n", [1, 17, 40_000])  # one value, a ragged tail, two threads' worth
def test_activation_of_any_length(n):
    f = torch.randn(n).to(BF16) * 3
    _same(C_OPS.activate(f, "none")[1], TORCH_OPS.activate(f, "none")[1])


def _ln_inputs(N: int, C: int, bias: bool):
    gen = torch.Generator().manual_seed(N * C)
    x = torch.randn(N, C, generator=gen) * 2 + 0.5
    w = torch.randn(C, generator=gen)
    b = torch.randn(C, generator=gen) if bias else None
    res = torch.randn(N, C, generator=gen).to(BF16)
    return x, w, b, res


def _within_a_bf16_step(h: torch.Tensor, h_ref: torch.Tensor) -> None:
    """bf16 results at most one rounding apart, and seldom that (the fp32 values under them
    differ by float rounding only)."""
    a, b = h.float(), h_ref.float()
    assert ((a - b).abs() <= b.abs() * 2**-7 + 1e-30).all()
    assert (a != b).float().mean() < 0.02


@needs_c
@pytest.mark.parametrize("N,C", SHAPES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("with_res", [True, False])
def test_layer_norm_matches_pytorch(N, C, bias, with_res):
    x, w, b, res = _ln_inputs(N, C, bias)
    res = res if with_res else None
    x1, h, mean, rstd = C_OPS.layer_norm(x, w, b, 1e-5, res=res)
    x1_ref, h_ref, mean_ref, rstd_ref = TORCH_OPS.layer_norm(x, w, b, 1e-5, res=res)
    assert torch.equal(x1, x1_ref)  # the residual add is one fp32 add either way
    assert h.dtype == BF16 and h.shape == (N, C)
    _within_a_bf16_step(h, h_ref)
    torch.testing.assert_close(mean, mean_ref.flatten(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rstd, rstd_ref.flatten(), rtol=1e-5, atol=0)


@needs_c
@pytest.mark.parametrize("n", [5, 4096, 70_001])
def test_residual_add_is_exact(n):
    x, y = torch.randn(n), torch.randn(n).to(BF16)
    assert torch.equal(C_OPS.residual(x, y), TORCH_OPS.residual(x, y))


@needs_c
@pytest.mark.parametrize("N,C", SHAPES + [(768, 128)])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_backward_matches_pytorch(N, C, bias):
    x, w, b, _ = _ln_inputs(N, C, bias)
    _, _, mean, rstd = TORCH_OPS.layer_norm(x, w, b, 1e-5)
    dh = torch.randn(N, C).to(BF16)
    dres = torch.randn(N, C)
    dx, dx16, dw, db = C_OPS.layer_norm_backward(dh, x, mean.flatten(), rstd.flatten(), w, b,
                                                 dres, True)
    dx_ref, _, dw_ref, db_ref = TORCH_OPS.layer_norm_backward(dh, x, mean, rstd, w, b, dres,
                                                              True)
    torch.testing.assert_close(dx, dx_ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(dx16, dx.to(BF16))  # the bf16 copy is the fp32 result, rounded
    torch.testing.assert_close(dw, dw_ref, rtol=1e-5, atol=1e-4)
    assert (db is None) == (not bias)
    if bias:
        torch.testing.assert_close(db, db_ref, rtol=1e-5, atol=1e-4)
    without = C_OPS.layer_norm_backward(dh, x, mean.flatten(), rstd.flatten(), w, b, None, False)
    torch.testing.assert_close(without[0], dx - dres, rtol=1e-5, atol=1e-5)
    assert without[1] is None


@needs_c
def test_layer_norm_backward_gives_the_same_bits_every_call():
    """The weight's gradient is a sum over rows split between threads: added in thread order,
    so repeated calls agree exactly (what an exact resume needs)."""
    x, w, b, _ = _ln_inputs(768, 128, True)
    _, _, mean, rstd = C_OPS.layer_norm(x, w, b, 1e-5)
    dh = torch.randn(768, 128).to(BF16)
    first = C_OPS.layer_norm_backward(dh, x, mean, rstd, w, b, None, True)
    for _ in range(3):
        again = C_OPS.layer_norm_backward(dh, x, mean, rstd, w, b, None, True)
        assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


@needs_c
def test_the_switch_chooses_pytorch(monkeypatch):
    monkeypatch.setenv(block_ops.SWITCH, "torch")
    assert block_ops.ops() is TORCH_OPS
    monkeypatch.setenv(block_ops.SWITCH, "")
    assert block_ops.ops() is C_OPS


@needs_c
def test_weights_round_to_bf16_and_gradients_widen_as_pytorch_casts_them():
    weights = [torch.randn(48, 40), None, torch.randn(7, 3) * 1e-3, torch.randn(1000)]
    narrowed = C_OPS.to_bf16(weights)
    assert narrowed[1] is None
    for got, want in zip(narrowed, TORCH_OPS.to_bf16(weights), strict=True):
        assert (got is None and want is None) or torch.equal(got, want)
    widened = C_OPS.to_fp32(narrowed)
    for got, want in zip(widened, TORCH_OPS.to_fp32(narrowed), strict=True):
        assert (got is None and want is None) or (got.dtype == torch.float32
                                                  and torch.equal(got, want))


@needs_c
@pytest.mark.parametrize("name", ACTIVATIONS)
def test_fp32_activations_are_as_close_to_the_truth_as_pytorchs(name):
    """fp32 has too many values for a table: C computes GELU with its own erf and tanh. Its
    error against the activation in float64 (beyond float rounding of the result) is no larger
    than PyTorch's own fp32 activation's; both grow with |x| where 1 + erf(x) cancels."""
    f = torch.cat([torch.randn(50_000, generator=torch.Generator().manual_seed(0)) * 4,
                   torch.tensor([0.0, -0.0, 30.0, -30.0, 1e-30])])
    truth = TORCH_OPS.activate(f.double(), name)[1]

    def error(g: torch.Tensor) -> float:
        return (((g.double() - truth).abs() - 2e-7 * truth.abs()) / f.abs().clamp_min(1)).max()

    assert error(C_OPS.activate(f, name)[1]) <= max(error(TORCH_OPS.activate(f, name)[1]), 0)


@needs_c
@pytest.mark.parametrize("N,C", SHAPES)
def test_fp32_layer_norm_and_residual_match_pytorch(N, C):
    x, w, b, _ = _ln_inputs(N, C, True)
    res = torch.randn(N, C)
    x1, h, _, _ = C_OPS.layer_norm(x, w, b, 1e-5, res=res, dtype=torch.float32)
    x1_ref, h_ref, _, _ = TORCH_OPS.layer_norm(x, w, b, 1e-5, res=res, dtype=torch.float32)
    assert torch.equal(x1, x1_ref) and h.dtype == torch.float32
    torch.testing.assert_close(h, h_ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(C_OPS.residual(x, res), TORCH_OPS.residual(x, res))


@needs_c
def test_a_profile_names_each_c_call():
    """ctypes calls are no operator the profiler sees: each one is a named range instead."""
    from torch.profiler import profile

    x, w, b, _ = _ln_inputs(8, 32, True)
    with profile() as prof:
        C_OPS.layer_norm(x, w, b, 1e-5)
        C_OPS.activate(torch.randn(64).to(BF16), "none")
    names = {e.key for e in prof.key_averages()}
    assert {"block_ops.layer_norm", "block_ops.activate"} <= names


@needs_c
def test_rounding_to_bf16_is_pytorchs_on_edge_values():
    """Ties (to even), values that round up into the next power of two or to infinity,
    infinities, zeros, denormals (which a CPU's own bf16 conversion would flush to zero) and
    NaN: the C rounding gives PyTorch's bits, NaN for NaN."""
    bits = torch.tensor([0x3F808000, 0x3F818000, 0x3F80FFFF, 0x7F7FFFFF, 0x7F7F7FFF, 0x7F800000,
                         0xFF800000, 0x00000000, 0x80000000, 0x00000001, 0x00408000, 0x807FFFFF,
                         0x00800000, 0x7FC00001, 0xFF812345, 0x3EAAAAAB], dtype=torch.int64)
    edge = bits.to(torch.int32).view(torch.float32)
    tiny = (edge != 0) & (edge.abs() < torch.finfo(torch.float32).tiny)
    ordinary = edge[~(edge.isnan() | tiny)]  # a vector of these alone takes the fast way
    for values in (edge, edge.roll(3), ordinary, edge[~edge.isnan()],
                   torch.cat([edge, torch.randn(77)])):
        # alone in their vector, and beside ordinary values
        mixed = torch.cat([values, torch.randn(16 - values.numel() % 16)])
        _same(C_OPS.to_bf16([mixed])[0], mixed.to(BF16))
