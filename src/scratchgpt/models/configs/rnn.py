"""The recurrent models' hyperparameters: plain data, no torch (the models are
``models/rnn.py``).

:class:`RecurrentConfig` is a recurrent language model's shape; the registry names one class per
cell (``rnn``, ``lstm``, ``gru``: :func:`cell_config`). :class:`RecurrentClassifierConfig` is the
shape of a sequence classifier.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, make_dataclass
from typing import Any

from scratchgpt.errors import ConfigError
from scratchgpt.validation import check_range, refuse_unknown_fields

CELLS = ("rnn", "lstm", "gru")
# How the recurrence runs: torch's fused modules, or the cells of models/rnn.py written from
# their equations (see Recurrent there).
CELL_IMPLS = ("torch", "scratch")
# The largest forget-gate bias taken, either sign: from about 17 on, sigmoid rounds to 1 in
# float32, so a bias beyond 100 starts the gate no more open (or shut) than 100 does; far
# beyond it (1e300) the bias does not fit in a float32 parameter at all.
FORGET_BIAS_MAX = 100.0


@refuse_unknown_fields
@dataclass
class RecurrentConfig:
    """Shape of a :class:`~scratchgpt.models.rnn.RecurrentLM`. The embedding width equals
    ``hidden``.

    ``block_size`` is only the training sequence length (backpropagation through time runs over
    that many steps); the model itself reads sequences of any length.
    """

    vocab_size: int
    cell: str = "lstm"
    n_layer: int = 2
    hidden: int = field(default=256, metadata={
        "help": "recurrent models: width of the hidden state and of the embedding"})
    dropout: float = 0.0
    block_size: int = 256
    cells: str = field(default="torch", metadata={
        "help": "recurrent models: 'torch' runs torch's fused RNN/LSTM/GRU kernels, 'scratch' "
                "the cells of models/rnn.py written from their equations, one time step at a "
                "time (same weights and results to float tolerance, several times slower; see "
                "'scratchgpt bench recurrent')"})

    def __post_init__(self) -> None:
        if self.cell not in CELLS:
            raise ConfigError(f"cell must be one of {CELLS}, got {self.cell!r}")
        if self.cells not in CELL_IMPLS:
            raise ConfigError(f"cells must be one of {', '.join(CELL_IMPLS)}, got {self.cells!r}")
        for name in ("vocab_size", "n_layer", "hidden", "block_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        check_range("dropout", self.dropout, 0, 1, high_open=True)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cell_config(cell: str) -> type[RecurrentConfig]:
    """:class:`RecurrentConfig` with ``cell`` fixed (``init=False``), for the model registry.

    The model type names the cell (``--model lstm``), so ``cell`` is not a hyperparameter there:
    fields with ``init=False`` get no command-line flag and are not accepted in a config dict.
    """
    if cell not in CELLS:
        raise ValueError(f"cell must be one of {CELLS}, got {cell!r}")
    name = f"{cell.upper()}Config"
    if name in globals():  # one class per cell, so that configs compare equal
        return globals()[name]
    cls = make_dataclass(name, [("cell", str, field(default=cell, init=False))],
                         bases=(RecurrentConfig,))
    cls.__module__ = __name__
    cls.__doc__ = f"A {cell.upper()} language model's shape (see RecurrentConfig)."
    # a module attribute under its own name: pickle finds classes that way, and --nproc
    # sends a run's config to its processes pickled
    globals()[name] = cls
    return cls


# The config of each cell, defined here so that pickle finds them in a fresh process.
RNNConfig, LSTMConfig, GRUConfig = (cell_config(cell) for cell in CELLS)


@refuse_unknown_fields
@dataclass
class RecurrentClassifierConfig:
    """Shape of a :class:`~scratchgpt.models.rnn.RecurrentClassifier`: a sequence of
    ``vocab_size`` symbols in, one of ``n_classes`` out. ``forget_bias`` (LSTM only) starts
    every forget gate at that bias."""

    vocab_size: int
    n_classes: int
    cell: str = "lstm"
    hidden: int = 64
    embed_dim: int = 16
    forget_bias: float | None = None
    cells: str = "torch"  # "torch": fused kernels; "scratch": the cell equations of models/rnn.py

    def __post_init__(self) -> None:
        if self.cell not in CELLS:
            raise ConfigError(f"cell must be one of {CELLS}, got {self.cell!r}")
        if self.cells not in ("torch", "scratch"):
            raise ConfigError(f"cells must be 'torch' or 'scratch', got {self.cells!r}")
        for name in ("vocab_size", "n_classes", "hidden", "embed_dim"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        check_range("forget_bias", self.forget_bias, -FORGET_BIAS_MAX, FORGET_BIAS_MAX)
