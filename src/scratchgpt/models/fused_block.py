"""A transformer block's training forward and backward, written out as one autograd function.

Why: at the small shapes a CPU trains, a step spends nearly as much time around PyTorch's
operators as in them. Under bf16 autocast each of a block's ~15 operations passes through
autocast's dispatch and records an autograd node, and the backward runs one node per
operation, casts included. :class:`_Block` runs the same operations on the same dtypes in the
same order as the block's modules do under autocast, with neither autocast nor autograd
looking on, and its backward is the chain rule written out below. The elementwise work between
the products (LayerNorms, residual adds, the activation) runs as
:mod:`~scratchgpt.models.block_ops` chooses: its C kernels, one pass each with the casts fused
in, where they are built, which agree with the modules' path to float rounding; or PyTorch's
operators (``SCRATCHGPT_BLOCK_OPS=torch``), with which the loss and every gradient are those of
the modules' path bit for bit. Tests compare all three. With the C kernels, on a CPU with AMX,
the forward's four products and the backward's eight run on the tile registers
(:mod:`~scratchgpt.models.tile_matmul`: the same bits as PyTorch's products, without the ~35
us each of those costs before its arithmetic; on one with AVX512-BF16 but no AMX, by its
dot products, the weight gradients then summed in their own order), and then the whole
forward and the whole backward each run as one C call
(:mod:`~scratchgpt.models.block_kernel`: the same kernels in the same order, without Python
between them). docs/BENCHMARKS.md has the step times with and
without each.

When it is used: a :class:`~scratchgpt.models.gpt.Block` on fp32 activations, under CPU bf16
autocast, or in fp32 without gradients, where scratchgpt's attention kernel
(:mod:`~scratchgpt.models.attention_kernel`) can run, on all of a sequence's positions at once
with no KV cache, for a plain block: LayerNorms with gains, ``nn.Linear`` projections with or
without biases (not LoRA's), GELU (exact or tanh), ReLU or ReLU², residuals, an MLP, no
QK-norm, no value embedding, no dropout in training; rotary positions are turned by the
attention kernel. In bf16 training it is an autograd function; without gradients (a periodic
evaluation, the final evaluation in fp32, scoring a text) the forward runs alone, its products
in fp32 where there is no autocast. Anything else runs the modules, as do fp32 training,
decoding on a KV cache and ``torch.compile``. ``SCRATCHGPT_FUSED_BLOCK=torch`` switches it
off.

The forward, for x (B, T, C) fp32 seen as N = B T rows, each product on bf16 copies of its
weights (what autocast makes; in an fp32 evaluation every "bf16" below is fp32):

    h1 = LN1(x)                      (N, C)  bf16 (PyTorch's LayerNorm gives fp32, then a cast)
    qkv = h1 Wqkv^T + bqkv           (N, 3C) bf16
    y = attention(qkv)               (N, C)  bf16, the kernel's, with lse (B, H, T) kept
    x1 = x + (y Wo^T + bo)           (N, C)  fp32
    h2 = LN2(x1)                     (N, C)  bf16
    f = h2 Wfc^T + bfc               (N, 4C) bf16
    g = act(f)                       (N, 4C) bf16, GELU, ReLU or ReLU² (relu(f) squared)
    out = x1 + (g Wp^T + bp)         (N, C)  fp32
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from scratchgpt.models import attention_kernel, block_kernel, block_ops, tile_matmul
from scratchgpt.models.layers import ReLUSquared

SWITCH = "SCRATCHGPT_FUSED_BLOCK"
BF16 = torch.bfloat16
_ACTIVATIONS = (nn.GELU, nn.ReLU, ReLUSquared)


@dataclass(frozen=True)
class _Spec:
    """What the function needs besides tensors with gradients."""

    n_head: int
    eps: tuple[float, float]  # the two LayerNorms'
    activation: str  # "none" or "tanh" (GELU's approximation), "relu" or "relu2"
    tables: tuple[Tensor, ...]  # rotary cos and sin (T, D/2) fp32, or ()


def _layers(block: Any) -> tuple[nn.Module, ...]:
    """The block's (ln_1, c_attn, c_proj, ln_2, c_fc, c_proj, act), read from the modules' own
    tables: ``block.attn.c_attn`` goes through ``nn.Module.__getattr__`` twice, ~1 us each,
    and a block's forward needs a few dozen such names (~0.1 ms a step at the recipe's
    shape). None for a layer the block does not have (a block without an MLP, or without
    its LayerNorm)."""
    mods = block._modules
    attn, mlp = mods["attn"]._modules, mods.get("mlp")
    c_fc = c_proj = act = None
    if mlp is not None:
        c_fc, c_proj, act = (mlp._modules.get(n) for n in ("c_fc", "c_proj", "act"))
    return (mods.get("ln_1"), attn.get("c_attn"), attn.get("c_proj"), mods.get("ln_2"), c_fc,
            c_proj, act)


def _plain(block: Any, layers: tuple[nn.Module, ...]) -> bool:
    """A block of the one kind :class:`_Block` computes (see the module docstring), of
    ``layers`` (:func:`_layers`)."""
    ln_1, c_attn, o_proj, ln_2, c_fc, p_proj, act = layers
    attn, mlp = block._modules["attn"], block._modules.get("mlp")
    return (block.residual and mlp is not None
            and all(type(n) is nn.LayerNorm and n._parameters["weight"] is not None
                    for n in (ln_1, ln_2))
            and all(type(p) is nn.Linear for p in (c_attn, o_proj, c_fc, p_proj))
            and type(act) in _ACTIVATIONS and attn.q_norm is None and attn.ve_lambda is None
            and attn.impl == "sdpa"
            and (not block.training  # (evaluation: dropout is the identity)
                 or attn.attn_dropout == mlp._modules["dropout"].p
                 == attn._modules["resid_dropout"].p == 0))


def _runs_here(x: Tensor, rope: tuple[Tensor, Tensor] | None) -> bool:
    """Whether x (B, T, C) and the rotary tables are of the kind :class:`_Block` takes, outside
    the compiler (which fuses the modules its own way) and not switched off."""
    return (not torch.compiler.is_compiling() and x.dtype == torch.float32
            and x.device.type == "cpu" and (rope is None or rope[0].dim() == 2)
            and os.environ.get(SWITCH, "").lower() != "torch")


def _dtype() -> torch.dtype | None:
    """The products' dtype here: bf16 under CPU bf16 autocast, fp32 without autocast and
    without gradients, None otherwise (fp32 training, another autocast dtype)."""
    if torch.is_autocast_enabled("cpu"):
        return BF16 if torch.get_autocast_dtype("cpu") == BF16 else None
    return None if torch.is_grad_enabled() else torch.float32


def block_forward(block: Any, x: Tensor,
                  rope: tuple[Tensor, Tensor] | None = None) -> Tensor | None:
    """``block(x)`` (B, T, C) -> (B, T, C) through :class:`_Block`, or None where the block
    cannot run as one function (then its modules run): it can under CPU bf16 autocast
    (training or evaluation) or in fp32 without gradients (evaluation), for a plain block,
    the attention kernel usable, rotary tables of one row per position (or none). The
    conditions and the layers are read once, for the decision and the call."""
    dtype = _dtype() if _runs_here(x, rope) else None
    if dtype is None:
        return None
    layers = _layers(block)
    attn = block._modules["attn"]
    if not (_plain(block, layers) and attention_kernel.usable(x, attn.head_dim)):
        return None
    tables = attention_kernel.rope_tables_for(rope, x.size(1), attn.head_dim)
    spec = _Spec(attn.n_head, (layers[0].eps, layers[3].eps), _activation(layers[6]), tables)
    params = tuple(m._parameters[name] for m in layers[:6] for name in ("weight", "bias"))
    if not torch.is_grad_enabled():  # evaluation: the forward alone, nothing kept
        if dtype == BF16 and _one_call(x, params):
            return block_kernel.forward(x, spec.n_head, spec.eps, spec.activation, tables,
                                        params)[0]
        return _forward(x, spec, params, block_ops.ops(), dtype)[0]
    return _Block.apply(x, spec, *params)


def _one_call(x: Tensor, params: tuple[Tensor | None, ...]) -> bool:
    """Whether a bf16 block of input x (B, T, C) and ``params`` runs as one C call each way
    here (:func:`block_kernel.usable`: its products on tiles or by dot products)."""
    return block_kernel.usable(x.size(0) * x.size(1), [params[i] for i in (2, 4, 8, 10)])


def _activation(act: nn.Module) -> str:
    """What :mod:`~scratchgpt.models.block_ops` calls ``act``: GELU's approximation ("none" or
    "tanh"), "relu" or "relu2"."""
    if isinstance(act, nn.GELU):
        return act.approximate
    return "relu" if isinstance(act, nn.ReLU) else "relu2"


def _linear(x: Tensor, w: Tensor, b: Tensor | None, tiles: bool = False) -> Tensor:
    """x (N, in) w (out, in)^T (+ b): the product ``nn.Linear`` runs on (N, in) rows; with
    ``tiles``, on AMX tiles from the weight laid out for them (the same bits)."""
    if tiles:
        return tile_matmul.linear(x, w, b)
    return torch.mm(x, w.t()) if b is None else torch.addmm(b, x, w.t())


def _linear_backward(dy: Tensor, x: Tensor, w: Tensor, b: Tensor | None,
                     tiles: bool = False) -> tuple[Tensor, Tensor, Tensor | None]:
    """Gradients of :func:`_linear` from dy (N, out): of x (N, in), w (out, in) and b (out).
    With ``tiles``, the products on AMX tiles, dx from the weight laid out for the backward,
    and the gradients of w and b already widened to the parameters' fp32."""
    if tiles:
        return (tile_matmul.input_grad(dy, w), tile_matmul.weight_grad(dy, x),
                None if b is None else dy.sum(0).float())
    return dy.mm(w), dy.t().mm(x), None if b is None else dy.sum(0)


def _product_operands(weights: list[Any], biases: list[Any], ops: block_ops.Ops,
                      dtype: torch.dtype,
                      rows: int) -> tuple[list[Any], list[Any], list[Any], bool]:
    """The four projections' weights as the forward's products read them, as the backward's
    read them, their biases, and whether the products run on AMX tiles (with the C kernels
    under bf16, where :func:`tile_matmul.usable`). In bf16 each is rounded as autocast rounds
    it; on tiles the weights are laid out for the tiles besides, once for each product."""
    if dtype != BF16:  # an fp32 evaluation: the parameters as they are
        return weights, weights, biases, False
    if ops is block_ops.C_OPS and tile_matmul.usable(rows, weights):
        forward, backward = tile_matmul.pack(weights)
        return forward, backward, ops.to_bf16(biases), True
    converted = ops.to_bf16(weights + biases)  # one call
    return converted[:4], converted[:4], converted[4:], False


def _forward(x: Tensor, spec: _Spec, params: tuple[Tensor | None, ...], ops: block_ops.Ops,
             dtype: torch.dtype) -> tuple[Tensor, tuple[Tensor | None, ...], bool]:
    """The forward of the module docstring, its products in ``dtype`` (bf16, or fp32 in an
    fp32 evaluation): (the block's output (B, T, C) fp32, what :meth:`_Block.backward`
    reads, whether its products ran on AMX tiles)."""
    B, T, C = x.shape
    ln1_w, ln1_b, qkv_w, qkv_b, o_w, o_b, ln2_w, ln2_b, fc_w, fc_b, p_w, p_b = params
    (qkv_w, o_w, fc_w, p_w), back, (qkv_b, o_b, fc_b, p_b), tiles = _product_operands(
        [qkv_w, o_w, fc_w, p_w], [qkv_b, o_b, fc_b, p_b], ops, dtype, B * T)
    x = x.reshape(B * T, C)  # (N, C)
    _, h1, mean1, rstd1 = ops.layer_norm(x, ln1_w, ln1_b, spec.eps[0], dtype=dtype)  # h1 in dtype
    qkv = _linear(h1, qkv_w, qkv_b, tiles)  # (N, 3C)
    y, lse = attention_kernel.qkv_forward(qkv.view(B, T, 3 * C), spec.n_head, spec.tables)
    y = y.view(B * T, C)
    # x1 = x + y Wo^T + bo (the residual stream stays fp32), and h2 = LN2(x1) in dtype
    x1, h2, mean2, rstd2 = ops.layer_norm(x, ln2_w, ln2_b, spec.eps[1],
                                          res=_linear(y, o_w, o_b, tiles), dtype=dtype)
    f = _linear(h2, fc_w, fc_b, tiles)  # (N, 4C)
    r, g = ops.activate(f, spec.activation)
    out = ops.residual(x1, _linear(g, p_w, p_b, tiles))
    qkv_w, o_w, fc_w, p_w = back  # (what the backward's products read)
    return out.view(B, T, C), (x, h1, mean1, rstd1, qkv, y, lse, x1, h2, mean2, rstd2, f, r, g,
                               ln1_w, ln1_b, qkv_w, qkv_b, o_w, o_b, ln2_w, ln2_b, fc_w, fc_b,
                               p_w, p_b), tiles


class _Block(torch.autograd.Function):
    """x (B, T, C) fp32 -> the block's output (B, T, C) fp32; gradients of x and of the twelve
    parameters (gain and shift of LN1, weight and bias of each projection, then of LN2, ...;
    None where a layer has no bias)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, spec: _Spec, *params: Tensor | None) -> Tensor:
        ctx.spec = spec
        ctx.one_call = _one_call(x, params)
        if ctx.one_call:  # the same kernels, called from C
            out, kept = block_kernel.forward(x, spec.n_head, spec.eps, spec.activation,
                                             spec.tables, params)
            ctx.save_for_backward(x, kept, *params)
            return out
        ops = block_ops.ops()  # the elementwise work: C kernels or PyTorch's operators
        out, saved, tiles = _forward(x, spec, params, ops, BF16)
        ctx.ops, ctx.tiles = ops, tiles
        ctx.save_for_backward(*saved)
        return out

    @staticmethod
    def backward(ctx: Any, d_out: Tensor) -> tuple[Tensor | None, ...]:
        if ctx.one_call:
            x, kept, *params = ctx.saved_tensors
            dx, grads = block_kernel.backward(d_out, x, kept, ctx.spec.n_head,
                                              ctx.spec.activation, ctx.spec.tables, params)
            return (dx, None, *grads)
        (x, h1, mean1, rstd1, qkv, y, lse, x1, h2, mean2, rstd2, f, r, g, ln1_w, ln1_b, qkv_w,
         qkv_b, o_w, o_b, ln2_w, ln2_b, fc_w, fc_b, p_w, p_b) = ctx.saved_tensors
        spec, ops, tiles = ctx.spec, ctx.ops, ctx.tiles
        B, T, C = d_out.shape
        d_out = d_out.reshape(B * T, C)  # (N, C) fp32: the stream's gradient
        # MLP branch: out = x1 + g Wp^T + bp, g = act(f), f = h2 Wfc^T + bfc
        dg, dp_w, dp_b = _linear_backward(ops.to_bf16([d_out])[0], g, p_w, p_b, tiles)
        df = ops.activation_backward(dg, f, r, spec.activation)
        dh2, dfc_w, dfc_b = _linear_backward(df, h2, fc_w, fc_b, tiles)
        # x1 reaches the output through LN2 and through the residual (d_out); dx1 in bf16 too,
        # for the product below
        dx1, dx1_bf16, dln2_w, dln2_b = ops.layer_norm_backward(dh2, x1, mean2, rstd2, ln2_w,
                                                                ln2_b, d_out, True)
        # attention branch: x1 = x + y Wo^T + bo, y = attention(h1 Wqkv^T + bqkv)
        dy, do_w, do_b = _linear_backward(dx1_bf16, y, o_w, o_b, tiles)
        dqkv = attention_kernel.qkv_backward(qkv.view(B, T, 3 * C), y.view(B, T, C), lse,
                                             dy.view(B, T, C), spec.n_head, spec.tables)
        dh1, dqkv_w, dqkv_b = _linear_backward(dqkv.view(B * T, 3 * C), h1, qkv_w, qkv_b,
                                               tiles)
        dx, _, dln1_w, dln1_b = ops.layer_norm_backward(dh1, x, mean1, rstd1, ln1_w, ln1_b,
                                                        dx1, False)
        if not tiles:  # the products' bf16 gradients of fp32 weights, in the parameters' dtype
            dqkv_w, dqkv_b, do_w, do_b, dfc_w, dfc_b, dp_w, dp_b = ops.to_fp32(
                [dqkv_w, dqkv_b, do_w, do_b, dfc_w, dfc_b, dp_w, dp_b])
        return (dx.view(B, T, C), None, dln1_w, dln1_b, dqkv_w, dqkv_b, do_w, do_b,
                dln2_w, dln2_b, dfc_w, dfc_b, dp_w, dp_b)
