"""The pretrained model a fine-tuning run starts from (``--init-from``), and its identity.

A base is any GPT language model :func:`~scratchgpt.checkpoints.io.load_model` reads: a run
directory or ``.pt`` file, a Hugging Face GPT-2 directory, or ``hf:ID``. Its *identity* is the
sha256 of its weights (every tensor, in name order, with its name, dtype and shape), so a run
records exactly which weights it started from, and an adapter refuses any other base.

:class:`BaseInit` gives a run its initial weights: the new model is built with the run's seed
(so its new parts, a classification head or LoRA's ``A``, start the same in every process and
every time), then the base's weights are copied into it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from scratchgpt.errors import CheckpointError, ConfigError, DataError, naming
from scratchgpt.models import ModelConfig, build_model, model_type
from scratchgpt.models.gpt import GPT, GPTConfig
from scratchgpt.wording import a_kind

# parameter names a fine-tuned model adds to its base's (they start from the seed, not the base)
NEW_PARAMETERS = ("lora_A", "lora_B", "head.")


def weights_identity(state: dict[str, Tensor]) -> str:
    """sha256 of a state dict: names, dtypes, shapes and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


@dataclass
class Base:
    """A loaded base model: ``source`` as the user named it, its GPT config, weights (a GPT's
    state dict), tokenizer and identity."""

    source: str
    config: GPTConfig
    state: dict[str, Tensor]
    tokenizer: Any
    identity: str

    def record(self) -> dict[str, str]:
        """What a run's checkpoints keep about their base (``data["base"]``): a local base
        by its absolute path, so that its adapter finds it from any directory."""
        local = Path(self.source)
        return {"source": str(local.resolve()) if local.exists() else self.source,
                "identity": self.identity}


def load_base(source: str, flag: str | None = "--init-from") -> Base:
    """The GPT at ``source`` (see the module docstring); one-line errors for anything else,
    naming ``flag``, the flag that gave ``source`` (None: it came from no flag, e.g. from
    what an adapter records)."""
    from scratchgpt.checkpoints.io import load_model

    with naming(flag):
        model, where = load_model(source)
    if not isinstance(model, GPT):
        named = f"{flag} {source}:" if flag else f"{source}"
        raise CheckpointError(f"{named} holds {a_kind(where.model_type)} model; fine-tuning starts "
                              "from a GPT language model")
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return Base(source, model.config, state, where.tokenizer(), weights_identity(state))


def check_base_tokenizer(base: Base, tokenizer: Any, what: str) -> None:
    """``what`` (a dataset) was tokenized by the base's own tokenizer, entry for entry."""
    if not tokenizer.same_as(base.tokenizer):
        mine, theirs = _describe(tokenizer), _describe(base.tokenizer)
        if mine == theirs:  # as large, with other entries
            theirs = "a different one of the same size"
        raise DataError(f"{what} is tokenized with {mine}, but --init-from {base.source} uses "
                        f"{theirs}; prepare the text with the base's tokenizer (scratchgpt "
                        f"prepare --data TEXT --tokenizer-from {base.source} --out DIR)")


def _describe(tokenizer: Any) -> str:
    return f"a {tokenizer.kind} tokenizer of {tokenizer.vocab_size:,} ids"


def map_base_state(base_state: dict[str, Tensor], model_type: str) -> dict[str, Tensor]:
    """The base's tensors under the names they have in a model of ``model_type`` (a
    classifier holds its GPT as ``gpt``)."""
    prefix = "gpt." if model_type == "gpt-classifier" else ""
    return {prefix + k: v for k, v in base_state.items()}


def initial_model(config: ModelConfig, base_state: dict[str, Tensor], seed: int) -> nn.Module:
    """A model of ``config`` built with ``seed``, the base's weights copied in. Anything but
    the new parameters missing, or any base tensor left over, is an error (the base does not
    fit the model)."""
    torch.manual_seed(seed)
    model = build_model(config)
    mapped = map_base_state(base_state, model_type(config))
    missing, unexpected = model.load_state_dict(mapped, strict=False)
    wrong = [k for k in missing if not any(n in k for n in NEW_PARAMETERS)] + unexpected
    if wrong:
        raise CheckpointError(f"the base's weights do not fit the model: {wrong[0]!r}")
    return model


class BaseInit:
    """The initial weights of a fine-tuning run (``TrainJob.init``), picklable for the
    processes of a data-parallel run: each reads the base itself and checks its identity."""

    def __init__(self, base: Base, config: ModelConfig, seed: int):
        self.source, self.identity, self.config, self.seed = (base.source, base.identity,
                                                              config, seed)
        self._base_state: dict[str, Tensor] | None = base.state  # not sent to other processes
        self._state: dict[str, Tensor] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_base_state": None, "_state": None}

    def base_state(self) -> dict[str, Tensor]:
        if self._base_state is None:
            base = load_base(self.source)
            if base.identity != self.identity:
                raise CheckpointError(f"--init-from {self.source} changed since the run was "
                                      "planned (its weights have another sha256)")
            self._base_state = base.state
        return self._base_state

    def model(self) -> nn.Module:
        """The initial model (its state is kept for :meth:`__call__`)."""
        model = initial_model(self.config, self.base_state(), self.seed)
        self._state = model.state_dict()
        return model

    def __call__(self) -> dict[str, Tensor]:
        if self._state is None:
            self.model()
        return self._state


def check_out_is_not_the_base(out: Path, source: str, what: str) -> None:
    """A run never writes over the model it starts from (``source``, named by ``what``: the
    flag that gave it, or how it was found): its --overwrite would delete its own base (and
    an adapter would then name a base that is gone)."""
    path = Path(source)
    if not path.exists():
        return  # hf:ID, or a path the loader will refuse
    home = path if path.is_dir() else path.parent
    if out.resolve() == home.resolve():
        raise ConfigError(f"--out {out} holds {what} {source}: the new run would replace the "
                          "model it starts from; give another --out")
