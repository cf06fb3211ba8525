"""The training defaults of fine-tuning, where they differ from pretraining's: data, no torch,
so that ``scratchgpt finetune --help`` states them without importing the jobs that use them
(``finetune/plan.py``)."""

from __future__ import annotations

from typing import Any

# Training defaults of fine-tuning (flags override them). Fine-tuning takes smaller steps than
# pretraining, the fewer the parameters that train the larger.
TRAIN_DEFAULTS: dict[str, dict[str, Any]] = {
    "classify": dict(batch_size=16, weight_decay=0.0, grad_clip=1.0, log_interval=10),
    "instruct": dict(batch_size=8, weight_decay=0.0, grad_clip=1.0, log_interval=10),
}
LEARNING_RATES = {"all": 2e-4, "last-k": 5e-4, "head": 2e-3, "lora": 2e-3}
DEFAULT_EPOCHS = 3.0


def shown_defaults() -> dict[str, str]:
    """The training defaults of fine-tuning as ``finetune --help`` states them (see
    :func:`scratchgpt.finetune.plan.train_config`), where they differ from pretraining's."""
    rates = ", ".join(f"{rate:g} ({policy})" for policy, rate in LEARNING_RATES.items())
    shared = {k: v for k, v in TRAIN_DEFAULTS["classify"].items()
              if TRAIN_DEFAULTS["instruct"].get(k) == v}
    batches = ", ".join(f"{TRAIN_DEFAULTS[t]['batch_size']} ({t})" for t in ("instruct",
                                                                          "classify"))
    return {**{k: f"{v}" for k, v in shared.items()}, "batch_size": batches,
            "learning_rate": rates, "max_iters": "--epochs passes over the training split",
            "eval_interval": "one epoch", "eval_iters": "the whole validation split",
            "warmup_iters": "max-iters / 20, at most 100", "min_lr": "learning-rate / 10"}
