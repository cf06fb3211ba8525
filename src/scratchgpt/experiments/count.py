"""Learn to count: the smallest end-to-end language model.

A recurrent LM sees rows ``k, k+1, ..., k+16 (mod n)``, one number per token, and learns to
predict the next number; generation then reads a prompt once and carries the hidden state
forward one token at a time (the state holds everything the model remembers).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor, nn

from scratchgpt import memory
from scratchgpt.models.rnn import RecurrentConfig
from scratchgpt.training.config import TrainConfig
from scratchgpt.training.task import Batch, EvalSetting, LanguageModelTask, _eval_mode
from scratchgpt.training.trainer import Trainer

ROW = 17  # numbers per training row: 16 inputs, each with its next number as target
BATCH = 32  # rows per training step
LEARNING_RATE = 1e-2  # Adam's, constant


class CountingTask:
    """Rows of consecutive numbers modulo ``modulus``, from random starts."""

    def __init__(self, modulus: int):
        self.modulus = modulus
        self.accuracy = 0.0

    def rows(self, starts: Tensor) -> Batch:
        seq = (starts[:, None] + torch.arange(ROW)) % self.modulus  # [B, ROW]
        return seq[:, :-1], seq[:, 1:]

    def train_batch(self, batch_size: int, generator: torch.Generator,
                    shard: tuple[int, int] = (0, 1)) -> Batch:
        return self.rows(torch.randint(self.modulus, (batch_size,), generator=generator))

    # next-token prediction, exactly as a language model trains on text
    loss = staticmethod(LanguageModelTask.loss)
    batch_tokens = staticmethod(LanguageModelTask.batch_tokens)

    @torch.no_grad()
    def estimate(self, model: nn.Module, split: str, iters: int, setting: EvalSetting) -> float:
        with _eval_mode(model):
            return self.loss(model, self.rows(torch.arange(self.modulus))).item()

    @torch.no_grad()
    def final_metrics(self, model: nn.Module, iters: int,
                      setting: EvalSetting) -> dict[str, float]:
        """Next-number accuracy from every start, given one number of context and more."""
        x, y = self.rows(torch.arange(self.modulus))
        with _eval_mode(model):
            self.accuracy = float((model(x).argmax(-1) == y).float().mean())
        return {"val_loss": self.estimate(model, "val", 1, setting),
                "next_number_accuracy": self.accuracy}

    def report(self) -> str:
        return f"next-number accuracy {self.accuracy:.2%}"

    def tokenizers(self) -> dict[str, Any]:
        return {}

    def data(self) -> dict[str, Any]:
        return {"experiment": "count", "modulus": self.modulus}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def train_counter(cell: str, modulus: int, hidden: int, steps: int, seed: int
                  ) -> tuple[nn.Module, dict[str, float], float]:
    """Train a one-layer recurrent LM to count; returns (model, final metrics, first loss)."""
    cfg = TrainConfig(batch_size=BATCH, max_iters=steps, learning_rate=LEARNING_RATE,
                      min_lr=LEARNING_RATE, warmup_iters=0, weight_decay=0.0, grad_clip=0.0,
                      eval_iters=1, eval_interval=steps + 1, log_interval=steps + 1,
                      dtype="fp32", seed=seed)
    config = RecurrentConfig(vocab_size=modulus, cell=cell, n_layer=1, hidden=hidden)
    check_fits(config)
    task = CountingTask(modulus)
    trainer = Trainer(cfg, config, task, progress=False)
    first = task.estimate(trainer.model, "val", 1, trainer.setting)
    result = trainer.fit()
    result.raise_if_stopped()
    return trainer.model.eval(), result.metrics, first


def recorded_settings(cell: str, modulus: int, hidden: int, steps: int, seed: int,
                      threads: int) -> dict[str, Any]:
    """What produced a result, named as the flags that set it (and the fixed batch, row and
    learning rate): two runs' count.json otherwise read alike whatever their sizes or seed."""
    return {"cell": cell, "modulus": modulus, "hidden": hidden, "steps": steps, "seed": seed,
            "threads": threads, "batch_size": BATCH, "row_length": ROW,
            "learning_rate": LEARNING_RATE}


def check_fits(config: RecurrentConfig) -> None:
    """Training and the evaluation fit in memory, checked before anything is built. The
    evaluation reads a row from every start at once: ``modulus x 16`` tokens, each with
    ``modulus`` logits, which is what grows fastest."""
    rows = dataclasses.replace(config, block_size=ROW - 1)  # a training row's inputs
    train = memory.training_estimate(rows, BATCH)
    tokens = config.vocab_size * (ROW - 1)
    per_token = 3 * config.vocab_size + memory.ACTIVATION_FLOATS * config.hidden
    estimate = memory.Estimate({**train.parts, "evaluation": memory.FP32 * tokens * per_token})
    memory.check_fits(estimate, f"counting modulo {config.vocab_size:,} with {config.hidden:,} "
                                "hidden units")


def continue_counting(model: nn.Module, prompt: list[int], n: int) -> list[int]:
    """Read ``prompt`` once, then generate ``n`` numbers greedily (the hidden state carries
    everything forward, one token per step)."""
    from scratchgpt.generation.generate import generate
    from scratchgpt.generation.sampling import SamplingConfig

    out = generate(model, torch.tensor([prompt]), n, SamplingConfig(temperature=0))
    return out[0, len(prompt):].tolist()
