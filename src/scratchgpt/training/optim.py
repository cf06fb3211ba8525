"""Optimizer and learning-rate schedule: plain functions, one of each for every training."""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch
from torch import Tensor, nn

from scratchgpt.errors import CheckpointError, ConfigError
from scratchgpt.training.config import OPTIMIZERS


def _adamw(groups: list[dict[str, Any]], lr: float,
           betas: tuple[float, float]) -> torch.optim.AdamW:
    # The fused (single-kernel) implementation, where this PyTorch offers it, saves one
    # Python-level loop over parameters per step, which matters for small models.
    extra = {"fused": True} if "fused" in inspect.signature(torch.optim.AdamW).parameters else {}
    try:
        return torch.optim.AdamW(groups, lr=lr, betas=betas, **extra)
    except (RuntimeError, TypeError):  # fused unsupported for this device/dtype
        return torch.optim.AdamW(groups, lr=lr, betas=betas)


def hidden_matrices(model: nn.Module) -> list[nn.Parameter]:
    """The weights Muon should own: 2-D weights of the ``nn.Linear`` layers inside the network.

    Excluded, as Muon's authors advise: embeddings (a lookup, not a linear map of the hidden
    state), the output head ``lm_head``/``head`` (tied to ``wte`` in GPT, or an untied readout),
    and every vector (biases, LayerNorm gains).
    """
    embedded = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    out, seen = [], set()
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear) or name.split(".")[-1] in ("lm_head", "head"):
            continue
        w = module.weight
        if w.requires_grad and id(w) not in embedded and id(w) not in seen:
            seen.add(id(w))
            out.append(w)
    return out


def newton_schulz(g: Tensor, coefficients: tuple[float, float, float], steps: int,
                  eps: float, dtype: torch.dtype) -> Tensor:
    """Muon's orthogonalization: the quintic Newton-Schulz iteration that maps a matrix G (m, n)
    to about U V^T (its SVD's singular values pushed towards 1), computed in ``dtype``.

    ``g`` may be a batch (B, m, n) of matrices of one shape: one batched product per line below
    instead of one per matrix, which is what a small model's many small matrices need. The same
    iteration as ``torch.optim.Muon``'s, which always computes in bfloat16 (and, in bfloat16,
    the same numbers: a batched product rounds as a single one does).
    """
    a, b, c = coefficients
    x = g.to(dtype).reshape(-1, *g.shape[-2:])  # (B, m, n); one matrix is a batch of one
    tall = g.size(-2) > g.size(-1)
    if tall:
        x = x.mT  # (B, n, m): the Gram matrices below are the smaller side's
    norm = torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True)  # (B, 1, 1)
    x = x / norm.clamp(min=eps)  # spectral norm <= Frobenius norm <= 1
    for _ in range(steps):
        gram = x @ x.mT  # (B, k, k), k = min(m, n)
        update = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)  # b A + c A^2
        x = torch.baddbmm(x, update, x, beta=a)  # a X + (b A + c A^2) X
    return (x.mT if tall else x).reshape(g.shape)


def orthogonalize(updates: list[Tensor], coefficients: tuple[float, float, float], steps: int,
                  eps: float, dtype: torch.dtype) -> list[Tensor]:
    """:func:`newton_schulz` of every matrix in ``updates``, those of one shape (up to a
    transpose) as one batch; returned in ``updates``' order, in ``dtype``.

    A GPT's blocks repeat the same few shapes, so a model of L layers needs ~4 batched
    iterations instead of 4 L small ones (at cpu-small's size each product is tens of
    microseconds, and the calls, not the arithmetic, were most of Muon's step).
    """
    groups: dict[tuple[int, int], list[int]] = {}
    for i, u in enumerate(updates):
        groups.setdefault((min(u.shape), max(u.shape)), []).append(i)
    out: list[Tensor] = [updates[0]] * len(updates)
    for members in groups.values():
        wide = [updates[i].mT if updates[i].size(0) > updates[i].size(1) else updates[i]
                for i in members]  # each (k, n), k <= n
        batch = newton_schulz(torch.stack(wide), coefficients, steps, eps, dtype)  # (B, k, n)
        for i, x in zip(members, batch.unbind(0), strict=True):
            out[i] = x.mT if updates[i].size(0) > updates[i].size(1) else x
    return out


class Muon(torch.optim.Muon):
    """``torch.optim.Muon`` whose Newton-Schulz iteration runs in ``ns_dtype``, batched.

    torch's Muon always orthogonalizes in bfloat16, which a CPU without bf16 instructions (AVX2)
    emulates: there it costs far more than the training step itself (16 matrices of the
    cpu-small model: ~800 ms in bf16 against ~43 ms in fp32, one thread). With
    ``ns_dtype=torch.float32`` the update is the same up to rounding (closer to the exact
    iteration); with bfloat16 it is torch's own step, bit for bit. torch updates one matrix at
    a time; here the matrices of one shape share each product (:func:`orthogonalize`), and the
    momentum and weight decay are one call for all (``_foreach``). The state (one momentum
    buffer per matrix) is torch's, so a run may resume in either precision.
    """

    def __init__(self, params: Any, ns_dtype: torch.dtype = torch.bfloat16, **kwargs: Any):
        super().__init__(params, **kwargs)
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                self._update(params, group)
        return None

    def _update(self, params: list[Tensor], group: dict[str, Any]) -> None:
        """torch's Muon step for a group's matrices, as one batch per shape."""
        momentum, lr = group["momentum"], group["lr"]
        grads = [p.grad for p in params]
        for p in params:  # (setdefault would allocate a discarded zero tensor every step)
            if "momentum_buffer" not in self.state[p]:
                self.state[p]["momentum_buffer"] = torch.zeros_like(p.grad)
        bufs = [self.state[p]["momentum_buffer"] for p in params]
        torch._foreach_lerp_(bufs, grads, 1 - momentum)  # momentum: an average of gradients
        updates = torch._foreach_lerp(grads, bufs, momentum) if group["nesterov"] else bufs
        updates = orthogonalize(updates, group["ns_coefficients"], group["ns_steps"],
                                group["eps"], self.ns_dtype)
        torch._foreach_mul_(params, 1 - lr * group["weight_decay"])  # decoupled weight decay
        for p, update in zip(params, updates, strict=True):
            p.add_(update.to(p.dtype), alpha=-lr * _muon_lr_ratio(group["adjust_lr_fn"], p.shape))


def _muon_lr_ratio(adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """Muon's rate multiplier for a matrix of ``shape`` (as ``torch.optim.Muon``):
    ``match_rms_adamw`` gives its update the RMS of an AdamW update (0.2 sqrt(max side))."""
    rows, cols = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return math.sqrt(max(1, rows / cols))
    return 0.2 * math.sqrt(max(rows, cols)) if adjust_lr_fn == "match_rms_adamw" else 1.0


class ChainedOptimizer:
    """Several optimizers over disjoint parameters, driven as one.

    ``param_groups`` is the concatenation of the members' groups (the same dict objects, so a
    schedule that writes ``group["lr"]`` reaches every member).
    """

    def __init__(self, *optimizers: torch.optim.Optimizer):
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        # Looked up each time: load_state_dict replaces a member's group dicts.
        return [g for o in self.optimizers for g in o.param_groups]

    def step(self) -> None:
        for o in self.optimizers:
            o.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"chained": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        states = state.get("chained")
        if states is None or len(states) != len(self.optimizers):
            raise CheckpointError("the checkpoint's optimizer state is for another --optimizer; "
                            "resume with the optimizer the run was started with")
        for o, s in zip(self.optimizers, states, strict=True):
            o.load_state_dict(s)


def make_optimizer(model: nn.Module, lr: float, weight_decay: float,
                   betas: tuple[float, float], kind: str = "adamw",
                   muon_lr_scale: float = 1.0, muon_dtype: str = "bf16",
                   embed_lr_scale: float = 1.0) -> torch.optim.Optimizer | ChainedOptimizer:
    """The optimizer for ``model``: weight decay on matrices (>= 2 dims) only.

    ``kind="adamw"``: AdamW on everything (biases and LayerNorms undecayed).
    ``kind="muon"``: Muon (momentum, then the update orthogonalized by a Newton-Schulz
    iteration) on the hidden matrices (:func:`hidden_matrices`), AdamW on the rest. Muon's
    step is rescaled to AdamW's update size (``adjust_lr_fn="match_rms_adamw"``), so one
    learning rate and schedule serve both; ``muon_lr_scale`` multiplies the Muon groups' rate;
    ``muon_dtype`` (bf16 or fp32) is the precision of its Newton-Schulz iteration (:class:`Muon`).
    ``embed_lr_scale`` multiplies the rate of the embedding tables (``nn.Embedding`` weights: the
    token table, tied to the head where the model ties them, learned positions, value
    embeddings), which then form a group of their own (at 1.0 they share the matrices' group,
    so optimizer states saved before the option load as they were).
    Every group carries ``lr_scale``: a schedule sets ``group["lr"] = lr * group["lr_scale"]``.
    """
    if kind not in OPTIMIZERS:
        raise ConfigError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {kind!r}")
    params = [p for p in model.parameters() if p.requires_grad]
    muon_params = hidden_matrices(model) if kind == "muon" else []
    in_muon = {id(p) for p in muon_params}
    rest = [p for p in params if id(p) not in in_muon]
    tables = ({id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
              if embed_lr_scale != 1.0 else set())
    groups = [{"params": [p for p in rest if p.dim() >= 2 and id(p) not in tables],
               "weight_decay": weight_decay, "lr_scale": 1.0},
              {"params": [p for p in rest if id(p) in tables], "weight_decay": weight_decay,
               "lr_scale": embed_lr_scale, "lr": lr * embed_lr_scale},
              {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0,
               "lr_scale": 1.0}]
    adamw = _adamw([g for g in groups if g["params"]], lr, betas)
    if not muon_params:
        return adamw
    muon = Muon([{"params": muon_params, "lr_scale": muon_lr_scale}],
                ns_dtype={"bf16": torch.bfloat16, "fp32": torch.float32}[muon_dtype],
                lr=lr * muon_lr_scale, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw")
    return ChainedOptimizer(adamw, muon)


def set_lr(opt: torch.optim.Optimizer | ChainedOptimizer, lr: float) -> None:
    """Set every group's rate to ``lr`` times its ``lr_scale``."""
    for group in opt.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


def lr_at(progress_iters: int, warmup: int, lr: float, min_lr: float,
          decay_fraction: float, schedule: str = "cosine", wsd_decay: float = 0.4) -> float:
    """Linear warmup for ``warmup`` updates, then the ``schedule`` from ``lr`` to ``min_lr``.

    ``decay_fraction`` in [0, 1] is how far through the run we are (by updates, or by wall
    time under a time budget). ``cosine``: half a cosine over the whole run. ``wsd``
    (warmup-stable-decay): ``lr`` until the last ``wsd_decay`` of the run, then a straight line
    down to ``min_lr`` (so a run can be extended before its decay, and the decay is short).

    >>> lr_at(500, 100, 1.0, 0.0, 0.5, "wsd", wsd_decay=0.4)  # stable
    1.0
    >>> round(lr_at(900, 100, 1.0, 0.0, 0.8, "wsd", wsd_decay=0.4), 6)  # half-way down
    0.5
    """
    if progress_iters < warmup:
        return lr * (progress_iters + 1) / (warmup + 1)
    d = min(max(decay_fraction, 0.0), 1.0)
    if schedule == "wsd":
        down = min(max((d - (1.0 - wsd_decay)) / wsd_decay, 0.0), 1.0)  # 0 until the decay
        return lr - down * (lr - min_lr)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * d)) * (lr - min_lr)
