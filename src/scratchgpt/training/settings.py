"""A run's settings, layered from their sources and checked against a run being resumed.

A new run: dataclass defaults < ``--preset`` < ``--config`` file < flags. The settings name the
model type (``model``), its hyperparameters (fields of its config class), the training
settings (fields of :class:`TrainConfig`) and the ``dataset``.

A resumed run takes everything from its ``last.pt`` (the one source of truth). Settings given
again apply when they may change mid-run (iterations, learning rate, budget, evaluation
cadence, precision, threads, dropout, the optimizer's betas, weight decay and rate scales,
and a recurrent model's ``cells``: its torch kernels or the equations, on the same weights);
those that cannot (the model's type and shape, the optimizer, whose state is saved) are an
error when given with a different value. A run that its time budget ended, resumed with
``--max-iters`` and no ``--time-budget``, trains on to the new ``--max-iters``; with its spent
budget given again as well, it is refused (the budget would stop it before the updates asked
for), as a budget no longer than it has trained is. The learning-rate schedule keeps the length
the run had (its ``lr_decay_iters``, the ``max_iters`` it began with, or where its budget ended
it) unless ``--lr-decay-iters`` is given: a run given more updates trains on at ``min_lr``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scratchgpt.errors import CheckpointError, ConfigError
from scratchgpt.models import LM_CONFIGS, ModelConfig, config_dict, config_fields, model_config
from scratchgpt.models.configs.lora import LoRAConfig
from scratchgpt.training.config import PRESETS, TrainConfig, load_config_file, train_fields
from scratchgpt.validation import (
    FLAGS,
    check_range,
    keywords,
    named,
    refuse_unknown,
    rename_setting,
)
from scratchgpt.wording import a_kind

if TYPE_CHECKING:  # (the settings are named and checked without torch, which it imports)
    from scratchgpt.checkpoints.io import Checkpoint

# Model hyperparameters that may change when a run resumes (they hold no learned state).
CHANGEABLE_MODEL_FIELDS = {"dropout", "attn_dropout", "embd_dropout"}
# ...and those that choose only how the model runs, on the parameters it has either way: a
# recurrent model's cells (torch's fused modules own the weights that the cells written from
# their equations read), switched on resume as the precision is.
RESUME_SWITCHES = CHANGEABLE_MODEL_FIELDS | {"cells"}


def model_fields() -> set[str]:
    """Every hyperparameter name of every language model (except the data's vocab_size)."""
    return set().union(*(config_fields(t) for t in LM_CONFIGS)) - {"vocab_size"}


def known_settings() -> set[str]:
    return train_fields() | model_fields() | {"model", "dataset"}


@dataclass
class Settings:
    """What the user asked for, by source; ``given`` = preset < file < flags merged."""

    preset: str | None = None
    config_file: str | None = None
    flags: dict[str, Any] | None = None
    # How refusals name a setting: by the command's flags (and the config file's keys), or by
    # the Python API's keywords (validation.KEYWORDS) for scratchgpt.train
    options: Mapping[str, str] = field(default_factory=lambda: FLAGS)

    @property
    def explicit(self) -> dict[str, Any]:
        """What the config file and the flags set (the preset left out)."""
        return {**self._from_file, **(self.flags or {})}

    @functools.cached_property
    def _from_file(self) -> dict[str, Any]:
        """The config file's settings, checked; read once (a run's settings are named and
        layered many times over)."""
        from_file = load_config_file(self.config_file) if self.config_file else {}
        # the keys as the file spells them, with the setting a lone typo nearly reads as
        refuse_unknown(from_file, known_settings(), f"config file {self.config_file}")
        for name in ("model", "dataset"):  # (the rest is checked by the config classes)
            if name in from_file and not isinstance(from_file[name], str):
                raise ConfigError(f"{self.config_file}: {name} must be a string, got "
                                  f"{from_file[name]!r}")
        budget = from_file.get("time_budget")
        if isinstance(budget, (int, float)) and not isinstance(budget, bool):
            from_file["time_budget"] = self._seconds(budget)  # a number in a file: seconds
        return from_file

    def _seconds(self, budget: float) -> str:
        """A config file's ``time_budget`` given as a number, checked as one (``inf`` was
        read as the duration "infs"), as the duration of so many seconds."""
        try:
            check_range("time_budget", budget, 0, low_open=True)
        except ConfigError as e:
            raise ConfigError(rename_setting(str(e), lambda k: f"{k} in {self.config_file}")
                              ) from None
        return f"{budget}s"

    @property
    def given(self) -> dict[str, Any]:
        """Everything set: preset < config file < flags."""
        return {**(dict(PRESETS[self.preset]) if self.preset else {}), **self.explicit}

    def name_of(self, key: str) -> str:
        """How the user wrote the setting ``key``: its flag, or its key in the config file.

        >>> Settings(flags={"n_embd": 64}).name_of("n_embd")
        '--n-embd'
        """
        return self._file_key(key) or named(self.options, key)

    def _file_key(self, key: str) -> str | None:
        """``key`` as the config file names it ("n_layer in c.toml"), where the file set it
        and no flag overrode it; else None."""
        if key in self._from_file and key not in (self.flags or {}):
            return f"{key} in {self.config_file}"
        return None

    @contextlib.contextmanager
    def naming_errors(self) -> Iterator[None]:
        """A config's refusal of a setting the config file gave names the file's key and the
        file ("batch_size in c.toml must be >= 1"); one of a flag is left for the command line
        to name as typed."""
        try:
            yield
        except ConfigError as e:
            raise ConfigError(rename_setting(str(e), self._file_key)) from None

    def sources(self) -> dict[str, Any]:
        return {"preset": self.preset, "config_file": self.config_file}


def new_run(settings: Settings) -> tuple[str, dict[str, Any], TrainConfig, str | None]:
    """(model type, model hyperparameters, training config, dataset) of a new run. The model
    config is built once the dataset gives its vocabulary size (:func:`finish_model_config`)."""
    given = settings.given
    kind = given.get("model", "gpt")
    if kind not in LM_CONFIGS:
        raise ConfigError(f"unknown model {kind!r}; choose from {', '.join(LM_CONFIGS)}")
    fields = config_fields(kind)
    wrong = sorted(k for k in settings.explicit if k in model_fields() - fields)
    if wrong:
        raise ConfigError(f"the {kind} model does not take "
                          + ", ".join(settings.name_of(k) for k in wrong))
    model_values = {k: v for k, v in given.items() if k in fields and k != "vocab_size"}
    with settings.naming_errors():
        train = TrainConfig(**{k: v for k, v in given.items() if k in train_fields()})
    check_flags_apply(settings.explicit, train)
    return kind, model_values, train, given.get("dataset")


# training settings that only one choice of another uses: (the setting, what it needs)
DEPENDENT_SETTINGS = (("decay_fraction", "schedule", "wsd"),
                      ("muon_lr_scale", "optimizer", "muon"),
                      ("muon_dtype", "optimizer", "muon"))


def check_flags_apply(explicit: dict[str, Any], train: TrainConfig,
                      options: Mapping[str, str] = FLAGS) -> None:
    """A setting given for a choice the run did not make is refused, not ignored
    (``--decay-fraction`` under the cosine schedule, ``--muon-lr-scale`` with AdamW). One at
    its default changes nothing either way (a whole config handed over, as the library's
    ``train`` does, names every setting)."""
    defaults = TrainConfig()
    for name, on, needs in DEPENDENT_SETTINGS:
        if explicit.get(name, getattr(defaults, name)) != getattr(defaults, name) \
                and getattr(train, on) != needs:
            raise ConfigError(f"{named(options, name)} applies with "
                              f"{named(options, on, needs)}; this run has "
                              f"{named(options, on, getattr(train, on))}")


def finish_model_config(kind: str, values: dict[str, Any], vocab_size: int) -> ModelConfig:
    return model_config(kind, **{**values, "vocab_size": vocab_size})


def _sources(settings: Settings, names: list[str]) -> str:
    """Where the settings ``names`` came from, as what to drop: their flags (or the config
    file's keys), or ``--preset`` when the preset set them."""
    explicit = settings.explicit
    flags = [settings.name_of(k) for k in names if k in explicit]
    if settings.preset and any(k not in explicit for k in names):
        flags.append("--preset")
    return " ".join(flags)


def _undo(settings: Settings, names: list[str], own: Mapping[str, Any]) -> str:
    """What gives the settings ``names`` the run's own values (``own``) back: drop their flags
    (:func:`_sources`), or, from Python, where a config names every setting, give them."""
    if keywords(settings.options):
        return "give " + ", ".join(named(settings.options, k, own[k]) for k in names)
    return f"drop {_sources(settings, names)}"


# The tasks of 'scratchgpt finetune', as its runs record them (finetune/plan.py takes them
# from here: this module cannot import it, which imports this one)
FINETUNE_TASKS = ("classify", "instruct")
# The command that trains (and so resumes) each kind of run; a language model's run is
# train's, a run that records a fine-tuning task finetune's.
RESUME_COMMANDS = {"seq2seq": "scratchgpt seq2seq train", "finetune": "scratchgpt finetune",
                   "train": "scratchgpt train"}


def run_kind(checkpoint: Checkpoint) -> str:
    """Which command's run ``checkpoint`` is: a key of :data:`RESUME_COMMANDS`."""
    if checkpoint.model_type == "seq2seq":
        return "seq2seq"
    return "finetune" if checkpoint.data.get("task") in FINETUNE_TASKS else "train"


def check_resumed_by(checkpoint: Checkpoint, kind: str) -> None:
    """A run is resumed by the command that trains its kind: another would read its model
    with the wrong task (a traceback, or an instruction run trained as plain text)."""
    own = run_kind(checkpoint)
    if own != kind:
        raise CheckpointError(f"{checkpoint.path} is {a_kind(checkpoint.model_type)} run of "
                              f"'{RESUME_COMMANDS[own]}'; resume it with "
                              f"'{RESUME_COMMANDS[own]} --out {Path(checkpoint.path).parent} "
                              "--resume'")


def resumed_run(checkpoint: Checkpoint, settings: Settings) -> tuple[ModelConfig, TrainConfig]:
    """The model and training config to resume with: the checkpoint's, with the changeable
    settings given now applied (see the module docstring)."""
    if checkpoint.train_config is None or checkpoint.state is None:
        raise ConfigError(f"{checkpoint.path} holds a model but no training state; it cannot "
                          "be resumed (start a new run from it instead)")
    given = settings.given
    saved_model = config_dict(checkpoint.model_config)
    own = backbone_settings(saved_model)
    _check_kept(checkpoint, own, settings)
    own.update({k: v for k, v in given.items() if k in RESUME_SWITCHES})
    train_changes = {k: v for k, v in given.items() if k in train_fields()}
    with settings.naming_errors():
        config = model_config(checkpoint.model_type, **saved_model)  # (own is inside it)
        train = replace(checkpoint.train_config, **train_changes)  # (checks the values' types)
    check_flags_apply(settings.explicit, train, settings.options)
    _check_changes_can_apply(checkpoint, train, settings)
    return config, _keep_decay_length(checkpoint, _lift_spent_budget(checkpoint, train,
                                                                      settings), settings)


def backbone_settings(saved_model: dict[str, Any]) -> dict[str, Any]:
    """The language model's own settings in a run's model config (as :func:`config_dict`
    gives it): the config itself, or the GPT inside a LoRA or classifier run's (the same
    dict, so that a change made to it is made to ``saved_model``)."""
    inner = saved_model.get("gpt")
    return inner if isinstance(inner, dict) else saved_model


def _check_kept(checkpoint: Checkpoint, own: dict[str, Any], settings: Settings) -> None:
    """The model (``own``: its settings), optimizer and seed stay as the run began, and a
    model setting this run's model does not have is refused rather than ignored. The seed
    too: the batches and dropout continue from the saved generators, and a new seed would
    change only which batches the evaluations draw (and so which step is best)."""
    given = settings.given
    fixed = {"model": checkpoint.model_type, "optimizer": checkpoint.train_config.optimizer,
             "seed": checkpoint.train_config.seed,
             **{k: v for k, v in own.items() if k not in RESUME_SWITCHES}}
    lora = getattr(checkpoint.model_config, "lora", None)
    if lora is not None:  # (a LoRA run's adapters, as the Python API's config gives them)
        fixed["lora"] = lora
    changed = sorted(k for k, v in given.items() if k in fixed and not _same_kept(v, fixed[k]))
    if changed:
        was = ", ".join(named(settings.options, k, fixed[k]) for k in changed)
        raise ConfigError(f"a resumed run keeps its model, optimizer and seed: this run has "
                          f"{was} ({_undo(settings, changed, fixed)}, or start a new run)")
    foreign = sorted(k for k in given if k in model_fields() and k not in own)
    if foreign:
        raise ConfigError(f"this run's {checkpoint.model_type} model does not take "
                          + ", ".join(settings.name_of(k) for k in foreign))


def _same_kept(given: Any, own: Any) -> bool:
    """Whether a setting a resumed run keeps is given its run's value: LoRA adapters with the
    same rank, alpha and dropout on the same layers (``targets='mlp,attn'`` adapts those of
    ``'attn,mlp'``), any other setting equal."""
    if isinstance(own, LoRAConfig) and isinstance(given, LoRAConfig):
        return (given.rank, given.alpha, given.dropout, set(given.target_layers())) == \
            (own.rank, own.alpha, own.dropout, set(own.target_layers()))
    return bool(given == own)


def _check_changes_can_apply(checkpoint: Checkpoint, train: TrainConfig,
                             settings: Settings) -> None:
    """Changes a resumed run cannot honour: fewer updates than it has made, and
    ``--embed-lr-scale`` to or from 1 (at 1 the embedding tables share the matrices'
    optimizer group, otherwise they have one of their own, and the saved optimizer state has
    the groups it was saved with)."""
    step, own, options = checkpoint.state.step, checkpoint.train_config.to_dict(), \
        settings.options
    if train.max_iters < step:
        raise ConfigError(f"this run is already at update {step}: "
                          f"{named(options, 'max_iters', train.max_iters)} would end it before "
                          f"where it is (give more than {step} to train on, or "
                          f"{_undo(settings, ['max_iters'], own)} to finish as planned)")
    _check_budget_can_apply(checkpoint, train, settings)
    saved, now = checkpoint.train_config.embed_lr_scale, train.embed_lr_scale
    if (now == 1.0) != (saved == 1.0):
        keeps = "1" if saved == 1.0 else "a value other than 1"
        raise ConfigError(f"a run started with {named(options, 'embed_lr_scale', saved)} keeps "
                          f"{keeps} (the embedding tables' optimizer group is saved as it "
                          f"was): this run has {named(options, 'embed_lr_scale', now)} "
                          f"({_undo(settings, ['embed_lr_scale'], own)}, or start a new run)")


def _check_budget_can_apply(checkpoint: Checkpoint, train: TrainConfig,
                            settings: Settings) -> None:
    """A ``--time-budget`` no longer than the run has already trained would end it where it
    is, training nothing: refused, as a ``--max-iters`` below its step is. The budget it was
    started with, given again, is a run that has finished as planned (its note says how to go
    on), unless a new ``--max-iters`` asks it to train on: that budget is then in the way."""
    budget, elapsed = train.time_budget_s, checkpoint.state.elapsed_s
    if budget is None or budget > elapsed or "time_budget" not in settings.given:
        return
    own = train.time_budget == checkpoint.train_config.time_budget
    extends = _extends(checkpoint, train, settings)
    if own and not (extends and train.max_iters != checkpoint.train_config.max_iters):
        return
    given = named(settings.options, "time_budget", train.time_budget)
    until = named(settings.options, "max_iters", train.max_iters)
    what = (f"{given} is used up: it would stop the run before {until}" if own
            else f"{given} would end it before where it is")
    raise ConfigError(f"this run has already trained for {elapsed:.1f} s: {what} (give more "
                      f"than {elapsed:.1f}s, or '' for no budget"
                      f"{_drop_budget(checkpoint, train, settings, extends)})")


def _drop_budget(checkpoint: Checkpoint, train: TrainConfig, settings: Settings,
                 extends: bool) -> str:
    """The remedy of a budget refused on resume that drops it, and what the run then does;
    none from Python, whose config gives every setting ('' is its default budget)."""
    if keywords(settings.options):
        return ""
    after = (f"train to --max-iters {train.max_iters}" if extends and _lifts(checkpoint, train)
             else "keep the run's own")
    return f", or drop {_sources(settings, ['time_budget'])} to {after}"


def _extends(checkpoint: Checkpoint, train: TrainConfig, settings: Settings) -> bool:
    """Whether the settings ask a resumed run to train on: a ``--max-iters`` above its step."""
    return "max_iters" in settings.given and train.max_iters > checkpoint.state.step


def _lifts(checkpoint: Checkpoint, train: TrainConfig) -> bool:
    """Whether the run's own time budget is used up, so that a resume that extends it and
    gives no budget trains on without one (:func:`_lift_spent_budget`)."""
    own = checkpoint.train_config.time_budget_s
    return own is not None and checkpoint.state.elapsed_s >= own


def _lift_spent_budget(checkpoint: Checkpoint, train: TrainConfig,
                       settings: Settings) -> TrainConfig:
    """A run that ended on its time budget, resumed with a larger ``--max-iters`` and no
    ``--time-budget``, trains on to the new --max-iters: the budget it has used up would stop
    it before a single update (a budget not yet used up still applies; one given again is
    refused by :func:`_check_budget_can_apply`)."""
    if "time_budget" in settings.given or not _extends(checkpoint, train, settings) \
            or not _lifts(checkpoint, train):
        return train
    return replace(train, time_budget="")


def _keep_decay_length(checkpoint: Checkpoint, train: TrainConfig,
                       settings: Settings) -> TrainConfig:
    """A resumed run's learning-rate schedule keeps the length it had unless a decay length
    is given (from Python, whose ``cfg`` gives every setting, a nonzero one): its
    ``lr_decay_iters``, else the ``max_iters`` it was started with, or, where its spent
    time budget ended it past its warmup and no longer applies, the step it ended at (the
    budget had brought its rate down by then). A larger ``max_iters`` then trains on at
    ``min_lr`` past it: the schedule followed the new ``max_iters``, and a run that had
    finished its decay went back up to a rate it had left behind."""
    asked = settings.given.get("lr_decay_iters")
    if asked or (asked is not None and not keywords(settings.options)):
        return train  # (--lr-decay-iters 0 typed: over --max-iters, as it says)
    length, step = checkpoint.train_config.decay_iters, checkpoint.state.step
    if train.time_budget_s is None and _lifts(checkpoint, train) and step > train.warmup_iters:
        length = min(length, step)
    return train if train.decay_iters == length else replace(train, lr_decay_iters=length)
