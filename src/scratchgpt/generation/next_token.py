"""What a language model predicts next, and how sampling settings reshape that prediction.

A model's last logits define a distribution over the whole vocabulary; ``sample`` does not
draw from it directly but from ``logits_to_probs(logits, cfg)``: divided by the temperature,
cut to the top-k tokens, cut to the nucleus of mass top-p, renormalised. These helpers compute
exactly those distributions (the same function ``sample`` uses), so what ``scratchgpt inspect``
shows is what generation draws from.

>>> cfg = parse_setting("T=0.5,k=10")
>>> (cfg.temperature, cfg.top_k, cfg.top_p), setting_label(cfg)
((0.5, 10, None), 'T=0.5 top-k=10')
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from scratchgpt.errors import GenerationError
from scratchgpt.generation.decode import context_length
from scratchgpt.generation.sampling import SamplingConfig, logits_to_probs
from scratchgpt.validation import rename_setting

# "T=0.5,k=10,p=0.9": the short names a setting is written with, and the field each sets
_KEYS = {"t": "temperature", "temperature": "temperature", "k": "top_k", "top-k": "top_k",
         "top_k": "top_k", "p": "top_p", "top-p": "top_p", "top_p": "top_p"}


def parse_setting(text: str) -> SamplingConfig:
    """``"T=0.8"``, ``"k=40"``, ``"p=0.9"``, combined with commas (``"T=0.8,k=40,p=0.95"``), or
    ``"greedy"`` -> a validated :class:`SamplingConfig` (unset parts keep T=1, no top-k/p)."""
    if text.strip().lower() == "greedy":
        return SamplingConfig(temperature=0.0)
    values: dict[str, float | int] = {}
    typed: dict[str, str] = {}  # field -> its key as written ("k" for top_k)
    for part in text.split(","):
        key, sep, value = part.partition("=")
        field = _KEYS.get(key.strip().lower())
        if not sep or field is None:
            raise GenerationError(f"cannot read sampling setting {text!r}: write e.g. T=0.8, "
                                  "k=40, p=0.9, combined with commas, or greedy")
        if field in values:  # the later value would silently replace the earlier
            raise GenerationError(f"sampling setting {text!r} gives {field} twice")
        typed[field] = key.strip()
        values[field] = _number(value, field, key.strip(), text)
    try:
        return SamplingConfig(**values)
    except GenerationError as e:  # it names the field (top_k): name the key written (k)
        raise GenerationError(f"sampling setting {text!r}: "
                              f"{rename_setting(str(e), typed.get)}") from None


def _number(value: str, field: str, key: str, text: str) -> float | int:
    """A setting's value: a whole number for top-k (``k=2.5`` and ``k=1e3`` are numbers, but
    not a count of tokens), any number for the others."""
    try:
        return int(value) if field == "top_k" else float(value)
    except ValueError:
        pass
    what = "is not a number"
    if field == "top_k":
        try:
            float(value)
            what = f"is not a whole number ({key} counts tokens)"
        except ValueError:
            pass
    raise GenerationError(f"sampling setting {text!r}: {value.strip()!r} {what}")


def setting_label(cfg: SamplingConfig) -> str:
    """A short name for a setting: ``"T=0.5 top-k=10"``, ``"top-p=0.9"``, ``"greedy"``."""
    if cfg.greedy:
        return "greedy"
    parts = [f"T={cfg.temperature:g}"] if cfg.temperature != 1.0 else []
    if cfg.top_k:
        parts.append(f"top-k={cfg.top_k}")
    if cfg.top_p is not None and cfg.top_p < 1.0:
        parts.append(f"top-p={cfg.top_p:g}")
    return " ".join(parts) or "T=1"


@torch.inference_mode()
def next_token_logits(model: nn.Module, ids: Sequence[int]) -> tuple[Tensor, int]:
    """The model's logits for the token after ``ids``: (vocab,) float32, and how many of the
    ids it read (a GPT reads only the last context-length of them; other models read all)."""
    if not ids:
        raise GenerationError("the prompt is empty after tokenization")
    ctx = context_length(model)
    used = list(ids[-ctx:]) if ctx else list(ids)
    device = next(model.parameters()).device
    logits = model(torch.tensor([used], dtype=torch.long, device=device))  # (1, T, vocab)
    return logits[0, -1].float().cpu(), len(used)


def distributions(logits: Tensor, settings: Sequence[SamplingConfig]) -> Tensor:
    """The sampling distribution under each setting: (len(settings), vocab) float32."""
    return torch.stack([logits_to_probs(logits, cfg) for cfg in settings])


def entropy(probs: Tensor) -> float:
    """Shannon entropy in nats of one distribution (vocab,); tokens with p = 0 add nothing.
    ``exp(entropy)`` is the number of equally likely tokens it is as uncertain as."""
    p = probs[probs > 0].double()
    return float(-(p * p.log()).sum()) + 0.0  # + 0.0: no "-0.0" for a one-hot

