"""How far back does a recurrent network remember? Recall the FIRST symbol of a sequence.

A model reads a random sequence of ``symbols`` and must output its first symbol from the last
hidden state. A tanh RNN loses it as sequences grow (its gradient through many steps
vanishes); an LSTM, whose cell state is carried forward by a gate near 1, keeps it.

Each (cell, length) pair trains a fresh model on the training core (no files written) and is
scored on new random sequences; ``mixed=True`` trains one model per cell on all lengths at
once (given enough steps, the short sequences then teach the RNN what to keep).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from scratchgpt import memory
from scratchgpt.models.rnn import RecurrentClassifierConfig
from scratchgpt.training.config import TrainConfig
from scratchgpt.training.task import Batch, EvalSetting, _eval_mode
from scratchgpt.training.trainer import Trainer
from scratchgpt.validation import offset_seed


class FirstSymbolTask:
    """Sequences of ``lengths`` (one drawn per batch) labelled with their first symbol."""

    def __init__(self, symbols: int, lengths: list[int], eval_samples: int, seed: int):
        self.symbols, self.lengths = symbols, lengths
        self.eval_samples, self.seed = eval_samples, seed
        self.accuracy: dict[int, float] = {}

    def train_batch(self, batch_size: int, generator: torch.Generator,
                    shard: tuple[int, int] = (0, 1)) -> Batch:
        t = self.lengths[int(torch.randint(len(self.lengths), (1,), generator=generator))]
        x = torch.randint(self.symbols, (batch_size, t), generator=generator)  # [B, T]
        return x, x[:, 0]

    def loss(self, model: nn.Module, batch: Batch) -> Tensor:
        x, y = batch
        return F.cross_entropy(model(x), y)

    def batch_tokens(self, batch: Batch) -> int:
        return batch[0].numel()

    @torch.no_grad()
    def estimate(self, model: nn.Module, split: str, iters: int, setting: EvalSetting) -> float:
        gen = torch.Generator().manual_seed(offset_seed(self.seed, split == "val"))
        with _eval_mode(model):
            losses = [self.loss(model, self.train_batch(setting.batch_size, gen)).item()
                      for _ in range(iters)]
        return sum(losses) / len(losses)

    @torch.no_grad()
    def final_metrics(self, model: nn.Module, iters: int,
                      setting: EvalSetting) -> dict[str, float]:
        """Accuracy at each length on ``eval_samples`` new sequences (a fixed seed)."""
        gen = torch.Generator().manual_seed(offset_seed(self.seed, 1))
        with _eval_mode(model):
            for t in self.lengths:
                x = torch.randint(self.symbols, (self.eval_samples, t), generator=gen)
                self.accuracy[t] = float((model(x).argmax(-1) == x[:, 0]).float().mean())
        return {"val_loss": self.estimate(model, "val", iters, setting),
                **{f"accuracy_{t}": a for t, a in self.accuracy.items()}}

    def report(self) -> str:
        return " ".join(f"{t}:{a:.2f}" for t, a in self.accuracy.items())

    def tokenizers(self) -> dict[str, Any]:
        return {}

    def data(self) -> dict[str, Any]:
        return {"experiment": "memory", "symbols": self.symbols, "lengths": self.lengths}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


@dataclass
class MemorySetup:
    """The settings of one memory experiment."""

    symbols: int = 8
    hidden: int = 64
    steps: int = 600
    batch_size: int = 64
    learning_rate: float = 3e-3
    forget_bias: float | None = 1.0
    eval_samples: int = 1000
    seed: int = 0
    cells: str = "torch"  # torch's fused recurrent kernels, or "scratch": the cell equations


def _config(setup: MemorySetup, cell: str) -> RecurrentClassifierConfig:
    return RecurrentClassifierConfig(setup.symbols, setup.symbols, cell, setup.hidden,
                                     forget_bias=setup.forget_bias, cells=setup.cells)


def check_fits(setup: MemorySetup, cells: list[str], max_len: int) -> None:
    """Each cell's model fits in memory on the longest sequences: a training batch, and the
    test set, read at once without gradients; checked before any model is built."""
    tested = setup.eval_samples * max_len  # test tokens: an int64 id, the outputs (and a copy)
    testing = tested * (8 + memory.FP32 * 2 * setup.hidden)
    for cell in cells:  # (an RNN's estimate counts tokens: a batch of sequences x length)
        train = memory.training_estimate(_config(setup, cell), setup.batch_size * max_len)
        memory.check_fits(memory.Estimate({**train.parts, "testing": testing}),
                          f"the {cell} on sequences of {max_len:,} symbols")


def train_and_test(setup: MemorySetup, cell: str, lengths: list[int], seed: int
                   ) -> dict[int, float]:
    """Train one model on sequences of ``lengths``; its accuracy at each of them."""
    cfg = TrainConfig(batch_size=setup.batch_size, max_iters=setup.steps,
                      learning_rate=setup.learning_rate, min_lr=setup.learning_rate,
                      warmup_iters=0, weight_decay=0.0, grad_clip=1.0, eval_iters=4,
                      eval_interval=setup.steps + 1, log_interval=setup.steps + 1,
                      dtype="fp32", seed=seed)
    config = _config(setup, cell)
    task = FirstSymbolTask(setup.symbols, lengths, setup.eval_samples, seed)
    Trainer(cfg, config, task, progress=False).fit().raise_if_stopped()
    return task.accuracy


def run(setup: MemorySetup, cells: list[str], lengths: list[int], mixed: bool,
        log: Any = print) -> dict[str, list[float]]:
    """Accuracy by length for each cell: one model per length, or one for all (``mixed``)."""
    import time

    accuracy: dict[str, list[float]] = {}
    for cell in cells:
        t0 = time.perf_counter()
        if mixed:
            acc = train_and_test(setup, cell, lengths, setup.seed)
            accuracy[cell] = [acc[t] for t in lengths]
        else:  # a fresh model per length: nothing short to learn from first
            accuracy[cell] = [train_and_test(setup, cell, [t], offset_seed(setup.seed, t))[t]
                              for t in lengths]
        log(f"{cell} ({setup.cells} cells): {time.perf_counter() - t0:.1f}s; accuracy by length "
            + " ".join(f"{t}:{a:.2f}" for t, a in zip(lengths, accuracy[cell], strict=True)))
    return accuracy


def recorded_settings(setup: MemorySetup, cells: list[str], lengths: list[int], mixed: bool,
                      threads: int) -> dict[str, Any]:
    """What produced a result, named as the flags that set it (settings.json beside memory.csv):
    two runs' files otherwise read alike whatever their sizes, steps or seed."""
    return {"cells": cells, "impl": setup.cells, "min_len": lengths[0], "max_len": lengths[-1],
            "mixed": mixed, "symbols": setup.symbols, "hidden": setup.hidden,
            "steps": setup.steps, "batch_size": setup.batch_size,
            "learning_rate": setup.learning_rate,
            "forget_bias": setup.forget_bias if "lstm" in cells else None,
            "eval_samples": setup.eval_samples, "seed": setup.seed, "threads": threads}


def caption(settings: dict[str, Any]) -> str:
    """One line of the settings for the plot, so that two runs' figures differ where they do."""
    parts = ["one model for all lengths" if settings["mixed"] else "a model per length",
             f"hidden {settings['hidden']}", f"{settings['steps']:,} steps",
             f"batch {settings['batch_size']}", f"lr {settings['learning_rate']:g}",
             f"{settings['symbols']} symbols"]
    if settings["forget_bias"] is not None:
        parts.append(f"forget bias {settings['forget_bias']:g}")
    parts += [f"{settings['eval_samples']:,} tests per length", f"seed {settings['seed']}",
              f"{settings['impl']} cells"]
    return ", ".join(parts)


# The x values are sequence lengths T: the symbol is the first of T read, the answer comes
# after the last, T - 1 steps later.
X_LABEL = "sequence length T (the symbol is read T - 1 steps before the answer)"


def figure(lengths: list[int], accuracy: dict[str, list[float]], symbols: int,
           subtitle: str = "") -> Any:
    """The figure of memory.png: accuracy recalling the first symbol against sequence length."""
    from scratchgpt.viz import pyplot

    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7, 4.4))
    for k, (cell, accs) in enumerate(accuracy.items()):  # each drawn smaller than the one
        ax.plot(lengths, accs, marker="os^"[k % 3], markersize=9 - 2.5 * (k % 3),  # before,
                linewidth=2.6 - 0.8 * (k % 3), label=cell.upper())  # so equal points all show
    ax.axhline(1 / symbols, color="gray", linestyle="--", label="chance")
    ax.set_xlabel(X_LABEL)
    if len(lengths) <= 12:  # lengths are whole: each its tick (one alone got 4.74, 4.80 ...)
        ax.set_xticks(lengths)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("accuracy recalling the first symbol")
    ax.set_ylim(0, 1.05)
    ax.legend()
    ax.set_title("Memory over time: " + " vs ".join(cell.upper() for cell in accuracy))
    if subtitle:
        import textwrap

        fig.text(0.5, 0.005, "\n".join(textwrap.wrap(subtitle, 115)), ha="center",
                 va="bottom", fontsize=7, color="dimgray")
        fig.tight_layout(rect=(0, 0.06, 1, 1))
    else:
        fig.tight_layout()
    return fig


def plot(path: Path, lengths: list[int], accuracy: dict[str, list[float]], symbols: int,
         subtitle: str = "") -> None:
    """memory.png: :func:`figure`, saved."""
    from scratchgpt.viz import pyplot

    fig = figure(lengths, accuracy, symbols, subtitle)
    fig.savefig(path, dpi=120)
    pyplot().close(fig)
