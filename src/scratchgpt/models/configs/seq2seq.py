"""The seq2seq models' hyperparameters, :class:`Seq2SeqConfig`, and each architecture's default
sizes: plain data, no torch (the models are ``models/seq2seq.py``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from scratchgpt.errors import ConfigError
from scratchgpt.validation import check_range, refuse_unknown_fields

ARCHS = ("transformer", "lstm-attention", "lstm")


@refuse_unknown_fields
@dataclass
class Seq2SeqConfig:
    """Shape of a seq2seq model. ``d_model`` is the embedding and hidden width of every arch."""

    arch: str
    src_vocab: int
    tgt_vocab: int
    d_model: int = 128
    n_layer: int = 2  # encoder layers and decoder layers, each
    n_head: int = 4  # transformer only
    d_ff: int = 512  # transformer only
    dropout: float = 0.1
    bidirectional: bool = True  # lstm encoders only
    max_positions: int = 512  # transformer: longest sequence the position table covers
    # The ids the tokenizers reserve: padding (ignored by attention and loss), start of the
    # target, end of the target, and the stand-in for a character unseen in training.
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    unk_id: int = 3

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ConfigError(f"arch must be one of {ARCHS}, got {self.arch!r}")
        for name in ("src_vocab", "tgt_vocab", "d_model", "n_layer", "n_head", "d_ff",
                     "max_positions"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.arch == "transformer" and self.d_model % self.n_head:
            # in GPTConfig's words, which the CLI turns into the flags typed (it named
            # d_model and n_head, where the user had typed --d-model and --n-head)
            raise ConfigError(f"d_model ({self.d_model}) must be divisible by n_head "
                              f"({self.n_head})")
        check_range("dropout", self.dropout, 0, 1, high_open=True)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Default sizes per architecture, tuned on the dates task on a 2-core CPU (docs/bench_seq2seq.md).
# Their keys are the settings each architecture takes (the LSTMs have no heads, feed-forward
# width or position table; the transformer's encoder is always bidirectional).
ARCH_DEFAULTS: dict[str, dict[str, Any]] = {
    "transformer": {"d_model": 64, "n_layer": 2, "n_head": 4, "d_ff": 256, "dropout": 0.0,
                    "max_positions": 512},
    "lstm-attention": {"d_model": 128, "n_layer": 1, "bidirectional": True, "dropout": 0.0},
    "lstm": {"d_model": 128, "n_layer": 1, "bidirectional": True, "dropout": 0.0},
}


def default_config(arch: str, src_vocab: int, tgt_vocab: int, **overrides: Any) -> Seq2SeqConfig:
    """``ARCH_DEFAULTS[arch]`` with ``overrides`` (those that are not None) applied. Every
    config holds every field; one that only other architectures use (see
    :func:`unused_settings`) changes nothing.

    >>> default_config("lstm", 40, 30, d_model=32).d_model
    32
    """
    if arch not in ARCHS:
        raise ConfigError(f"arch must be one of {ARCHS}, got {arch!r}")
    given = {k: v for k, v in overrides.items() if v is not None}
    fields = {**ARCH_DEFAULTS[arch], **given}
    return Seq2SeqConfig(arch=arch, src_vocab=src_vocab, tgt_vocab=tgt_vocab, **fields)


def unused_settings(arch: str, names: Any) -> list[str]:
    """The ``names`` (config fields) that only other architectures use, sorted.

    >>> unused_settings("lstm", ["d_model", "n_head", "d_ff"])
    ['d_ff', 'n_head']
    """
    if arch not in ARCHS:
        raise ConfigError(f"arch must be one of {ARCHS}, got {arch!r}")
    per_arch = set().union(*ARCH_DEFAULTS.values())
    return sorted(set(names) & per_arch - ARCH_DEFAULTS[arch].keys())
