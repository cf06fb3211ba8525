"""The language-model training loop.

One function, :func:`train`, does the whole job: batches from a prepared dataset, AdamW (or
Muon + AdamW) with warmup + cosine, gradient accumulation and clipping, bf16 autocast, periodic
evaluation, ``metrics.csv`` + ``loss.png``, ``last.pt``/``best.pt`` checkpoints, an optional
wall-clock budget, exact resume, a clean save on Ctrl-C, and data-parallel processes
(``training/distributed.py``).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scratchgpt.checkpoints import load_checkpoint, save_checkpoint
from scratchgpt.data.dataset import TokenDataset
from scratchgpt.errors import CheckpointError, ConfigError
from scratchgpt.models import build_model, make_config
from scratchgpt.training import distributed
from scratchgpt.training.config import TrainConfig
from scratchgpt.training.optim import lm_loss, lr_at, make_optimizer, set_lr

METRIC_FIELDS = ["step", "tokens", "elapsed_s", "lr", "loss", "train_loss", "val_loss"]
RUN_FILES = ("last.pt", "best.pt", "config.json", "metrics.csv")


@dataclass
class TrainResult:
    step: int
    train_loss: float
    val_loss: float
    best_val_loss: float
    elapsed_s: float
    tokens_per_s: float
    interrupted: bool
    out_dir: Path


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda was asked for, but no CUDA GPU is available")
    return torch.device(name)


def bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    # bf16 matmuls are fast on CPUs with AMX or AVX512-BF16, slow emulation elsewhere.
    return torch.backends.cpu.get_cpu_capability() in ("AVX512", "AMX") and \
        torch.ops.mkldnn._is_mkldnn_bf16_supported()


def resolve_dtype(name: str, device: torch.device) -> str:
    """'auto' picks bf16 autocast wherever the hardware runs it fast (measured 1.5x per step
    on an AVX512-BF16 CPU even for the smallest preset), else fp32."""
    if name != "auto":
        if name == "bf16" and not bf16_supported(device):
            raise ConfigError(f"bf16 is not supported on this {device.type}")
        return name
    return "bf16" if bf16_supported(device) else "fp32"


def autocast(device: torch.device, dtype: str):
    if dtype == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def estimate_loss(model: nn.Module, data: TokenDataset, split: str, iters: int,
                  batch_size: int, block_size: int, seed: int, device: torch.device,
                  dtype: str) -> float:
    """Mean loss over ``iters`` random batches (a fixed seed, so estimates are comparable)."""
    was_training = model.training
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    total = 0.0
    for _ in range(iters):
        x, y = data.get_batch(split, batch_size, block_size, gen)
        with autocast(device, dtype):
            total += lm_loss(model(x.to(device)), y.to(device)).item()
    model.train(was_training)
    return total / iters


@torch.no_grad()
def full_split_loss(model: nn.Module, data: TokenDataset, split: str, block_size: int,
                    device: torch.device, batch_size: int = 64,
                    max_tokens: int | None = None) -> float:
    """Exact fp32 loss over every non-overlapping window of ``split`` (or its first
    ``max_tokens`` tokens' worth of windows): the number reported as *the* val loss."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for x, y in data.sequential_batches(split, batch_size, block_size):
        logits = model(x.to(device))
        total += lm_loss(logits, y.to(device)).item() * y.numel()
        count += y.numel()
        if max_tokens is not None and count >= max_tokens:
            break
    model.train(was_training)
    return total / count


def plot_losses(metrics_csv: Path, out_png: Path, title: str = "") -> None:
    """loss.png: training loss per logged step, and periodic train/val estimates."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(csv.DictReader(metrics_csv.open()))
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    pts = [(int(r["step"]), float(r["loss"])) for r in rows if r["loss"]]
    if pts:
        ax.plot(*zip(*pts, strict=True), lw=0.8, alpha=0.6, label="train (batch)")
    for key, style in (("train_loss", "o-"), ("val_loss", "s-")):
        pts = [(int(r["step"]), float(r[key])) for r in rows if r[key]]
        if pts:
            ax.plot(*zip(*pts, strict=True), style, ms=3.5, label=key.replace("_", " "))
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title or metrics_csv.parent.name)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    tmp = out_png.with_name(".loss.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(out_png)


class _Metrics:
    """Append-only metrics.csv writer (rows flushed immediately, so a crash loses nothing)."""

    def __init__(self, path: Path, resume_step: int | None):
        self.path = path
        rows = []
        if resume_step is not None and path.is_file():
            # Keep only rows up to the resumed step, so a resumed run's file matches an
            # uninterrupted one.
            rows = [r for r in csv.DictReader(path.open()) if int(r["step"]) <= resume_step]
        self.f = path.open("w", newline="")
        self.w = csv.DictWriter(self.f, fieldnames=METRIC_FIELDS)
        self.w.writeheader()
        self.w.writerows(rows)
        self.f.flush()

    def row(self, **values: Any) -> None:
        self.w.writerow({k: ("" if values.get(k) is None else values[k]) for k in METRIC_FIELDS})
        self.f.flush()

    def close(self) -> None:
        self.f.close()


def check_out_dir(out: Path, resume: bool, overwrite: bool) -> None:
    """Refuse to mix two runs in one directory unless asked to resume or overwrite."""
    holds_run = out.is_dir() and any((out / f).exists() for f in RUN_FILES)
    if resume:
        if not (out / "last.pt").is_file():
            raise CheckpointError(f"cannot resume: {out / 'last.pt'} does not exist")
        return
    if holds_run and not overwrite:
        raise CheckpointError(f"{out} already holds a run; pass --resume to continue it or "
                        "--overwrite to replace it")
    if holds_run:
        for f in (*RUN_FILES, "loss.png"):
            (out / f).unlink(missing_ok=True)


def preflight(cfg: TrainConfig, model_config: dict[str, Any], data: TokenDataset, out: Path,
              resume: bool, overwrite: bool, clear: bool = True,
              ) -> tuple[TrainConfig, dict[str, Any], dict[str, Any] | None]:
    """Every check of the user's input that can fail, before any training starts.

    Returns the settings to train with (on ``resume``, the run's own model shape, model type
    and optimizer) and the checkpoint to resume from. ``clear=False`` checks ``out`` without
    deleting a run that ``overwrite`` replaces.
    """
    if clear or not overwrite:
        check_out_dir(out, resume, overwrite)
    resolve_device(cfg.device)
    if cfg.nproc > 1 and cfg.device != "cpu" and torch.cuda.is_available() \
            and cfg.nproc > torch.cuda.device_count():
        raise ConfigError(f"--nproc {cfg.nproc} needs {cfg.nproc} GPUs; this machine has "
                        f"{torch.cuda.device_count()} (use --device cpu to run them on the CPU)")
    model_config = {**model_config, "vocab_size": data.vocab_size}
    state = None
    if resume:
        state = load_checkpoint(out / "last.pt")
        model_config = dict(state["model_config"])  # the run's shape cannot change on resume
        if state["model_type"] != cfg.model:  # nor its type (--model need not be repeated)
            cfg = dataclasses.replace(cfg, model=state["model_type"])
        # nor the optimizer, whose state is in the checkpoint (older runs: always AdamW)
        saved_opt = state.get("train_config", {}).get("optimizer", "adamw")
        if saved_opt != cfg.optimizer:
            cfg = dataclasses.replace(cfg, optimizer=saved_opt)
    make_config(cfg.model, model_config)  # validates the shape (e.g. n_embd % n_head)
    data.check_block_size(int(model_config.get("block_size", 256)))
    return cfg, model_config, state


def train(cfg: TrainConfig, model_config: dict[str, Any], data: TokenDataset, out: str | Path,
          resume: bool = False, overwrite: bool = False, progress: bool = True,
          extra_config: dict[str, Any] | None = None) -> TrainResult:
    """Train ``cfg.model`` with hyperparameters ``model_config`` on ``data``; write into ``out``.

    Returns the final figures. Ctrl-C saves ``last.pt`` and returns with ``interrupted=True``.
    Inside a ``torch.distributed`` process group (``--nproc``, torchrun) every process runs this
    function: each trains on its share of every batch, DDP averages the gradients, all evaluate
    the same batches, and rank 0 alone writes files.
    """
    out = Path(out)
    info = distributed.current()
    cfg, model_config, state = preflight(cfg, model_config, data, out, resume, overwrite,
                                         clear=info.is_main)
    if info.enabled:
        dist.barrier()  # nobody reads ``out`` while rank 0 may still be clearing it
    device = resolve_device(cfg.device)
    if device.type == "cuda" and info.enabled:
        device = torch.device("cuda", info.local_rank)
    block_size = int(model_config.get("block_size", 256))

    threads = cfg.threads or (max(1, (os.cpu_count() or 1) // info.world_size)
                              if info.enabled and device.type == "cpu" else 0)
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(cfg.seed)  # the same initial weights in every process
    model = build_model(cfg.model, model_config).to(device)
    if info.enabled:
        torch.manual_seed(cfg.seed + info.rank)  # but each its own dropout masks
    dtype = resolve_dtype(cfg.dtype, device)
    opt = make_optimizer(model, cfg.learning_rate, cfg.weight_decay, (cfg.beta1, cfg.beta2),
                         cfg.optimizer, cfg.muon_lr_scale)
    # One batch stream for the whole group: every process draws the same global batch and
    # keeps its own rows, so one saved generator state resumes all of them.
    batch_gen = torch.Generator().manual_seed(cfg.seed)
    step, elapsed, best_val, tokens = 0, 0.0, math.inf, 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        batch_gen.set_state(state["rng"]["batch"])
        rngs = state["rng"]
        torch_states = rngs.get("torch_per_rank") or [rngs["torch"]]
        if len(torch_states) == info.world_size:  # else a new group size: fresh dropout seeds
            torch.set_rng_state(torch_states[info.rank])
            # On a GPU dropout draws from the device's generator, so it is saved too.
            cuda_states = rngs.get("cuda_per_rank") or [rngs.get("cuda")] * info.world_size
            if device.type == "cuda" and cuda_states[info.rank] is not None:
                torch.cuda.set_rng_state(cuda_states[info.rank], device)
        step, elapsed = state["step"], state["elapsed_s"]
        best_val, tokens = state["best_val_loss"], state["tokens"]

    resolved = {"train": cfg.to_dict(), "model": {"type": cfg.model, **model_config},
                "dataset": str(data.directory), "dtype_resolved": dtype,
                "device_resolved": str(device), "world_size": info.world_size,
                **(extra_config or {})}
    tokenizer = data.tokenizer()
    tokenizer_state = tokenizer.state()
    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(resolved, indent=1))
        tokenizer.save(out)

    ddp = nn.parallel.DistributedDataParallel(model) if info.enabled else model
    fwd = torch.compile(ddp) if cfg.compile else ddp
    budget = cfg.time_budget_s
    tokens_per_step = cfg.batch_size * cfg.grad_accum * block_size * info.world_size
    metrics = _Metrics(out / "metrics.csv", step if resume else None) if info.is_main else None

    def checkpoint(val_loss: float | None, best: bool = False) -> None:
        """Write last.pt (and best.pt, from the same serialization, if ``best``)."""
        rng = {"batch": batch_gen.get_state(), "torch": torch.get_rng_state(),
               "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}
        if info.enabled:  # called by every process: each contributes its dropout RNG
            states: list[Any] = [None] * info.world_size
            dist.all_gather_object(states, (rng["torch"], rng["cuda"]))
            rng["torch_per_rank"] = [cpu for cpu, _ in states]
            rng["cuda_per_rank"] = [cuda for _, cuda in states]
        if not info.is_main:
            return
        save_checkpoint(out / "last.pt", {
            "model_type": cfg.model, "model_config": model_config, "model": model.state_dict(),
            "optimizer": opt.state_dict(), "step": step, "elapsed_s": elapsed, "tokens": tokens,
            "best_val_loss": best_val, "val_loss": val_loss, "train_config": cfg.to_dict(),
            "tokenizer": tokenizer_state, "dataset": str(data.directory), "rng": rng,
            "world_size": info.world_size,
        }, copies=[out / "best.pt"] if best else [])

    def save_evaluated(val_loss: float) -> None:
        """last.pt after an evaluation, and best.pt too if ``val_loss`` is a new best."""
        nonlocal best_val
        improved = val_loss < best_val
        best_val = min(best_val, val_loss)
        checkpoint(val_loss, best=improved)

    def row(**values: Any) -> None:
        if metrics is not None:
            metrics.row(**values)

    def evaluate(iters: int) -> tuple[float, float]:
        # Every process evaluates the same batches with its own (identical) copy: no
        # collectives, and the same numbers everywhere, so all agree on the best checkpoint.
        args = (cfg.batch_size, block_size, cfg.seed + 1, device, dtype)
        return (estimate_loss(model, data, "train", iters, *args),
                estimate_loss(model, data, "val", iters, *args))

    bar = None
    if progress and info.is_main:
        from tqdm.auto import tqdm

        if budget:
            bar = tqdm(total=round(budget), initial=min(round(elapsed), round(budget)),
                       unit="s", dynamic_ncols=True,
                       bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f}s [{remaining} left{postfix}]")
        else:
            bar = tqdm(total=cfg.max_iters, initial=step, unit="step", dynamic_ncols=True)

    interrupted = False
    model.train()
    last_loss = float("nan")
    t_seg = time.perf_counter()  # wall-clock start of the current timing segment
    elapsed0, tokens0 = elapsed, tokens
    stop = distributed.StopFlag(info) if info.enabled else contextlib.nullcontext()
    try:
        with stop:
            while step < cfg.max_iters and not (budget and elapsed >= budget):
                frac = elapsed / budget if budget else step / cfg.decay_iters
                lr = lr_at(step, cfg.warmup_iters, cfg.learning_rate, cfg.min_lr, frac)
                set_lr(opt, lr)
                for micro in range(cfg.grad_accum):
                    x, y = data.get_batch("train", cfg.batch_size, block_size, batch_gen,
                                          shard=(info.rank, info.world_size))
                    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                    # DDP averages gradients on the last micro-step only.
                    sync = micro == cfg.grad_accum - 1 or not info.enabled
                    with autocast(device, dtype), (contextlib.nullcontext() if sync
                                                   else ddp.no_sync()):
                        loss = lm_loss(fwd(x), y) / cfg.grad_accum
                        loss.backward()
                if cfg.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                opt.step()
                opt.zero_grad(set_to_none=True)
                step += 1
                tokens += tokens_per_step
                elapsed = elapsed0 + (time.perf_counter() - t_seg)
                if info.enabled:  # one clock and one Ctrl-C for the whole group
                    elapsed, interrupted = stop.agree(elapsed, device)
                    if interrupted:
                        break

                if step % cfg.log_interval == 0 or step == 1:
                    last_loss = loss.item() * cfg.grad_accum
                    row(step=step, tokens=tokens, elapsed_s=round(elapsed, 3),
                        lr=f"{lr:.3e}", loss=f"{last_loss:.4f}")
                if step % cfg.eval_interval == 0:
                    tr, va = evaluate(cfg.eval_iters)
                    elapsed = elapsed0 + (time.perf_counter() - t_seg)
                    row(step=step, tokens=tokens, elapsed_s=round(elapsed, 3),
                        lr=f"{lr:.3e}", train_loss=f"{tr:.4f}", val_loss=f"{va:.4f}")
                    save_evaluated(va)
                    if bar is not None:
                        bar.write(f"step {step}: train {tr:.4f}, val {va:.4f}")
                if bar is not None:
                    tps = (tokens - tokens0) / max(elapsed - elapsed0, 1e-9)
                    bar.set_postfix(step=step, loss=f"{last_loss:.3f}", tok_s=f"{tps:,.0f}",
                                    refresh=False)
                    if budget:
                        bar.n = min(elapsed, budget)
                        bar.refresh()
                    else:
                        bar.update(1)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if bar is not None:
            bar.close()

    train_time = elapsed - elapsed0
    tokens_per_s = (tokens - tokens0) / train_time if train_time > 0 else 0.0
    if interrupted:
        checkpoint(None)  # atomic: the previous files stay good until renamed
        tr = va = math.nan
    else:
        # Final evaluation: periodic-style estimate on train, exact full-split loss on val.
        tr, _ = evaluate(cfg.eval_iters)
        va = full_split_loss(model, data, "val", block_size, device)
        row(step=step, tokens=tokens, elapsed_s=round(elapsed, 3), train_loss=f"{tr:.4f}",
            val_loss=f"{va:.4f}")
        save_evaluated(va)
    if metrics is not None:
        metrics.close()
        plot_losses(out / "metrics.csv", out / "loss.png")
    return TrainResult(step, tr, va, best_val, elapsed, tokens_per_s, interrupted, out)
