"""The training core: one loop for every training in scratchgpt.

:func:`train_step` is one optimizer update and fits on a screen; :class:`Trainer` runs it in a
loop and keeps the books around it: the schedule, evaluation, ``metrics.csv`` and ``loss.png``,
checkpoints (``best.pt`` then ``last.pt``), exact resume, a wall-clock budget, a clean stop on
Ctrl-C or SIGTERM, and data-parallel processes (``training/distributed.py``). What is trained
(the batches, the loss, the evaluation) comes from a task (``training/task.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from scratchgpt import figure_helper
from scratchgpt.checkpoints.io import Checkpoint
from scratchgpt.checkpoints.rundir import RunDir, run_config
from scratchgpt.errors import CheckpointError, ConfigError, Terminated
from scratchgpt.models import ModelConfig, build_model, model_type
from scratchgpt.training import distributed
from scratchgpt.training.allocator import keep_freed_memory
from scratchgpt.training.config import TrainConfig
from scratchgpt.training.curriculum import batch_rows, window_length
from scratchgpt.training.metrics import MetricsLog
from scratchgpt.training.optim import (
    clip_grad_norm,
    load_state_keeping_settings,
    lr_at,
    make_optimizer,
    set_lr,
    warmup_reached,
)
from scratchgpt.training.precision import (
    autocast,
    resolve_device,
    resolve_dtype,
    resolve_muon_dtype,
)
from scratchgpt.training.progress import Progress
from scratchgpt.training.state import TrainState, capture_rng, restore_rng
from scratchgpt.training.stopping import StopFlag
from scratchgpt.training.task import Batch, EvalSetting, LanguageModelTask, Task
from scratchgpt.validation import FLAGS, flag_of, give, named, offset_seed

LossFn = Callable[[nn.Module, Batch], Tensor]


@dataclass
class TrainResult:
    """How a run ended. ``metrics`` holds the task's final figures; ``exit_code`` is 0, or 130 /
    143 when Ctrl-C / SIGTERM stopped it (``interrupted``)."""

    step: int
    train_loss: float
    val_loss: float
    best_val_loss: float
    elapsed_s: float
    tokens_per_s: float
    interrupted: bool
    out_dir: Path | None
    metrics: dict[str, float] = field(default_factory=dict)
    exit_code: int = 0
    report: str = ""  # the task's words on its final figures

    def raise_if_stopped(self) -> None:
        """For a caller with no run directory to keep (an experiment, a benchmark): a run a
        signal stopped raises it again, so the command ends with its one line and exit code
        (130 / 143) instead of reading final figures that were never made."""
        if self.interrupted:
            raise Terminated if self.exit_code == 143 else KeyboardInterrupt


def train_step(model: nn.Module, forward: nn.Module, opt: Any, loss_fn: LossFn,
               cfg: TrainConfig, next_batch: Callable[[], Batch], device: torch.device,
               dtype: str, params: Sequence[Tensor] | None = None) -> Tensor:
    """One optimizer update over ``cfg.grad_accum`` micro-batches; returns the last one's loss.

    ``forward`` is the module to call: ``model`` itself, or its DDP / compiled wrapper;
    ``loss_fn(forward, batch)`` is the task's loss. ``params``: ``model``'s parameters in its
    order, listed once by a caller that steps many times (walking the modules for them costs
    tens of microseconds a step); by default they are walked here."""
    for micro in range(cfg.grad_accum):
        batch = tuple(t.to(device, non_blocking=True) for t in next_batch())
        # Under DDP, gradients are averaged across processes on the last micro-step only; the
        # earlier ones just accumulate locally (no_sync).
        last = micro == cfg.grad_accum - 1
        with autocast(device, dtype), _sync_unless(forward, not last):
            loss = loss_fn(forward, batch)
            # Divided so the accumulated gradient is the mean over all micro-batches.
            (loss / cfg.grad_accum).backward()
    if cfg.grad_clip > 0:
        # An unusual batch cannot throw the weights far: the update's norm is bounded.
        clip_grad_norm(model.parameters() if params is None else params, cfg.grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)  # frees the gradients' memory until the next backward
    return loss.detach()


def _sync_unless(forward: nn.Module, skip: bool) -> Any:
    if skip and isinstance(forward, nn.parallel.DistributedDataParallel):
        return forward.no_sync()
    return contextlib.nullcontext()


class Trainer:
    """Trains a model of ``config`` on ``task`` with ``cfg``, writing into ``run`` (or nothing,
    when ``run`` is None: experiments and benchmarks).

    ``resume``: the run's ``last.pt`` to continue exactly. ``init_weights``: a state dict to
    start from (e.g. a pretrained model), loaded before training. Inside a
    ``torch.distributed`` process group every process runs a Trainer: each trains on its share
    of every batch, DDP averages the gradients, and rank 0 alone writes files.
    """

    def __init__(self, cfg: TrainConfig, config: ModelConfig, task: Task,
                 run: RunDir | None = None, resume: Checkpoint | None = None,
                 init_weights: dict[str, Tensor] | None = None, progress: bool = True,
                 extra_config: dict[str, Any] | None = None):
        self.cfg, self.config, self.task, self.run = cfg, config, task, run
        # how refusals name settings: the command's flags, or the Python API's keywords
        self.options = run.options if run is not None else FLAGS
        _check_curriculum(cfg, task)
        self.info = distributed.current()
        self.device = resolve_device(cfg.device, self.options)
        if self.device.type == "cuda" and self.info.enabled:
            self.device = torch.device("cuda", self.info.local_rank)
        self.dtype = resolve_dtype(cfg.dtype, self.device)
        self._set_threads()
        keep_freed_memory()  # every step reuses the last one's memory (training/allocator.py)
        torch.manual_seed(cfg.seed)  # the same initial weights in every process
        self.model = build_model(config).to(self.device)
        if init_weights is not None:
            self.model.load_state_dict(init_weights)
        if self.info.enabled:
            # but each its own dropout masks
            torch.manual_seed(offset_seed(cfg.seed, self.info.rank))
        self.opt = make_optimizer(self.model, cfg.learning_rate, cfg.weight_decay,
                                  (cfg.beta1, cfg.beta2), cfg.optimizer, cfg.muon_lr_scale,
                                  resolve_muon_dtype(cfg.muon_dtype, self.device),
                                  cfg.embed_lr_scale, self.options)
        # One batch stream for the whole group: every process draws the same global batch and
        # keeps its own rows, so one saved generator state resumes all of them.
        self.batch_gen = torch.Generator().manual_seed(cfg.seed)
        self.state = TrainState()
        self.run_id = uuid.uuid4().hex
        if resume is not None:
            self._restore(resume)
        self.forward = self._wrap(self.model)
        self.progress_enabled = progress and self.info.is_main
        # progress drawn on a terminal, where someone watches: the final evaluation's bar and
        # the start-of-run advice (a log gets the summary alone)
        self.at_terminal = self.progress_enabled and sys.stderr.isatty()
        self.setting = EvalSetting(self.device, self.dtype, cfg.batch_size,
                                   offset_seed(cfg.seed, 1), self.at_terminal)
        self.extra_config = extra_config or {}
        self.metrics: MetricsLog | None = None
        self._last_loss = math.nan  # the most recent logged training loss
        self._last_check_s = 0.0  # the time from the budget's last check but one to its last

    def _set_threads(self) -> None:
        threads = self.cfg.threads
        if not threads and self.info.enabled and self.device.type == "cpu":
            threads = max(1, (os.cpu_count() or 1) // self.info.world_size)
        if threads:
            torch.set_num_threads(threads)

    def _restore(self, ckpt: Checkpoint) -> None:
        try:
            self.model.load_state_dict(ckpt.model)
            load_state_keeping_settings(self.opt, ckpt.optimizer)
        except (RuntimeError, ValueError, KeyError, TypeError) as e:
            reason = " ".join(str(e).split())[:200]
            raise CheckpointError(f"{ckpt.path}: its model or optimizer state does not fit "
                                  f"the run's settings ({reason})") from None
        self.state = dataclasses.replace(ckpt.state)
        restore_rng(self.state.rng, self.batch_gen, self.info.rank, self.info.world_size,
                    self.device)
        self.task.load_state_dict(self.state.task)
        self.run_id = ckpt.run_id or self.run_id

    def _wrap(self, model: nn.Module) -> nn.Module:
        forward = nn.parallel.DistributedDataParallel(model) if self.info.enabled else model
        return torch.compile(forward) if self.cfg.compile else forward

    # ---- the loop

    def fit(self) -> TrainResult:
        """Train until ``max_iters``, the time budget, or a stop signal; returns the result."""
        cfg, state = self.cfg, self.state
        start_tokens, start_elapsed = state.tokens, state.elapsed_s
        self._warm_up()
        self._open_files(resumed=state.step > 0)
        bar = Progress(self.progress_enabled, cfg.max_iters, state.step, cfg.time_budget_s,
                       state.elapsed_s)
        # (a run with no directory, an experiment's or a benchmark's, is promised no last.pt)
        stop = StopFlag(self.info, announce=self.info.is_main, saves=self.run is not None)
        t0 = time.perf_counter()
        self.model.train()
        params = list(self.model.parameters())  # (the same ones every step)
        with stop:
            try:
                while not self._finished():
                    lr = self._lr()
                    set_lr(self.opt, lr)
                    loss = train_step(self.model, self.forward, self.opt, self.task.loss, cfg,
                                      self._next_batch, self.device, self.dtype, params)
                    state.step += 1
                    state.final = {}  # a step past the final evaluation: it is due again
                    checked = state.elapsed_s
                    state.elapsed_s, stopped = stop.agree(
                        start_elapsed + time.perf_counter() - t0, self.device)
                    self._last_check_s = state.elapsed_s - checked
                    # the step is logged (and evaluated, at an evaluation step) as in a run
                    # that goes on, so a resumed run's metrics and best.pt are the same
                    self._log(loss, lr, bar, state.tokens - start_tokens,
                              state.elapsed_s - start_elapsed)
                    if stopped:
                        break
            finally:
                bar.close()
            # still under the stop flag: a signal during the final evaluation saves last.pt
            return self._finish(stop, start_tokens, start_elapsed)

    def _warm_up(self) -> None:
        """One forward and backward before the clock starts, its gradients dropped: what a
        process's first step does once is not counted against the time budget. That is
        seconds where a machine builds scratchgpt's C kernels on their first use (a 3 s
        budget was spent on step 1 alone), oneDNN's first-call set-up and ``--compile``'s
        graph. Exact: a task's batch for it (``warm_up_batch``) draws from no generator, the
        random state is put back, and nothing is stepped. Not under DDP (its hooks are the
        wrapper's), nor for a task without one."""
        batch_of = getattr(self.task, "warm_up_batch", None)
        if batch_of is None or self.info.enabled:
            return
        batch = batch_of(*self._batch_shape())
        self.model.train()
        cuda = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda), autocast(self.device, self.dtype):
            self.task.loss(self.forward, tuple(t.to(self.device) for t in batch)).backward()
        self.opt.zero_grad(set_to_none=True)

    def _next_batch(self) -> tuple[Tensor, ...]:
        """This process's rows of the next global batch; counts the group's tokens. Under a
        batch-size ramp or sequence-length warmup the batch has this step's rows and windows."""
        shard = (self.info.rank, self.info.world_size)
        rows, window = self._batch_shape()
        if window is not None:
            batch = self.task.train_batch(rows, self.batch_gen, shard, seq_len=window)
        else:
            batch = self.task.train_batch(rows, self.batch_gen, shard)
        self.state.tokens += self.task.batch_tokens(batch) * self.info.world_size
        return batch

    def _batch_shape(self) -> tuple[int, int | None]:
        """(rows, window) of this step's batch: its rows under a batch-size ramp, and its
        windows' length under a sequence-length warmup (None without one: the task's own)."""
        cfg, step = self.cfg, self.state.step
        window = window_length(step, cfg.seq_len_warmup, self.task.block_size) \
            if cfg.seq_len_warmup else None
        return batch_rows(step, cfg.batch_size_ramp, cfg.batch_size), window

    def _finished(self) -> bool:
        budget = self.cfg.time_budget_s
        return self.state.step >= self.cfg.max_iters or bool(budget and
                                                             self.state.elapsed_s >= budget)

    def _lr(self) -> float:
        """Warmup, then the schedule (cosine or wsd) over the updates or over the wall-clock
        budget, whichever ends first: the rate reaches its end when training does."""
        cfg, budget = self.cfg, self.cfg.time_budget_s
        progress = self.state.step / cfg.decay_iters
        if budget:
            progress = max(progress, self.state.elapsed_s / budget)
        return lr_at(self.state.step, cfg.warmup_iters, cfg.learning_rate, cfg.min_lr, progress,
                     cfg.schedule, cfg.decay_fraction)

    def _log(self, loss: Tensor, lr: float, bar: Progress, tokens: int, seconds: float) -> None:
        """Metrics rows, periodic evaluation and checkpoint, progress bar."""
        cfg, state = self.cfg, self.state
        if state.step % cfg.log_interval == 0 or state.step == 1:
            self._last_loss = self._finite(loss.item(), "training loss")
            self._row(lr=f"{lr:.3e}", loss=f"{self._last_loss:.4f}")
        elif math.isnan(self._last_loss):  # a resumed run's bar: a loss before its first row
            self._last_loss = loss.item()
        if state.step % cfg.eval_interval == 0:
            tr = self.task.estimate(self.model, "train", cfg.eval_iters, self.setting)
            va = self.task.estimate(self.model, "val", cfg.eval_iters, self.setting)
            extra = self._eval_extras()
            self._row(lr=f"{lr:.3e}", train_loss=f"{tr:.4f}", val_loss=f"{va:.4f}", **extra)
            self._save_evaluated(va)
            shown = getattr(self.task, "eval_shown", extra.keys())  # the task's summary
            bar.write(f"step {state.step}: train {tr:.4f}, val {va:.4f}"
                      + "".join(f", {k} {extra[k]}" for k in shown))
        bar.update(state.step, self._last_loss, tokens / max(seconds, 1e-9), state.elapsed_s)

    def _finish(self, stop: StopFlag, start_tokens: int, start_elapsed: float) -> TrainResult:
        state = self.state
        seconds = state.elapsed_s - start_elapsed
        tokens_per_s = (state.tokens - start_tokens) / seconds if seconds > 0 else 0.0
        metrics: dict[str, float] = {}
        if not stop.requested:  # (a run resumed with nothing left to train: made already)
            metrics = dict(state.final) or self._final_evaluation(stop)
        if stop.requested:  # before the final evaluation, or during it
            self._save(None)  # atomic: the previous files stay good until renamed
            metrics = {}
        self._close_files()
        return TrainResult(state.step, metrics.get("train_loss", math.nan),
                           metrics.get("val_loss", math.nan), state.best_val_loss,
                           state.elapsed_s, tokens_per_s, stop.requested,
                           self.run.path if self.run else None, metrics, stop.exit_code,
                           "" if stop.requested else self.task.report())

    def _final_evaluation(self, stop: StopFlag) -> dict[str, float]:
        """The task's final figures, logged and saved with the evaluated model; {} when a
        signal stops the evaluation (it can take a while: every window of the split), which
        then ends at once rather than after it, the run resuming into it."""
        self._announce_final_evaluation()
        stop.stop_at_once = True
        try:
            metrics = self.task.final_metrics(self.model, self.cfg.eval_iters, self.setting)
        except KeyboardInterrupt:
            if not stop.requested:
                raise
            return {}
        finally:
            stop.stop_at_once = False
        self._row(train_loss=f"{metrics.get('train_loss', math.nan):.4f}",
                  val_loss=f"{metrics['val_loss']:.4f}", **self._eval_extras())
        self.state.final = {k: float(v) for k, v in metrics.items()}
        self._save_evaluated(metrics["val_loss"])
        return metrics

    def _announce_final_evaluation(self) -> None:
        """A run its time budget ended says so, and what the final evaluation goes through
        (the task's ``final_scope()``), before it: on stderr, with or without the progress bar.
        The evaluation is exact over the whole split, seconds on Tiny Shakespeare and minutes
        on a larger one, and under ``--no-progress`` the run printed nothing past its budget,
        as if it hung. (Not from a run with no directory: an experiment's, a benchmark's.)"""
        budget = self.cfg.time_budget_s
        if not budget or self.state.elapsed_s < budget or self.run is None \
                or not self.info.is_main:
            return
        scope = getattr(self.task, "final_scope", None)
        what = f"evaluating {scope()}" if scope is not None else "running the final evaluation"
        print(f"{named(self.options, 'time_budget', self.cfg.time_budget)} spent at step "
              f"{self.state.step}{self._overrun(budget)}; {what}...", file=sys.stderr,
              flush=True)
        self._say_warmup_cut()

    def _say_warmup_cut(self) -> None:
        """A run its budget ended inside its warmup says so, as one whose --max-iters is not
        above its --warmup-iters does before it starts: its rate only rose and never decayed
        (a 3 s run of cpu-small's 100-update warmup ended at step 26, at a quarter of the
        rate, with nothing said). (Not where the warmup is all of --max-iters: said already.)"""
        cfg, options, step = self.cfg, self.options, self.state.step
        if step >= cfg.warmup_iters or cfg.warmup_iters >= cfg.max_iters:
            return
        print(f"note: the run ended inside its warmup, at step {step} of "
              f"{named(options, 'warmup_iters', cfg.warmup_iters)}: the learning rate rose to "
              f"{warmup_reached(step, cfg.warmup_iters):.0%} of "
              f"{named(options, 'learning_rate', cfg.learning_rate)} and the {cfg.schedule} "
              f"schedule never started; {give(options)} a longer "
              f"{named(options, 'time_budget')} or a smaller {named(options, 'warmup_iters')}",
              file=sys.stderr, flush=True)

    def _overrun(self, budget: float) -> str:
        """Why a run ended well past its budget, which it checks between steps: the last step
        (with an evaluation before it, at an evaluation's step) took that long. On a busy
        machine a step of a 3 s run took seconds, and the run said only that its budget was
        spent, then "done: 2 steps in 6.2s"."""
        over = self.state.elapsed_s - budget
        if over < max(1.0, 0.1 * budget):
            return ""
        previous = self.state.step - 1
        what = ("the evaluation at step {0} and step {1} took" if previous
                and previous % self.cfg.eval_interval == 0 else "step {1} took")
        return (f", {over:.1f} s past it (it is checked between steps, and "
                f"{what.format(previous, self.state.step)} {self._last_check_s:.1f} s)")

    # ---- files

    def _open_files(self, resumed: bool) -> None:
        if self.run is None or not self.info.is_main:
            return
        ckpt = self.checkpoint(with_training_state=False)
        self.run.write_config(run_config(ckpt, **self.extra_config,
                                         dtype_resolved=self.dtype,
                                         device_resolved=str(self.device),
                                         world_size=self.info.world_size), resumed)
        text_tokenizer = self.task.tokenizers().get("text")
        if text_tokenizer is not None:
            self.run.save_tokenizer(text_tokenizer)
        self.metrics = MetricsLog(self.run.file("metrics.csv"),
                                  self.state.step if resumed else None,
                                  getattr(self.task, "eval_fields", ()))

    def _eval_extras(self) -> dict[str, str]:
        """A task's own figures from its latest evaluation (optional ``eval_extras()``, named
        by its ``eval_fields``), e.g. a classifier's validation accuracy."""
        extras = getattr(self.task, "eval_extras", None)
        return {k: f"{v:.4f}" for k, v in extras().items()} if extras is not None else {}

    def _close_files(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
            figure_helper.draw("losses", self.run.file("metrics.csv"), self.run.file("loss.png"))

    def _row(self, **values: Any) -> None:
        if self.metrics is not None:
            self.metrics.row(step=self.state.step, tokens=self.state.tokens,
                             elapsed_s=round(self.state.elapsed_s, 3), **values)

    def checkpoint(self, with_training_state: bool = True) -> Checkpoint:
        """The current model (and, by default, everything needed to resume) as a checkpoint."""
        tokenizers = {role: tok.state() for role, tok in self.task.tokenizers().items()}
        ckpt = Checkpoint(model_type(self.config), self.config, self.model.state_dict(),
                          tokenizers, self.task.data(), self.run_id, self.cfg)
        if with_training_state:
            ckpt.state = dataclasses.replace(self.state, task=self.task.state_dict())
            ckpt.optimizer = self.opt.state_dict()
        return ckpt

    def _save_evaluated(self, val_loss: float) -> None:
        """last.pt after an evaluation, and best.pt too if ``val_loss`` is a new best."""
        self._finite(val_loss, "validation loss")
        improved = val_loss < self.state.best_val_loss
        self.state.best_val_loss = min(self.state.best_val_loss, val_loss)
        self._save(val_loss, best=improved)

    def _save(self, val_loss: float | None, best: bool = False) -> None:
        """Write the checkpoint(s); called by every process (each adds its dropout RNG)."""
        self.state.val_loss = val_loss
        self.state.rng = self._gather_rng()
        if self.run is None or not self.info.is_main:
            return
        if not all(bool(torch.isfinite(p).all()) for p in self.model.parameters()):
            raise ConfigError(f"the weights became NaN or infinite by step {self.state.step}; "
                              f"not saved ({self._kept()}): {_remedy(self.cfg, self.options)}")
        self.run.save(self.checkpoint(), best=best)

    def _finite(self, value: float, what: str) -> float:
        if not math.isfinite(value):
            raise ConfigError(f"the {what} became {value} at step {self.state.step}; stopped "
                              f"({self._kept()}): {_remedy(self.cfg, self.options)}")
        return value

    def _kept(self) -> str:
        """What a run that diverged leaves: its last.pt, or, before its first checkpoint,
        nothing (a new run's files are removed, a run it replaced put back), where every
        run was told that last.pt kept the last finite model."""
        if self.run is not None and self.run.file("last.pt").is_file():
            return "last.pt keeps the last finite model"
        return "no checkpoint had been written yet: nothing of this run is kept"

    def _gather_rng(self) -> dict[str, Any]:
        rng = capture_rng(self.batch_gen, self.device)
        if self.info.enabled:
            states: list[Any] = [None] * self.info.world_size
            dist.all_gather_object(states, (rng["torch_per_rank"][0], rng["cuda_per_rank"][0]))
            rng["torch_per_rank"] = [cpu for cpu, _ in states]
            rng["cuda_per_rank"] = [cuda for _, cuda in states]
        return rng


def _check_curriculum(cfg: TrainConfig, task: Task) -> None:
    """The sequence-length warmup, batch-size ramp and epoch windows shape windows of tokens:
    only a language model's task has them (a seq2seq batch is whole sentence pairs, drawn
    epoch by epoch already)."""
    if not isinstance(task, LanguageModelTask):
        check_no_curriculum(cfg)


def check_no_curriculum(cfg: TrainConfig) -> None:
    """:func:`_check_curriculum`'s refusals for a task that is no language model's (a
    command that knows its task's kind checks them before its preparations)."""
    for name in ("seq_len_warmup", "batch_size_ramp"):
        if getattr(cfg, name):
            raise ConfigError(f"{flag_of(name)} applies to language models only "
                              "(batches of token windows); leave it at 0 here")
    if cfg.windows != "random":
        raise ConfigError("--windows applies to language models only (batches of token "
                          "windows); this task goes through its examples epoch by epoch")


def _remedy(cfg: TrainConfig, options: Mapping[str, str]) -> str:
    """What to change when training diverged, as ``options`` name the settings. The decoupled
    weight decay multiplies each weight by 1 - lr * wd a step: from lr * wd = 1 on, that
    zeroes the weights or flips their sign, growing them once it passes 2. A weight decay
    above 1 (0.1 is usual) that does so is named first; a huge learning rate with a usual
    weight decay is the learning rate's fault."""
    lower = f"lower {named(options, 'learning_rate')} or keep {named(options, 'grad_clip')} on"
    decay = cfg.learning_rate * cfg.weight_decay
    if decay < 1 or cfg.weight_decay <= 1:
        return lower
    return (f"lower {named(options, 'weight_decay')} first: each step multiplies the weights "
            f"by 1 - learning rate x weight decay = 1 - {cfg.learning_rate:g} x "
            f"{cfg.weight_decay:g} = {1 - decay:.3g}, which zeroes them or flips their sign "
            f"(keep the product well below 1); else {lower}")
