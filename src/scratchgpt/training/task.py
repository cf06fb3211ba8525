"""What a kind of training adds to the training core: its batches, its loss, its evaluation.

The core (``training/trainer.py``) owns everything every training shares: the optimizer, the
schedule, precision, gradient accumulation and clipping, data-parallel processes, progress,
metrics, checkpoints, resume, time budgets and stopping. A *task* owns the rest:

* ``train_batch``: the next training batch, a tuple of tensors (drawn with the generator the
  core saves, so that resuming draws the same batches);
* ``loss``: the mean loss of a batch, from the model's output;
* ``estimate``: a quick loss estimate on a split, for periodic evaluation;
* ``final_metrics``: the figures reported at the end (``val_loss`` exact, plus its own), and
  ``report``: any text worth printing about them (e.g. accuracy by length);
* optionally ``final_scope()``: what the final evaluation goes through, in words (``the full
  validation split (41 windows, 10,496 tokens)``), which a run its time budget ended says
  before it (on a large split it takes minutes, where a run looked hung past its budget);
* ``tokenizers`` and ``data``: what the run directory and checkpoints record;
* optionally ``eval_fields`` and ``eval_extras()``: figures of its own that each evaluation
  adds to ``metrics.csv`` and the progress line (e.g. a classifier's ``val_acc``), and
  ``eval_shown``: the names the progress line shows, when not all of them;

:class:`LanguageModelTask` is next-token prediction on a prepared dataset; seq2seq, the
experiments and fine-tuning define their own tasks the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from scratchgpt.data.dataset import TokenDataset, windows_at
from scratchgpt.errors import ConfigError
from scratchgpt.training.epochs import EpochWindows
from scratchgpt.training.precision import autocast
from scratchgpt.wording import plural

Batch = tuple[Tensor, ...]


@dataclass(frozen=True)
class EvalSetting:
    """How evaluation runs: on which device, in which precision, in batches of what size;
    ``progress``: whether a final evaluation that takes a while shows a bar (on a terminal)."""

    device: torch.device
    dtype: str
    batch_size: int
    seed: int
    progress: bool = False


class Task(Protocol):
    """The task interface the training core takes (see the module docstring)."""

    def train_batch(self, batch_size: int, generator: torch.Generator,
                    shard: tuple[int, int] = (0, 1)) -> Batch: ...

    def loss(self, model: nn.Module, batch: Batch) -> Tensor: ...

    def batch_tokens(self, batch: Batch) -> int: ...

    def estimate(self, model: nn.Module, split: str, iters: int,
                 setting: EvalSetting) -> float: ...

    def final_metrics(self, model: nn.Module, iters: int,
                      setting: EvalSetting) -> dict[str, float]: ...

    def report(self) -> str: ...

    def tokenizers(self) -> dict[str, Any]: ...

    def data(self) -> dict[str, Any]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean next-token cross-entropy (nats). logits (B, T, V), targets (B, T)."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))


def next_token_loss(model: nn.Module, batch: Batch) -> Tensor:
    """The loss of a language-model batch: inputs x (B, T), next-token targets y (B, T)."""
    x, y = batch
    return lm_loss(model(x), y)


class LanguageModelTask:
    """Next-token prediction on windows of a prepared dataset's token files: drawn at random
    (``windows="random"``) or epoch by epoch (``"epoch"``: see :class:`EpochWindows`)."""

    def __init__(self, dataset: TokenDataset, block_size: int,
                 extra_data: dict[str, Any] | None = None, windows: str = "random"):
        self.dataset = dataset
        self.block_size = block_size
        self.extra_data = extra_data or {}  # recorded beside the dataset (e.g. a base model)
        self.epochs = None
        if windows == "epoch":
            self.epochs = EpochWindows(len(dataset.splits["train"]), block_size)

    def train_batch(self, batch_size: int, generator: torch.Generator,
                    shard: tuple[int, int] = (0, 1), seq_len: int | None = None) -> Batch:
        """The next training windows, of ``seq_len`` tokens (default: the whole context,
        ``block_size``; shorter under a sequence-length warmup)."""
        seq_len = seq_len or self.block_size
        if self.epochs is None:
            return self.dataset.get_batch("train", batch_size, seq_len, generator, shard)
        starts = self.epochs.next(batch_size, generator, shard)
        return windows_at(self.dataset.splits["train"], starts, seq_len)

    def warm_up_batch(self, batch_size: int, seq_len: int | None = None) -> Batch:
        """A batch of the training batches' shape that draws from no generator and moves no
        epoch: the first window of the training split, ``batch_size`` times (the trainer's
        untimed warm-up step, :meth:`Trainer._warm_up`)."""
        starts = np.zeros(batch_size, dtype=np.int64)
        return windows_at(self.dataset.splits["train"], starts, seq_len or self.block_size)

    @staticmethod
    def loss(model: nn.Module, batch: Batch) -> Tensor:
        return next_token_loss(model, batch)

    @staticmethod
    def batch_tokens(batch: Batch) -> int:
        return batch[1].numel()

    @torch.no_grad()
    def estimate(self, model: nn.Module, split: str, iters: int, setting: EvalSetting) -> float:
        """Mean loss over ``iters`` random batches drawn with a fixed seed, so that successive
        estimates are comparable."""
        gen = torch.Generator().manual_seed(setting.seed)
        total = 0.0
        with _eval_mode(model):
            for _ in range(iters):
                x, y = self.dataset.get_batch(split, setting.batch_size, self.block_size, gen)
                with autocast(setting.device, setting.dtype):
                    total += lm_loss(model(x.to(setting.device)), y.to(setting.device)).item()
        return total / iters

    def final_metrics(self, model: nn.Module, iters: int,
                      setting: EvalSetting) -> dict[str, float]:
        """The train estimate, the exact fp32 loss over the whole validation split, and that
        loss in bits per character of the validation text (comparable across tokenizers).
        With ``setting.progress``, the pass over the split shows a bar once it has run for a
        second (minutes on a larger model, where the run sat silent after its last step)."""
        val = full_split_loss(model, self.dataset, "val", self.block_size, setting.device,
                              progress="val split" if setting.progress else None)
        return {"train_loss": self.estimate(model, "train", iters, setting), "val_loss": val,
                "val_bpc": self.dataset.bits_per_char("val", val)}

    def final_scope(self) -> str:
        """What :meth:`final_metrics` evaluates exactly: every window of the validation split,
        counted as :func:`full_split_loss` reads them (``scratchgpt eval`` reports the same
        tokens)."""
        windows = self.dataset.window_count("val", self.block_size)
        tokens = evaluated_tokens(self.dataset, "val", self.block_size)
        return (f"the full validation split ({plural(windows, 'window', grouped=True)}, "
                f"{plural(tokens, 'token', grouped=True)})")

    def report(self) -> str:
        return ""

    def tokenizers(self) -> dict[str, Any]:
        return {"text": self.dataset.tokenizer()}

    def data(self) -> dict[str, Any]:
        # absolute, so that --resume finds the run's data from any directory
        # and its identity, so that --resume knows it again once prepared anew in place
        return {"dataset": str(self.dataset.directory.resolve()), **self.extra_data,
                "dataset_identity": self.dataset.identity()}

    def state_dict(self) -> dict[str, Any]:
        # random windows are drawn from the saved generator alone; an epoch also has an order
        return {} if self.epochs is None else {"epoch_windows": self.epochs.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.epochs is not None and "epoch_windows" in state:
            self.epochs.load_state_dict(state["epoch_windows"])


@torch.no_grad()
def _split_outputs(model: nn.Module, data: TokenDataset, split: str, block_size: int,
                   device: torch.device, batch_size: int | None, max_tokens: int | None,
                   progress: str | None = None) -> Iterator[tuple[Tensor, Tensor]]:
    """(logits (B, T, V), targets (B, T)) for every non-overlapping window of ``split`` in
    order, in eval mode; with ``max_tokens``, only the first windows whose targets fit in it
    (at least one). ``progress``: a bar of that name on stderr, by tokens, once the pass
    has run for a second (a large split takes minutes)."""
    from scratchgpt.bars import named_bar  # (not for training's imports)

    windows = None if max_tokens is None else _window_cap(max_tokens, block_size)
    batch_size = batch_size or eval_batch_size(block_size, device)
    total = evaluated_tokens(data, split, block_size, max_tokens)
    with _eval_mode(model), named_bar(total, progress, "token") as bar:
        for x, y in data.sequential_batches(split, batch_size, block_size):
            if windows is not None:
                x, y = x[:windows], y[:windows]
                windows -= y.size(0)
            yield model(x.to(device)), y.to(device)
            bar.update(y.numel())
            if windows == 0:
                break


def _window_cap(max_tokens: int, block_size: int) -> int:
    """The windows ``max_tokens`` allows: those whose targets fit in it, at least one."""
    return max(1, max_tokens // block_size)


def evaluated_tokens(data: TokenDataset, split: str, block_size: int,
                     max_tokens: int | None = None) -> int:
    """The targets whose loss :func:`full_split_loss` (and :func:`loss_by_position`) averages
    over ``split`` in windows of ``block_size``: every whole window's, or the first windows'
    that ``max_tokens`` allows, at least one. A ``max_tokens`` past the split, or not a
    multiple of the window, evaluates another count than it names."""
    windows = data.window_count(split, block_size)
    if max_tokens is not None:
        windows = min(windows, _window_cap(max_tokens, block_size))
    return windows * block_size


# Tokens per batch of a whole-split evaluation on a CPU: a small model's activations for
# ~2048 rows stay in a core's cache between its operators, where 4096 rows spill. Measured at
# nanoGPT's recipe shape on a 2-core Xeon (2 MB of cache per core), the validation split in
# fp32 (benchmarks/eval_split.py, docs/BENCHMARKS.md): 1.14 s in batches of 32 windows of 64
# against 1.41 s in batches of 64 (medians of 10 rounds).
CPU_EVAL_TOKENS = 2048


def eval_batch_size(block_size: int, device: torch.device) -> int:
    """Windows per batch of a whole-split evaluation: :data:`CPU_EVAL_TOKENS` tokens' worth
    on a CPU, 64 windows on an accelerator (which wants larger batches)."""
    if device.type != "cpu":
        return 64
    return max(1, CPU_EVAL_TOKENS // block_size)


def full_split_loss(model: nn.Module, data: TokenDataset, split: str,
                    block_size: int | None = None, device: torch.device | None = None,
                    batch_size: int | None = None, max_tokens: int | None = None,
                    progress: str | None = None) -> float:
    """Exact fp32 loss over every non-overlapping window of ``split`` (or its first
    ``max_tokens`` tokens' worth of windows): the number reported as *the* val loss.
    Windows of ``block_size`` tokens (by default the model's ``config.block_size``), on
    ``device`` (by default the one its weights are on). ``batch_size``: windows per forward,
    by default :func:`eval_batch_size`'s. ``progress``: the name of a bar on stderr, shown
    once the pass has run for a second (None: no bar)."""
    block_size, device = _window_and_device(model, block_size, device)
    total, count = 0.0, 0
    for logits, y in _split_outputs(model, data, split, block_size, device, batch_size,
                                    max_tokens, progress):
        total += lm_loss(logits, y).item() * y.numel()
        count += y.numel()
    return total / count


def loss_by_position(model: nn.Module, data: TokenDataset, split: str,
                     block_size: int | None = None, device: torch.device | None = None,
                     batch_size: int | None = None,
                     max_tokens: int | None = None,
                     progress: str | None = None) -> tuple[float, Tensor]:
    """:func:`full_split_loss` (the same number, bit for bit) and, from the same pass, the
    loss at each position of the window averaged over those windows: float64 (T,).

    Position t predicts the window's token t + 1 from the t + 1 tokens before it, so the curve
    shows what context buys: high at the start of a window, where the model has next to
    nothing to go on, flat once more context stops helping. Its mean is the loss up to
    rounding."""
    block_size, device = _window_and_device(model, block_size, device)
    sums = torch.zeros(block_size, dtype=torch.float64)
    total, windows = 0.0, 0
    for logits, y in _split_outputs(model, data, split, block_size, device, batch_size,
                                    max_tokens, progress):
        total += lm_loss(logits, y).item() * y.numel()  # as full_split_loss sums it
        losses = F.cross_entropy(logits.float().transpose(1, 2), y, reduction="none")  # (B, T)
        sums += losses.double().sum(0).cpu()
        windows += y.size(0)
    return total / (windows * block_size), sums / windows


def _window_and_device(model: nn.Module, block_size: int | None,
                       device: torch.device | None) -> tuple[int, torch.device]:
    """An evaluation's window length and device: those given, else the model's own."""
    if block_size is None:
        block_size = getattr(getattr(model, "config", None), "block_size", None)
        if block_size is None:
            raise ConfigError(f"a {type(model).__name__} has no config.block_size: pass "
                              "block_size, the length of the windows to evaluate")
    if device is None:
        device = next(model.parameters()).device
    return block_size, device


class _eval_mode:
    """``model.eval()`` inside the block, the previous mode restored after it."""

    def __init__(self, model: nn.Module):
        self.model, self.was_training = model, model.training

    def __enter__(self) -> nn.Module:
        self.model.eval()
        return self.model

    def __exit__(self, *exc: Any) -> None:
        self.model.train(self.was_training)
