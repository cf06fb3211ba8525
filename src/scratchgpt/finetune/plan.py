"""Fine-tuning jobs: planned and checked first, then run by the training core.

:func:`plan` turns ``scratchgpt finetune`` into a :class:`~scratchgpt.training.job.TrainJob`
(classification or instruction tuning from a base), :func:`plan_continued` does the same for
``scratchgpt train --init-from`` (continued pretraining on new text). Everything is checked
before a file is written: the base, the data (its labels, records, roles, tokenizer), the
settings. The jobs then run through ``training/job.py``: progress, metrics, checkpoints, exact
resume, time budgets, data-parallel processes and Ctrl-C come from the core, and
:func:`finish_run` writes what a fine-tuning run adds at its end (the test report and
``confusion.png`` of a classifier, the ``adapter.pt`` of a LoRA run).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from scratchgpt.checkpoints.io import (
    Checkpoint,
    atomic_write_text,
    load_checkpoint,
    model_from_checkpoint,
)
from scratchgpt.checkpoints.rundir import RunDir
from scratchgpt.errors import ConfigError
from scratchgpt.finetune import classify, instruct
from scratchgpt.finetune.base import (
    Base,
    BaseInit,
    check_base_tokenizer,
    check_out_is_not_the_base,
    load_base,
)
from scratchgpt.finetune.data import TASK_DATASETS, Log
from scratchgpt.finetune.defaults import DEFAULT_EPOCHS, LEARNING_RATES, TRAIN_DEFAULTS
from scratchgpt.models import ModelConfig
from scratchgpt.models.classifier import GPTClassifierConfig
from scratchgpt.models.gpt import GPTConfig
from scratchgpt.models.lora import GPTLoRAConfig, LoRAConfig, count_parameters
from scratchgpt.training.config import TrainConfig, train_fields
from scratchgpt.training.epochs import steps_per_epoch
from scratchgpt.training.job import TrainJob, check_device, check_resources, lm_task
from scratchgpt.training.optim import muon_matrices
from scratchgpt.training.settings import (
    CHANGEABLE_MODEL_FIELDS,
    FINETUNE_TASKS,
    Settings,
    check_resumed_by,
    model_fields,
    resumed_run,
)
from scratchgpt.training.trainer import TrainResult, check_no_curriculum
from scratchgpt.validation import FLAGS, flag_of, rename_setting
from scratchgpt.wording import plural

TASKS = FINETUNE_TASKS


@dataclass
class FinetuneRequest:
    """What ``scratchgpt finetune`` was asked (see its --help)."""

    task: str | None = None
    init_from: str | None = None
    out: str | None = None
    data: str | None = None
    dataset: str | None = None
    resume: bool = False
    overwrite: bool = False
    train_flags: dict[str, Any] = field(default_factory=dict)
    policy: str = "all"  # classify: all, head or last-k (LoRA: lora)
    last_k: int = 2  # with policy "last-k"
    lora: LoRAConfig | None = None
    epochs: float = DEFAULT_EPOCHS
    class_weights: str = "none"
    max_length: int = 0
    split_seed: int = 0
    held_out: float = 0.1
    eval_generate: int = 0
    dropout: float | None = None
    # the flags above given on the command line (a resume refuses a value other than the
    # run's; a task those of the other task), as the user wrote them: "--train", "--lora", ...
    given_flags: tuple[str, ...] = ()
    # the base at init_from when the caller has loaded it already (bench finetune, which
    # checks its --base before writing anything): not loaded a second time
    base: Base | None = None
    # instruct: a progress bar on stderr while the --eval-generate replies are generated,
    # before and after training, once they take a second (the caller's choice: off here)
    progress: bool = False


# ---- the task of a run, made in each process that trains


class TaskFactory:
    """Makes a run's task (``TrainJob.task``) from its data record; picklable. The task the
    plan built is reused in the planning process, and rebuilt in any other, in the state the
    planning process left it (the base's figures :func:`starting_figures` measured, which
    rank 0 saves in the run's checkpoints)."""

    def __init__(self, kind: str, record: dict[str, Any], tokenizer: Any,
                 extra: dict[str, Any], block_size: int, task: Any = None,
                 progress: bool = False):
        self.kind, self.record, self.tokenizer = kind, record, tokenizer
        self.extra, self.block_size, self._task = extra, block_size, task
        self.progress = progress
        self._state: dict[str, Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # (every process of a data-parallel run evaluates: none of them draws a bar)
        state = None if self._task is None else self._task.state_dict()
        return {**self.__dict__, "_task": None, "_state": state, "progress": False}

    def __call__(self) -> Any:
        if self._task is None:
            self._task = make_task(self.kind, self.record, self.tokenizer, self.extra,
                                   self.block_size, progress=self.progress)
            if self._state is not None:
                self._task.load_state_dict(self._state)
        return self._task


def _spec(cls: type, record: dict[str, Any]) -> Any:
    return cls(**{k: v for k, v in record.items() if k in cls.__dataclass_fields__})


def make_task(kind: str, record: dict[str, Any], tokenizer: Any, extra: dict[str, Any],
              block_size: int, log: Log = None, progress: bool = False) -> Any:
    """The task of a run from what it records about its data (``progress``: an instruction
    task's bar while it generates replies)."""
    if kind == "classify":
        spec = _spec(classify.ClassifySpec, record)
        data = classify.load_data(spec, tokenizer, block_size, log)
        return classify.ClassifyTask(data, tokenizer, spec.class_weights, extra)
    data = instruct.load_data(_spec(instruct.InstructSpec, record), tokenizer, block_size, log)
    return instruct.InstructTask(data, tokenizer, extra, progress)


# ---- settings


def check_epochs(epochs: float) -> None:
    """--epochs is a finite number of passes above 0."""
    if not 0 < epochs < math.inf:
        raise ConfigError(f"--epochs must be > 0, got {epochs:g}")


def train_config(kind: str, policy: str, n_train: int, n_val: int, flags: dict[str, Any],
                 epochs: float) -> TrainConfig:
    """Training settings: :data:`TRAIN_DEFAULTS` < flags, with ``epochs`` passes over the
    training split (unless --max-iters), an evaluation per epoch and over all of the
    validation split, unless flags say otherwise."""
    check_epochs(epochs)
    values = {**TRAIN_DEFAULTS[kind], "learning_rate": LEARNING_RATES[policy], **flags}
    TrainConfig(**values)  # the flags checked (a batch size of 0 ...) before they divide
    batch = values["batch_size"]
    global_batch = batch * values.get("nproc", 1) * values.get("grad_accum", 1)
    per_epoch = steps_per_epoch(n_train, global_batch)
    values.setdefault("max_iters", max(1, math.ceil(epochs * per_epoch)))
    values.setdefault("eval_interval", per_epoch)
    values.setdefault("eval_iters", steps_per_epoch(n_val, batch))
    values.setdefault("warmup_iters", min(100, values["max_iters"] // 20))
    values.setdefault("min_lr", values["learning_rate"] / 10)
    values["log_interval"] = min(values["log_interval"], per_epoch)
    return TrainConfig(**values)


def _gpt_config(base: Base, changes: dict[str, Any]) -> GPTConfig:
    """The base's config with the dropouts of ``changes`` (the fields that hold no learned
    state, :data:`CHANGEABLE_MODEL_FIELDS`) set anew."""
    return dataclasses.replace(base.config, **{k: v for k, v in changes.items()
                                               if k in CHANGEABLE_MODEL_FIELDS})


def describe_parameters(model: torch.nn.Module, optimizer: str = "adamw") -> str:
    """'trainable parameters: N of M (p%); optimizer state (AdamW, fp32) X MiB' of ``model``:
    AdamW keeps two values per trainable parameter; with ``optimizer="muon"``, Muon keeps one
    (its momentum) for each weight of the hidden matrices it trains, AdamW two for the rest."""
    trainable, total = count_parameters(model)
    values, name = 2 * trainable, "AdamW"
    if optimizer == "muon":
        values -= sum(p.numel() for p in muon_matrices(model))
        name = "Muon and AdamW"
    return (f"trainable parameters: {trainable:,} of {total:,} ({trainable / total:.2%}); "
            f"optimizer state ({name}, fp32) {4 * values / 2**20:.2f} MiB")


# ---- scratchgpt finetune


def plan(req: FinetuneRequest, log: Log = print) -> TrainJob:
    """A checked fine-tuning job; nothing is written."""
    if req.resume and req.overwrite:
        raise ConfigError("--resume continues the run in --out and --overwrite replaces it; "
                          "give one of them")
    if req.resume:
        return _plan_resume(req, log)
    if req.task not in TASKS:
        raise ConfigError(_task_refusal(req.task, req.dataset))
    if not req.init_from:
        raise ConfigError("--init-from is required: the pretrained model to fine-tune (a run "
                          "directory, a .pt file, a Hugging Face GPT-2 directory or hf:ID)")
    if req.lora is not None and (req.policy != "all" or "--train" in req.given_flags):
        raise ConfigError(f"--train {req.policy} and {lora_named(req.given_flags)} are two ways "
                          "of choosing what trains; give one")
    flagged = _check_flags_fit_the_task(req)
    out = Path(req.out) if req.out else default_out(req.task, req.data, req.dataset)
    # refused before the base is loaded and evaluated: on a large base that is minutes
    check_out_is_not_the_base(out, req.init_from, "--init-from")
    RunDir(out).check_can_begin("overwrite" if req.overwrite else "new")
    base = req.base if req.base is not None and req.base.source == req.init_from \
        else load_base(req.init_from)
    gpt = _gpt_config(base, {} if req.dropout is None else {"dropout": req.dropout})
    if req.max_length > gpt.block_size:  # texts are never longer than the base can read
        raise ConfigError(f"--max-length {req.max_length} is longer than the base's context "
                          f"({gpt.block_size} tokens); give at most {gpt.block_size}, or 0 "
                          "for all of it")
    # the memory, before the data is read (a classifier's head counted for 2 classes, the
    # fewest: its labels, which the data gives, add a few weights)
    check_resources(flagged, _model_config(req, gpt))
    extra = {"base": base.record(), "epochs": req.epochs}  # (a resume compares --epochs)
    if req.task == "classify":
        task, config = _classify(req, base, gpt, extra, log)
        n_train, n_val = len(task.train_examples), len(task.examples.splits["val"])
    else:
        task, config = _instruct(req, base, gpt, extra, log)
        n_train, n_val = len(task.examples.train), len(task.examples.held_out)
    policy = "lora" if req.lora is not None else req.policy
    cfg = train_config(req.task, policy, n_train, n_val, req.train_flags, req.epochs)
    init = BaseInit(base, config, cfg.seed)
    model = init.model() if log is not None or cfg.optimizer == "muon" else None
    if cfg.optimizer == "muon":  # (refused before the base is evaluated, not after)
        muon_matrices(model)
    if log is not None:
        log(describe_parameters(model, cfg.optimizer))
    factory = TaskFactory(req.task, task.examples.record, base.tokenizer, extra, gpt.block_size,
                          task, req.progress)
    return TrainJob(out, "overwrite" if req.overwrite else "new", cfg, config, factory,
                    {"finetune": {"task": req.task, "init_from": req.init_from,
                                  "epochs": req.epochs}},
                    init=init, finish=partial(finish_run, verbose=log is not None))


def _task_refusal(task: str | None, dataset: str | None) -> str:
    """Why a run without a known task is refused: a task left out (it said '--task must be
    one of classify, instruct', as of a wrong one) is asked for, with what each task reads,
    and the task a named --dataset is data for."""
    if task is not None:
        return f"--task must be one of {', '.join(TASKS)}, got {task!r}"
    hint = next((f"; --dataset {dataset} is --task {t}'s data" for t, name in
                 TASK_DATASETS.items() if name == dataset), "")
    return ("--task is required: classify (texts with labels, for a classifier) or instruct "
            f"(instructions or chats, for a chat model){hint}")


def default_out(task: str, data: str | None, dataset: str | None) -> Path:
    """The run directory of a run started without --out: ``runs/TASK-DATA``, DATA the
    --dataset's name or the --data file's name without its suffix."""
    return Path("runs") / f"{task}-{dataset or Path(data or 'data').stem}"


def lora_named(flags: Sequence[str]) -> str:
    """How an error names the LoRA that ``flags`` turned on: ``--lora`` when it is among
    them, else the ``--lora-*`` flags among them, which imply it."""
    given = [f for f in flags if f.startswith("--lora-")]
    if "--lora" in flags or not given:
        return "--lora"
    return f"{' '.join(given)} ({'which implies' if len(given) == 1 else 'imply'} --lora)"


OTHER_TASKS_FLAGS = {"classify": ("--held-out", "--eval-generate"),
                     "instruct": ("--class-weights", "--last-k")}


def _check_flags_fit_the_task(req: FinetuneRequest) -> TrainConfig:
    """Flags of the other task, or of another way of training, are refused rather than
    ignored; and the device, with its precision, as a plain train checks them (before the base
    is loaded). Returns the training settings of the flags (the task's defaults, no epochs
    counted yet), whose batch size, device and optimizer the memory check reads."""
    other = [f for f in req.given_flags if f in OTHER_TASKS_FLAGS[req.task]]
    if other:
        task = "instruct" if req.task == "classify" else "classify"
        raise ConfigError(f"{' and '.join(other)} {'is' if len(other) == 1 else 'are'} for "
                          f"--task {task}; drop {'it' if len(other) == 1 else 'them'}")
    if "--last-k" in req.given_flags and req.policy != "last-k":
        raise ConfigError(f"--last-k chooses the blocks --train last-k trains; with "
                          f"--train {req.policy} it has no use")
    check_epochs(req.epochs)  # (before the data is read and summed up)
    cfg = TrainConfig(**{**TRAIN_DEFAULTS[req.task], **req.train_flags})
    check_no_curriculum(cfg)  # (a fine-tuning task goes through its examples epoch by epoch)
    check_device(cfg)  # --device cuda without a GPU, --dtype bf16 where it is emulated
    return cfg


def _classify(req: FinetuneRequest, base: Base, gpt: GPTConfig, extra: dict[str, Any],
              log: Log) -> tuple[classify.ClassifyTask, ModelConfig]:
    spec = classify.ClassifySpec(_absolute(req.data), req.dataset, split_seed=req.split_seed,
                                 class_weights=req.class_weights, max_length=req.max_length,
                                 options=FLAGS)
    data = classify.load_data(spec, base.tokenizer, gpt.block_size, log)
    task = classify.ClassifyTask(data, base.tokenizer, spec.class_weights, extra)
    config = _model_config(req, gpt, len(data.labels))
    if log is not None:
        sizes = data.record["split_sizes"]
        log(f"{data.record['source']}: {sum(sizes.values()):,} texts, labels "
            f"{', '.join(data.labels)}; split (seed {spec.split_seed}) train "
            f"{sizes['train']:,} / val {sizes['val']:,} / test {sizes['test']:,}")
    return task, config


def _instruct(req: FinetuneRequest, base: Base, gpt: GPTConfig, extra: dict[str, Any],
              log: Log) -> tuple[instruct.InstructTask, ModelConfig]:
    if req.policy != "all":
        raise ConfigError(f"--train {req.policy} is for --task classify; instruction tuning "
                          "trains all weights, or adapters with --lora")
    spec = instruct.InstructSpec(_absolute(req.data), req.dataset, split_seed=req.split_seed,
                                 held_out=req.held_out, max_length=req.max_length,
                                 eval_generate=req.eval_generate, options=FLAGS)
    data = instruct.load_data(spec, base.tokenizer, gpt.block_size, log)
    config = _model_config(req, gpt)
    if log is not None:
        sizes = data.record["split_sizes"]
        log(f"{data.record['source']}: train on "
            f"{plural(sizes['train'], 'conversation', grouped=True)}, {sizes['val']:,} held "
            f"out (seed {spec.split_seed}); template {spec.template}")
        if spec.eval_generate > sizes["val"]:  # (the exact match scores those there are)
            log(f"note: --eval-generate {spec.eval_generate} is more than the "
                f"{plural(sizes['val'], 'held-out conversation', grouped=True)}: the exact "
                f"match scores {sizes['val']:,} (a larger --held-out holds out more)")
    return instruct.InstructTask(data, base.tokenizer, extra, req.progress), config


def _model_config(req: FinetuneRequest, gpt: GPTConfig, n_classes: int = 2) -> ModelConfig:
    """The model a run of ``req`` trains from the GPT ``gpt``: a classifier of ``n_classes``
    (--task classify), else the GPT itself; with adapters for --lora."""
    if req.task != "classify":
        return gpt if req.lora is None else _with_lora(gpt, req.lora)
    policy = "lora" if req.lora is not None else req.policy
    # --last-k counts blocks only for --train last-k (its default, 2, would not fit a 1-layer
    # base that trains otherwise)
    last_k = req.last_k if policy == "last-k" else 1
    with lora_flags_named():  # (a --lora-rank wider than the base's layers)
        return GPTClassifierConfig(gpt, n_classes, policy, last_k, req.lora)


@contextlib.contextmanager
def lora_flags_named() -> Iterator[None]:
    """A LoRA config's refusal of one of its settings, which it names by field as a Python
    caller gives it (``rank must be >= 1``), names the ``--lora-*`` flag that gave it
    (``--lora-rank``). Kept to where a LoRA config is built: ``dropout`` is also a flag of
    the model's own."""
    try:
        yield
    except ConfigError as e:
        raise ConfigError(rename_setting(str(e), _lora_flag)) from None


def _lora_flag(name: str) -> str | None:
    return f"--lora-{name}" if name in LoRAConfig.__dataclass_fields__ else None


def _with_lora(gpt: GPTConfig, lora: LoRAConfig) -> GPTLoRAConfig:
    """The GPT ``gpt`` with the adapters the --lora flags ask for (a --lora-rank wider than
    its layers named by its flag)."""
    with lora_flags_named():
        return GPTLoRAConfig(gpt, lora)


def _absolute(data: str | None) -> str | None:
    """``--data`` as the run records it: absolute, so that --resume finds it from any
    directory."""
    return str(Path(data).resolve()) if data else None


def _resumed_out(req: FinetuneRequest) -> Path:
    """The run a resume continues: --out, else the directory the same command wrote without
    --out (:func:`default_out`), which its --task and --data (or --dataset) name."""
    if req.out:
        return Path(req.out)
    if req.task in TASKS and (req.data or req.dataset):
        return default_out(req.task, req.data, req.dataset)
    data = req.dataset or (Path(req.data).stem if req.data else "DATA")
    raise ConfigError("--resume needs the run to continue: --out DIR, or the --task and --data "
                      "(or --dataset) it was started with (a run started without --out is in "
                      f"runs/{req.task or 'TASK'}-{data})")


def _plan_resume(req: FinetuneRequest, log: Log) -> TrainJob:
    out = _resumed_out(req)
    checkpoint = RunDir(out).load_last()
    check_resumed_by(checkpoint, "finetune")
    check_given_again(req, checkpoint)
    kind = checkpoint.data["task"]
    dropout = {} if req.dropout is None else {"dropout": req.dropout}
    config, cfg = resumed_run(checkpoint, Settings(flags={**req.train_flags, **dropout}))
    check_resources(cfg, config)  # (as train's resume checks them: a --batch-size given now)
    tokenizer = checkpoint.tokenizer("text")
    extra = {k: checkpoint.data.get(k) for k in ("base", "epochs")}
    factory = TaskFactory(kind, checkpoint.data[kind], tokenizer, extra,
                          _gpt_of(config).block_size, progress=req.progress)
    return TrainJob(out, "resume", cfg, config, factory, {}, checkpoint,
                    finish=partial(finish_run, verbose=log is not None))


def _gpt_of(config: ModelConfig) -> GPTConfig:
    """The GPT of a fine-tuning run's model (a classifier's or LoRA model's backbone)."""
    return config.gpt if hasattr(config, "gpt") else config


def check_given_again(req: FinetuneRequest, checkpoint: Checkpoint) -> None:
    """The flags of the command that started a run, given again to its resume: the run's own
    values pass (paths compared resolved, --max-length 0 as the context it stands for, LoRA
    targets as the layers they name); another value, or a flag the run did not take, is
    refused in one line naming what the run has (from its ``last.pt``)."""
    runs = run_flags(checkpoint)
    given = {flag: value for flag, value
             in _given_values(req, _gpt_of(checkpoint.model_config).block_size).items()
             if flag != "--dropout"}  # (it holds no learned state: a resume may change it)
    runs = {f: runs.get(f, (f"no recorded {f}", None)) for f in given}
    changed = [flag for flag, value in given.items() if not _same(flag, value, runs[flag])]
    if changed:
        has = ", ".join(dict.fromkeys(_shown(*runs[f]) for f in changed))
        longer = "; --max-iters extends it" if "--epochs" in changed else ""
        raise ConfigError(f"a resumed run keeps the task, base, data and training it started "
                          f"with: this run has {has} (drop {' '.join(changed)}, or start a new "
                          f"run{longer})")


def run_flags(checkpoint: Checkpoint) -> dict[str, tuple[str, Any]]:
    """For each flag of ``finetune`` that shapes a run: (flag, value) as the command that
    started the run gave it, read from its checkpoint; for one the run did not take, the flag
    that rules it out (the --dataset of a run of --data, the --train of a LoRA run ...)."""
    data, config = checkpoint.data, checkpoint.model_config
    kind = data["task"]
    record = data[kind]
    source = ("--data", record["data"]) if record.get("data") \
        else ("--dataset", record.get("dataset"))
    runs = {"--task": ("--task", kind),
            "--init-from": ("--init-from", (data.get("base") or {}).get("source")),
            "--data": source, "--dataset": source,
            "--max-length": ("--max-length", record["max_length"]),
            "--split-seed": ("--split-seed", record["split_seed"])}
    if data.get("epochs") is not None:  # (runs from before it was recorded have none)
        runs["--epochs"] = ("--epochs", data["epochs"])
    for flag in OTHER_TASKS_FLAGS[kind]:
        runs[flag] = ("--task", kind)
    for flag, field_name in (("--class-weights", "class_weights"), ("--held-out", "held_out"),
                             ("--eval-generate", "eval_generate")):
        runs.setdefault(flag, (flag, record.get(field_name)))
    return {**_trains_flags(config), **runs}  # (--last-k of an instruct run: its --task)


def _trains_flags(config: ModelConfig) -> dict[str, tuple[str, Any]]:
    """:func:`run_flags` of what trains: --train and --last-k, or --lora and its settings."""
    lora: LoRAConfig | None = getattr(config, "lora", None)
    names = [f"--lora-{f.name}" for f in dataclasses.fields(LoRAConfig)]
    if lora is not None:
        return {"--lora": ("--lora", True), "--train": ("--lora", True),
                "--last-k": ("--lora", True),
                **{f: (f, getattr(lora, f[len("--lora-"):])) for f in names}}
    policy = getattr(config, "train", "all")
    train = ("--train", policy)
    last_k = ("--last-k", config.last_k) if policy == "last-k" else train
    return {"--train": train, "--last-k": last_k, **{f: train for f in ("--lora", *names)}}


def _given_values(req: FinetuneRequest, block_size: int) -> dict[str, Any]:
    """The flags ``req`` gave that :func:`run_flags` knows, with their values (--max-length 0
    as the context it stands for, as runs record it)."""
    given = {flag: value for flag, value in (("--task", req.task), ("--init-from", req.init_from),
                                             ("--data", req.data), ("--dataset", req.dataset))
             if value is not None}
    for flag in req.given_flags:
        if flag == "--lora":
            given[flag] = True
        elif flag.startswith("--lora-"):
            given[flag] = getattr(req.lora, flag[len("--lora-"):])
        else:
            given[flag] = getattr(req, "policy" if flag == "--train"
                                  else flag[2:].replace("-", "_"))
    if given.get("--max-length") == 0:
        given["--max-length"] = block_size
    return given


def _same(flag: str, value: Any, run: tuple[str, Any]) -> bool:
    """Whether ``flag`` given ``value`` is what the run has (``run``, from :func:`run_flags`)."""
    name, recorded = run
    if name != flag:
        return False
    if flag in ("--init-from", "--data", "--dataset"):
        return recorded in (value, str(Path(value).resolve()))
    if flag == "--lora-targets":
        return set(LoRAConfig(targets=value).target_layers()) == \
            set(LoRAConfig(targets=recorded).target_layers())
    return bool(value == recorded)


def lora_kept_by(flags: Sequence[str], lora: LoRAConfig, config: ModelConfig) -> str | None:
    """What a resumed run of model ``config`` has where the LoRA ``flags`` given again (as
    typed; ``lora``: their values) ask for another (``--lora-rank 4``), as ``finetune
    --resume`` compares them (targets as the layers they name); None when each is the run's
    own. A run without adapters has none of them."""
    runs = _trains_flags(config)
    given = {f: True if f == "--lora" else getattr(lora, f[len("--lora-"):]) for f in flags}
    changed = [f for f, value in given.items() if not _same(f, value, runs[f])]
    return ", ".join(dict.fromkeys(_shown(*runs[f]) for f in changed)) or None


def _shown(flag: str, value: Any) -> str:
    """A flag with its value as a message names it (``--lora`` alone, ``--epochs 3``)."""
    if value is True or value is None:
        return flag
    return f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}"


def starting_figures(train_job: TrainJob, log: Log = print) -> dict[str, Any]:
    """An instruction run's held-out figures before training: response loss and (with
    ``eval_generate``) exact match of the base's greedy replies. A new run measures them
    (and keeps them in its task's state, :attr:`InstructTask.before`); a resumed run reads
    them from its checkpoint."""
    task = train_job.task()
    if not isinstance(task, instruct.InstructTask):
        return {}
    if train_job.mode == "resume":
        checkpoint = train_job.checkpoint()
        task.load_state_dict(checkpoint.state.task if checkpoint.state is not None else {})
        return dict(task.before)
    model = train_job.init.model()
    figures: dict[str, Any] = {"val_loss": instruct.held_out_loss(
        model, task.examples.held_out, train_job.train.batch_size)}
    if log is not None:
        log(f"before fine-tuning: held-out response loss {figures['val_loss']:.4f}")
    if task.spec.eval_generate:
        ev = instruct.exact_match(model, task.tokenizer, task.template,
                                  task.examples.held_out_chats[:task.spec.eval_generate],
                                  progress=task.progress)
        figures["exact_match"] = ev.rate
        if log is not None:
            log("before fine-tuning: " + ev.describe("held-out", samples=1))
    task.before = figures
    return figures


# ---- what a run writes at its end


def finish_run(out: Path, result: TrainResult, verbose: bool = True) -> None:
    """A classifier's test report (printed, ``test_metrics.json``, ``confusion.png``) and a
    LoRA run's ``adapter.pt``, from the run's ``best.pt``; a stopped run writes its
    ``adapter.pt`` alone (its test split waits for the end)."""
    checkpoint = load_checkpoint(out)
    if checkpoint.data.get("task") == "classify" and not result.interrupted:
        report_test_split(checkpoint, out, verbose)
    write_adapter(out, checkpoint, verbose)


def has_adapters(config: Any) -> bool:
    """The model of ``config`` carries LoRA adapters: a LoRA run's, which writes
    ``adapter.pt`` at its end, and when a signal stops it."""
    return isinstance(config, GPTLoRAConfig) or getattr(config, "lora", None) is not None


def saved_at_stop(out: Path, config: Any) -> str:
    """What the stop line of a run in ``out`` (``finetune``'s and ``train``'s) says it saved:
    ``OUT/last.pt``, and ``OUT/adapter.pt`` of a model of ``config`` carrying adapters, which
    a stop writes too (from best.pt, as at the end)."""
    adapter = f" and {out / 'adapter.pt'}" if has_adapters(config) else ""
    return f"{out / 'last.pt'}{adapter}"


def write_adapter(out: Path, checkpoint: Any, verbose: bool = True) -> None:
    """``adapter.pt`` of a run whose model carries LoRA adapters (else nothing)."""
    from scratchgpt.finetune.adapter import save_adapter

    if not has_adapters(checkpoint.model_config):
        return
    path = save_adapter(out)
    if verbose:
        print(f"adapter: {path} ({path.stat().st_size / 1024:,.0f} KiB; fits only the base "
              f"with weights sha256 {checkpoint.data['base']['identity'][:12]}…)")


def report_test_split(checkpoint: Any, out: Path, verbose: bool = True) -> None:
    """Evaluate ``best.pt`` on the run's test split; print, save and plot the report."""
    from scratchgpt.viz import plot_confusion

    record = checkpoint.data["classify"]
    spec = _spec(classify.ClassifySpec, record)
    model = model_from_checkpoint(checkpoint)
    data = classify.load_data(spec, checkpoint.tokenizer("text"), record["max_length"])
    rep = classify.evaluate(model, data.splits["test"], data.labels)
    atomic_write_text(out / "test_metrics.json",
                      json.dumps({"split": "test", "checkpoint": "best.pt", **rep.to_dict()},
                                 indent=1) + "\n")
    plot_confusion(rep.confusion, rep.labels, out / "confusion.png",
                   f"{out.name}: test split, accuracy {rep.accuracy:.2%}")
    if verbose:
        print(classify.format_report(rep, "test split (best.pt)"))
        print(f"test_metrics.json and confusion.png in {out}")


# ---- scratchgpt train --init-from: continued pretraining


def plan_continued(settings: Settings, init_from: str, lora: LoRAConfig | None,
                   out: str | None, overwrite: bool, dataset: str | None,
                   log: Log = print) -> TrainJob:
    """A checked job that trains the GPT at ``init_from`` further on a dataset prepared with
    its tokenizer (the whole model, or LoRA adapters)."""
    from scratchgpt.data.resolve import resolve_dataset

    given = settings.explicit
    fixed = sorted(k for k in given if k in model_fields() - CHANGEABLE_MODEL_FIELDS)
    if fixed or given.get("model", "gpt") != "gpt" or settings.preset:
        flags = " ".join(flag_of(k) for k in fixed) or \
            ("--preset" if settings.preset else "--model")
        raise ConfigError(f"the model comes from --init-from {init_from}; drop {flags}")
    if out:  # (refused before the base and the data are read, as finetune's --out is)
        check_out_is_not_the_base(Path(out), init_from, "--init-from")
        RunDir(out).check_can_begin("overwrite" if overwrite else "new")
    train = TrainConfig(**{k: v for k, v in given.items() if k in train_fields()})
    check_device(train)  # (a plain train's checks, before the base is loaded)
    base = load_base(init_from)
    gpt = _gpt_config(base, given)
    config = gpt if lora is None else _with_lora(gpt, lora)
    check_resources(train, config)  # (its memory too, before the data is prepared)
    data, name = resolve_dataset(dataset or given.get("dataset"), log=log,
                                 tokenizer=base.tokenizer)  # (a named one: with the base's)
    check_base_tokenizer(base, data.tokenizer(), f"dataset {data.directory}")
    data.check_block_size(gpt.block_size, fixed=True)
    init = BaseInit(base, config, train.seed)
    if log is not None:
        log(describe_parameters(init.model(), train.optimizer))
    out_dir = Path(out) if out else Path("runs") / f"{name}-continued"
    extra = {"base": base.record()}
    return TrainJob(out_dir, "overwrite" if overwrite else "new", train, config,
                    partial(lm_task, data.directory, gpt.block_size, extra), settings.sources(),
                    init=init, finish=finish_adapter)


def finish_adapter(out: Path, result: TrainResult) -> None:
    """The end of a continued-pretraining run, or its stop: its ``adapter.pt`` when it
    trains LoRA, named as ``finetune`` names it (``adapter: PATH (size; fits only the base
    ...)``), quiet (``--no-progress``) or not: what the run wrote is part of its summary, and
    a quiet run's adapters were written in silence."""
    write_adapter(out, load_checkpoint(out))


def with_adapter_finish(job: TrainJob) -> TrainJob:
    """``job`` (e.g. a resumed ``train`` run) writing ``adapter.pt`` at its end if its model
    has adapters."""
    if isinstance(job.model, GPTLoRAConfig) and job.finish is None:
        job.finish = finish_adapter
    return job
