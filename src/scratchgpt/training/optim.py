"""Optimizer and learning-rate schedule: plain functions, one of each for every training."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from scratchgpt.errors import CheckpointError, ConfigError
from scratchgpt.training.adamw import AdamW
from scratchgpt.training.config import OPTIMIZERS
from scratchgpt.training.muon import Muon
from scratchgpt.training.optimizer import Optimizer
from scratchgpt.validation import FLAGS, named


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


def muon_matrices(model: nn.Module, options: Mapping[str, str] = FLAGS) -> list[nn.Parameter]:
    """:func:`hidden_matrices`, refused when there are none: Muon would train nothing and
    the run would silently be AdamW's (``options`` name the setting: validation.FLAGS, or
    KEYWORDS from Python)."""
    found = hidden_matrices(model)
    if not found:
        raise ConfigError(f"{named(options, 'optimizer', 'muon')} has nothing to train in this "
                          f"{type(model).__name__}: it takes the trainable weights of the "
                          "nn.Linear layers inside the network (not embeddings, recurrent "
                          "cells, the output head or LoRA's factors); use "
                          f"{named(options, 'optimizer', 'adamw')}")
    return found


class ChainedOptimizer:
    """Several optimizers over disjoint parameters, driven as one.

    ``param_groups`` is the concatenation of the members' groups (the same dict objects, so a
    schedule that writes ``group["lr"]`` reaches every member).
    """

    def __init__(self, *optimizers: Optimizer):
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
                   embed_lr_scale: float = 1.0,
                   options: Mapping[str, str] = FLAGS) -> Optimizer | ChainedOptimizer:
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
    ``options`` name the settings in a refusal (validation.FLAGS, or KEYWORDS from Python).
    Every group carries ``lr_scale``: a schedule sets ``group["lr"] = lr * group["lr_scale"]``.
    """
    if kind not in OPTIMIZERS:
        raise ConfigError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {kind!r}")
    params = [p for p in model.parameters() if p.requires_grad]
    muon_params = muon_matrices(model, options) if kind == "muon" else []
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
    adamw = AdamW([g for g in groups if g["params"]], lr=lr, betas=betas)
    if not muon_params:
        return adamw
    muon = Muon([{"params": muon_params, "lr_scale": muon_lr_scale}],
                ns_dtype={"bf16": torch.bfloat16, "fp32": torch.float32}[muon_dtype],
                lr=lr * muon_lr_scale, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw")
    return ChainedOptimizer(adamw, muon)


def clip_grad_norm(params: Iterable[Tensor], max_norm: float) -> Tensor:
    """``torch.nn.utils.clip_grad_norm_``, the same gradients bit for bit, without its pass over
    every gradient when they need no clipping. Returns the total norm before clipping.

    PyTorch multiplies every gradient by min(max_norm / (norm + 1e-6), 1) unconditionally, so as
    not to wait for an accelerator to report the norm. On a CPU the norm is already known, and a
    factor of 1 leaves the gradients as they are: that multiply is skipped. (Elsewhere this is
    PyTorch's function.)

    >>> p = torch.nn.Parameter(torch.ones(4))
    >>> p.grad = torch.full((4,), 0.25)  # norm 0.5: left as it is
    >>> float(clip_grad_norm([p], 1.0)), p.grad.tolist()
    (0.5, [0.25, 0.25, 0.25, 0.25])
    >>> p.grad = torch.full((4,), 1.0)  # norm 2: scaled to norm 1 (less 1e-6, as PyTorch)
    >>> float(clip_grad_norm([p], 1.0)), [round(g, 4) for g in p.grad.tolist()]
    (2.0, [0.5, 0.5, 0.5, 0.5])
    """
    params = [p for p in params if p.grad is not None]
    if not params:
        return torch.tensor(0.0)
    grads = [p.grad for p in params]
    if all(g.device.type == "cpu" and g.dtype == grads[0].dtype for g in grads):
        # get_total_norm's own computation for one group of tensors, without its grouping and
        # per-tensor moves (a tenth of a millisecond a step at nanoGPT's recipe shape)
        total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
    else:
        total = torch.nn.utils.get_total_norm(grads)
    if total.device.type != "cpu":  # PyTorch's way: no waiting for the accelerator's norm
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return total
    factor = max_norm / (total + 1e-6)  # PyTorch's factor, computed as PyTorch does
    if not factor >= 1.0:  # (a NaN norm too); at 1 or more, PyTorch clamps it to 1: no change
        torch._foreach_mul_(grads, factor)
    return total


def load_state_keeping_settings(opt: Optimizer | ChainedOptimizer,
                                state: dict[str, Any]) -> None:
    """Load a saved optimizer ``state`` (moments, step counts) into ``opt``, keeping ``opt``'s
    own group settings (betas, weight decay, rate scales) rather than the saved ones.

    ``load_state_dict`` takes each group's settings from the save as well, so a run resumed
    with a new ``--beta2`` or ``--weight-decay`` would silently train with the old ones. What
    the run was given wins; only the learned state comes from the checkpoint.
    """
    settings = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    opt.load_state_dict(state)
    for group, own in zip(opt.param_groups, settings, strict=True):
        group.update(own)


def set_lr(opt: Optimizer | ChainedOptimizer, lr: float) -> None:
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


def warmup_reached(updates: int, warmup: int) -> float:
    """The rate of the last of ``updates`` updates that all fall inside a ``warmup``, as a
    fraction of the peak rate (:func:`lr_at`'s): what a run that ends inside its warmup
    reached.

    >>> round(warmup_reached(26, 100), 3)  # 26 updates of a 100-update warmup
    0.257
    """
    return lr_at(updates - 1, warmup, 1.0, 1.0, 0.0)
