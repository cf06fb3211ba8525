"""A block's bf16 products on AMX tiles, or by AVX512-BF16 dot products where there are none
(models/tile_matmul.py): the same bits as PyTorch's ``mm`` and ``addmm`` for the forward and
the backward's input gradient; for the weight gradient on tiles too, by dot products all but
a few elements in ten thousand; and a fused block's loss and gradients unchanged by the
tiles. Runs where the CPU has either (elsewhere nothing uses them); the dot products are also
held to oneDNN's own kernel for them in a process that has it run there
(``ONEDNN_MAX_CPU_ISA``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from scratchgpt.models import attention_kernel, block_kernel, tile_matmul
from scratchgpt.models.gpt import GPT, GPTConfig

pytestmark = pytest.mark.skipif(tile_matmul._load() is None,
                                reason="neither AMX nor AVX512-BF16 here (or no C compiler)")
TILES = tile_matmul.kind() == "tiles"

# (rows, in, out): the recipe's four projections, and other multiples of 32
SHAPES = [(768, 128, 384), (768, 128, 128), (768, 128, 512), (768, 512, 128), (64, 96, 32),
          (32, 32, 64)]


def assert_pytorchs_weight_grad(got: torch.Tensor, ref: torch.Tensor) -> None:
    """``ref``'s bits on tiles; by dot products (their sums' order is their own) all but a few
    elements in ten thousand (at most 1.8 in ten thousand at the recipe's shapes), and those
    within a few bf16 steps (at most 3: where a sum cancels, its rounding error in fp32 is
    large beside the small result)."""
    if TILES:
        assert torch.equal(got, ref)
        return
    steps = (got.bfloat16().view(torch.int16).int() - ref.bfloat16().view(torch.int16).int())
    assert (steps != 0).float().mean() < 1e-3 and steps.abs().max() <= 4


def _operands(rows: int, n_in: int, n_out: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n_out, n_in, generator=g) * n_in ** -0.5  # an nn.Linear's weight (fp32)
    x = torch.randn(rows, n_in, generator=g).bfloat16()
    dy = torch.randn(rows, n_out, generator=g).bfloat16()
    b = torch.randn(n_out, generator=g).bfloat16()
    return w, x, dy, b


@pytest.mark.parametrize("rows,n_in,n_out", SHAPES)
def test_products_are_pytorchs_bit_for_bit(rows, n_in, n_out):
    w, x, dy, b = _operands(rows, n_in, n_out)
    assert tile_matmul.usable(rows, [w])
    (fwd,), (bwd,) = tile_matmul.pack([w])
    w16 = w.bfloat16()  # what autocast multiplies by
    assert torch.equal(tile_matmul.linear(x, fwd, None), torch.mm(x, w16.t()))
    assert torch.equal(tile_matmul.linear(x, fwd, b), torch.addmm(b, x, w16.t()))
    assert torch.equal(tile_matmul.input_grad(dy, bwd), dy.mm(w16))
    # the weight's gradient: the bf16 product's sums, widened to the parameter's fp32
    assert_pytorchs_weight_grad(tile_matmul.weight_grad(dy, x), dy.t().mm(x).float())


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_weight_gradients_are_the_same_on_any_number_of_threads(threads):
    """The threads share the longer side of the gradient (its rows, or its columns): the
    same sums, whichever way it is cut."""
    before = torch.get_num_threads()
    try:
        for n_in, n_out in ((128, 512), (512, 128), (96, 96)):
            _, x, dy, _ = _operands(256, n_in, n_out)
            torch.set_num_threads(1)
            alone = tile_matmul.weight_grad(dy, x)
            torch.set_num_threads(threads)
            got = tile_matmul.weight_grad(dy, x)
            assert torch.equal(got, alone)
            assert_pytorchs_weight_grad(got, dy.t().mm(x).float())
    finally:
        torch.set_num_threads(before)


def test_several_weights_in_one_call_and_rows_of_a_wider_tensor():
    """pack lays out a list of weights of different shapes at once; x may be a view whose rows
    are further apart than its width (a slice of columns)."""
    ws = [_operands(64, n_in, n_out, seed)[0] for seed, (n_in, n_out) in
          enumerate([(128, 384), (128, 128), (128, 512), (512, 128)])]
    fwd, bwd = tile_matmul.pack(ws)
    wide = torch.randn(64, 640).bfloat16()
    for w, f, g in zip(ws, fwd, bwd, strict=True):
        x = wide[:, : w.size(1)]  # rows 640 apart
        dy = torch.randn(64, w.size(0)).bfloat16()
        assert torch.equal(tile_matmul.linear(x, f, None), torch.mm(x, w.bfloat16().t()))
        assert torch.equal(tile_matmul.input_grad(dy, g), dy.mm(w.bfloat16()))
        assert_pytorchs_weight_grad(tile_matmul.weight_grad(dy, x), dy.t().mm(x).float())


def test_weights_are_rounded_as_pytorch_rounds_them():
    """Ties to even either way, values that round up into the next power of two or to the
    largest bf16, denormals, zeros: laid out as ``w.bfloat16()`` (read back through products
    with the identity, where one infinity or NaN would make its whole column NaN)."""
    w, _, _, _ = _operands(32, 32, 32)
    edge = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, 2 - 2 ** -9, 3.0e38, -3.3e38, 1e-39,
                         -1e-40, 0.0, -0.0])
    w.view(-1)[: edge.numel()] = edge
    (fwd,), (bwd,) = tile_matmul.pack([w])
    eye = torch.eye(32).bfloat16()
    w16 = w.bfloat16()
    assert torch.equal(tile_matmul.linear(eye, fwd, None), torch.mm(eye, w16.t()))
    assert torch.equal(tile_matmul.input_grad(eye, bwd), eye.mm(w16))


def test_usable_only_for_multiples_of_32_and_not_when_switched_off(monkeypatch):
    w = torch.randn(64, 32)
    assert tile_matmul.usable(64, [w])
    assert not tile_matmul.usable(48, [w])  # rows
    assert not tile_matmul.usable(64, [w, torch.randn(65, 32)])  # a vocabulary's head
    assert not tile_matmul.usable(64, [w.bfloat16()])  # (the parameters are fp32)
    monkeypatch.setenv(tile_matmul.SWITCH, "torch")
    assert not tile_matmul.usable(64, [w])


@pytest.mark.skipif(attention_kernel.load() is None, reason="the fused block needs AVX-512")
@pytest.mark.skipif(not TILES, reason="by dot products the weight gradients are not PyTorch's bits")
@pytest.mark.parametrize("bias", [True, False])
def test_a_fused_blocks_loss_and_gradients_are_unchanged(monkeypatch, bias):
    """The same training step with the products on tiles and on PyTorch's: every gradient
    equal, bit for bit (32 rows of 64 features: the tiles' sizes)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=40, block_size=16, n_layer=2, n_head=2, n_embd=64,
                          dropout=0.0, bias=bias)).train()
    idx = torch.randint(0, 40, (2, 17))
    # the kernels called one by one (test_block_kernel.py: in one call, the same bits)
    monkeypatch.setenv(block_kernel.SWITCH, "python")
    calls = []
    real = tile_matmul._product
    monkeypatch.setattr(tile_matmul, "_product", lambda *a: calls.append(1) or real(*a))
    runs = []
    for switch in ("", "torch"):
        monkeypatch.setenv(tile_matmul.SWITCH, switch)
        model.zero_grad()
        with torch.autocast("cpu", torch.bfloat16):
            logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), idx[:, 1:].flatten())
        loss.backward()
        runs.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    assert len(calls) == 2 * 8  # two blocks' four forward products and four input gradients
    assert torch.equal(runs[0][0], runs[1][0])
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1], strict=True))


_DOT_SCRIPT = """
import torch
from scratchgpt.models import tile_matmul
from tests.models.test_tile_matmul import SHAPES, _operands, assert_pytorchs_weight_grad
assert tile_matmul.kind() == "dot"
for rows, n_in, n_out in SHAPES:
    w, x, dy, b = _operands(rows, n_in, n_out)
    (fwd,), (bwd,) = tile_matmul.pack([w])
    w16 = w.bfloat16()
    assert torch.equal(tile_matmul.linear(x, fwd, b), torch.addmm(b, x, w16.t()))
    assert torch.equal(tile_matmul.linear(x, fwd, None), torch.mm(x, w16.t()))
    assert torch.equal(tile_matmul.input_grad(dy, bwd), dy.mm(w16))
    assert_pytorchs_weight_grad(tile_matmul.weight_grad(dy, x), dy.t().mm(x).float())
print("dot products checked")
"""


def test_dot_products_are_onednns_for_such_cpus():
    """Where there are no tiles the dot products run: in a process that has them run (and has
    oneDNN run its own kernel for AVX512-BF16 CPUs, as it does on one), the forward products
    and input gradients are PyTorch's bit for bit, the weight gradients all but a few
    elements in ten thousand (assert_pytorchs_weight_grad)."""
    env = {**os.environ, tile_matmul.SWITCH: "dot", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}
    done = subprocess.run([sys.executable, "-c", _DOT_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "dot products checked" in done.stdout


def test_describe_names_what_the_products_run_on(monkeypatch):
    assert tile_matmul.describe() == ("AMX tiles" if TILES else "AVX512-BF16 dot products")
    monkeypatch.setenv(tile_matmul.SWITCH, "torch")
    assert tile_matmul.describe() == "PyTorch's"
