"""A training job: planned and checked first, then run.

:func:`plan` turns what the user asked for (a language model) into a :class:`TrainJob` and
checks everything that can be wrong (settings, data, the run being resumed, its tokenizer)
before a single file is touched. :func:`run` then takes the run directory's lock and trains, in
this process or in ``--nproc`` data-parallel processes. Other kinds of training (seq2seq,
fine-tuning) plan their own jobs and run them the same way.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scratchgpt import cpu, memory
from scratchgpt.checkpoints.io import Checkpoint
from scratchgpt.checkpoints.rundir import RunDir
from scratchgpt.data.dataset import TokenDataset
from scratchgpt.data.resolve import dataset_name, resolve_dataset
from scratchgpt.errors import CheckpointError, ConfigError, DataError, RunInUseError
from scratchgpt.models import LM_CONFIGS, ModelConfig, config_dict, model_type
from scratchgpt.signals import signals_held
from scratchgpt.training import distributed
from scratchgpt.training.config import TrainConfig
from scratchgpt.training.optim import warmup_reached
from scratchgpt.training.precision import resolve_device, resolve_dtype
from scratchgpt.training.settings import (
    Settings,
    backbone_settings,
    check_resumed_by,
    finish_model_config,
    new_run,
    resumed_run,
)
from scratchgpt.training.task import LanguageModelTask, Task
from scratchgpt.training.trainer import Trainer, TrainResult
from scratchgpt.validation import FLAGS, KEYWORDS, give, keywords, named
from scratchgpt.wording import plural

if TYPE_CHECKING:
    import torch


@dataclass
class TrainJob:
    """A checked training job. ``mode``: ``new``, ``resume`` or ``overwrite``. ``task`` makes
    the task in each process that trains (a picklable callable, e.g. a ``functools.partial``
    of a module-level function)."""

    out: Path
    mode: str
    train: TrainConfig
    model: ModelConfig
    task: Callable[[], Task]
    extra: dict[str, Any] = field(default_factory=dict)
    resume_from: Checkpoint | None = None
    # A new run that starts from trained weights (fine-tuning): a picklable callable giving
    # the model's whole initial state dict, read in each process that trains.
    init: Callable[[], dict[str, Any]] | None = None
    # What a kind of training writes once it has finished (e.g. a LoRA run's adapter.pt), in
    # the main process, with the run's lock still held: finish(run directory, result). A run
    # a signal stopped calls it too (result.interrupted), for what its stop keeps beside
    # last.pt (adapter.pt, not a test report)
    finish: Callable[[Path, TrainResult], None] | None = None
    # How the run directory's refusals name resume and overwrite: the command's flags, or the
    # Python API's keywords (validation.KEYWORDS) for a job of :func:`train`
    options: Mapping[str, str] = field(default_factory=lambda: FLAGS)
    # What to say before the first step (the start-of-run notes: :func:`starting_note`), by
    # ``say`` (print, or :func:`to_stderr`), in the process that trains as rank 0, once every
    # check has passed: a note said earlier came before a refusal found later (the run's
    # lock, an optimizer with nothing to train), as if the refused run were starting
    notes: tuple[str, ...] = ()
    say: Callable[[str], None] = print

    def __getstate__(self) -> dict[str, Any]:
        # Sent to --nproc processes: each reads the checkpoint itself rather than receiving
        # every tensor through a pipe.
        return {**self.__dict__, "resume_from": None}

    def checkpoint(self) -> Checkpoint | None:
        if self.mode == "resume" and self.resume_from is None:
            self.resume_from = RunDir(self.out, self.options).load_last()
        return self.resume_from


def plan(settings: Settings, out: str | None, resume: bool, overwrite: bool,
         dataset: str | None, log: Callable[[str], None] | None = print) -> TrainJob:
    """Everything the run will use, checked; nothing is written (except a named dataset
    prepared into the cache the first time it is used)."""
    if resume and overwrite:
        raise ConfigError("--resume continues the run in --out and --overwrite replaces it; "
                          "give one of them")
    if resume:
        return _plan_resume(settings, out, dataset, log)
    kind, values, train, named = new_run(settings)
    if out:  # (the run's own refusals, before a named dataset is prepared into the cache)
        RunDir(out).check_can_begin("overwrite" if overwrite else "new")
    data, name = resolve_dataset(dataset or named, log=log)
    with settings.naming_errors():
        config = finish_model_config(kind, values, data.vocab_size)
    out_dir = Path(out) if out else Path("runs") / name
    return _new_lm_job(data, train, config, out_dir, overwrite, settings.sources())


def _new_lm_job(data: TokenDataset, train: TrainConfig, config: ModelConfig, out: Path,
                overwrite: bool, extra: dict[str, Any] | None = None,
                options: Mapping[str, str] = FLAGS) -> TrainJob:
    """A new language-model run on ``data``, checked: the command's and the Python API's."""
    check_model_for(config, data)
    data.check_block_size(config.block_size, options=options)
    check_resources(train, config, options)
    return TrainJob(out, "overwrite" if overwrite else "new", train, config,
                    partial(lm_task, data.directory, config.block_size, windows=train.windows),
                    extra or {}, options=options)


def check_model_for(config: ModelConfig | None, data: TokenDataset) -> None:
    """``config`` is a language model's that reads every id of ``data`` (a model of a smaller
    vocabulary failed inside torch's embedding, at the first batch)."""
    if config is None:
        raise ConfigError("a new run needs a model config (model_config('gpt', "
                          "vocab_size=data.vocab_size, ...)); None is for resume=True")
    kind = model_type(config)
    if kind == "gpt-lora":  # (a language model, but its adapters need the GPT they adapt)
        raise ConfigError("a 'gpt-lora' model adapts a trained GPT, which a new run of train "
                          "does not load: start it with 'scratchgpt train --init-from BASE "
                          "--lora' (train(..., resume=True) continues it)")
    if kind not in LM_CONFIGS:
        raise ConfigError(f"a {kind!r} model is not a language model; train one of "
                          f"{', '.join(LM_CONFIGS)}")
    if config.vocab_size < data.vocab_size:
        raise ConfigError(f"the model's vocab_size is {config.vocab_size}, smaller than the "
                          f"dataset's vocabulary of {data.vocab_size} ids in {data.directory}; "
                          "give it vocab_size=data.vocab_size")


def _plan_resume(settings: Settings, out: str | None, dataset: str | None,
                 log: Callable[[str], None] | None,
                 options: Mapping[str, str] = FLAGS) -> TrainJob:
    out = out or _default_out_to_resume(dataset or settings.given.get("dataset"))
    checkpoint = RunDir(out, options).load_last()
    check_resumed_by(checkpoint, "train")
    config, train = resumed_run(checkpoint, settings)
    recorded = checkpoint.data.get("dataset")
    if not (dataset or recorded):
        raise CheckpointError(f"{checkpoint.path} does not record its dataset; pass --dataset")
    if not dataset:
        check_recorded_dataset(recorded, out, options)
    own = checkpoint.tokenizer("text") if "text" in checkpoint.tokenizers else None
    data, _ = resolve_dataset(dataset or recorded, log=log, tokenizer=own)  # (a name: with own)
    check_same_tokenizer(checkpoint, data, options)
    if not dataset:
        check_same_data(checkpoint, data, options)
    data.check_block_size(config.block_size, fixed=True)
    # what the run records besides its dataset (e.g. the base it was fine-tuned from) stays
    recorded_extra = {k: v for k, v in checkpoint.data.items()
                      if k not in ("dataset", "dataset_identity")}  # (the task records them)
    check_resources(train, config, options)
    return TrainJob(Path(out), "resume", train, config,
                    partial(lm_task, data.directory, config.block_size, recorded_extra,
                            train.windows),
                    settings.sources(), checkpoint, options=options)


def check_recorded_dataset(recorded: str, run: str | Path,
                           options: Mapping[str, str] = FLAGS) -> None:
    """The dataset the run in ``run`` records (a directory, or a named dataset) is still
    there; refused in the words ``eval`` uses. A resumed run whose dataset had moved was
    refused as "--dataset DIR: no such prepared dataset directory", naming a flag the user
    had not given."""
    from scratchgpt.data.sources import DATASET_NAMES

    if recorded in DATASET_NAMES or Path(recorded).is_dir():
        return
    raise DataError(f"the dataset the run was trained on, {recorded}, is no longer there; "
                    f"pass {named(options, 'dataset')} (prepared with the run's tokenizer: "
                    f"prepare --tokenizer-from {run})")


def check_same_data(checkpoint: Checkpoint, data: TokenDataset,
                    options: Mapping[str, str] = FLAGS) -> None:
    """The dataset a resumed run finds where it was trained is the one it was trained on
    (:func:`data_changed`). Prepared again there from another text, with the same tokenizer,
    it was read without a word: the run went on with other data and kept a best val loss of
    another validation split. Continuing on it is asked for by naming it."""
    what = data_changed(checkpoint, data)
    if what is None:
        return
    raise DataError(f"the dataset the run was trained on, {data.directory}, was prepared "
                    f"again {what} since, so resuming would train on other data than the run's "
                    f"and compare val losses of another validation split; prepare the run's "
                    f"text there again to continue it exactly, or {give(options)} "
                    f"{named(options, 'dataset', str(data.directory))} to go on with the new data")


def data_changed(checkpoint: Checkpoint, data: TokenDataset) -> str | None:
    """How ``data`` differs from the dataset the run of ``checkpoint`` was trained on
    (:meth:`TokenDataset.identity`): "from another text", "with another split (...)", or None
    where it does not (or the run did not record it)."""
    recorded = checkpoint.data.get("dataset_identity")
    now = data.identity()
    if not recorded or recorded == now:
        return None
    if recorded.get("source_sha256") != now.get("source_sha256"):
        return "from another text"
    return f"with another split ({_split_tokens(now)}; the run's {_split_tokens(recorded)})"


def _split_tokens(identity: Mapping[str, Any]) -> str:
    counts = [identity.get(f"{split}_tokens") for split in ("train", "val")]
    return " + ".join(f"{n:,}" if isinstance(n, int) else "?" for n in counts) + " tokens"


def _default_out_to_resume(dataset: str | None) -> str:
    """The run a resume without --out continues: the one the same command wrote without
    --out, in ``runs/`` under its dataset's name."""
    out = Path("runs") / dataset_name(dataset)
    if not out.exists():
        raise ConfigError(f"--resume without --out continues {out} (where a run on this "
                          "dataset started without --out goes), and there is no run there; "
                          "give --out DIR, the run directory to continue")
    return str(out)


def finished_note(job: TrainJob) -> str | None:
    """What to say of a resumed run that already reached its --max-iters (or time budget),
    and so trains no more, before its summary repeats the last one: how to extend it. None
    for any other run."""
    checkpoint = job.checkpoint() if job.mode == "resume" else None
    state = checkpoint.state if checkpoint is not None else None
    if state is None:
        return None
    budget, options = job.train.time_budget_s, job.options
    pass_ = give(options)
    max_iters, time_budget = named(options, "max_iters"), named(options, "time_budget")
    if state.step >= job.train.max_iters:
        return (f"note: {job.out} is already at step {state.step} of "
                f"{named(options, 'max_iters', job.train.max_iters)}; {pass_} a larger "
                f"{max_iters} to train it further")
    if budget and state.elapsed_s >= budget:
        return (f"note: {job.out} has already used its {time_budget} of {budget:g} s; {pass_} "
                f"a {max_iters} above {state.step} (or a longer {time_budget}) to train it "
                "further")
    return None


def warmup_note(job: TrainJob) -> str | None:
    """What to say of a run that ends inside its warmup (the default 100 updates, with a
    --max-iters of 50 to try the command): the rate only rises, never reaches
    --learning-rate, and the schedule never starts, which nothing else tells. None
    otherwise."""
    cfg, options = job.train, job.options
    if cfg.warmup_iters < cfg.max_iters:
        return None
    reached = warmup_reached(cfg.max_iters, cfg.warmup_iters)  # the rate of the last update
    return (f"note: {named(options, 'warmup_iters', cfg.warmup_iters)} is not below "
            f"{named(options, 'max_iters', cfg.max_iters)}: the learning rate rises for the "
            f"whole run, to {reached:.0%} of {named(options, 'learning_rate', cfg.learning_rate)}"
            f", and the {cfg.schedule} schedule never starts; "
            f"{give(options)} a smaller "
            f"{named(options, 'warmup_iters')}")


def schedule_note(job: TrainJob) -> str | None:
    """What to say of a resumed run that trains past the end of its learning-rate schedule
    (which keeps the run's length: a larger --max-iters does not stretch it): where the
    schedule ends, and that the updates after it run at --min-lr; or of one that ends before
    it (a smaller --max-iters does not squeeze it): that its rate stops short of --min-lr.
    None otherwise."""
    checkpoint = job.checkpoint() if job.mode == "resume" else None
    cfg, options = job.train, job.options
    if checkpoint is None or cfg.decay_iters == cfg.max_iters \
            or checkpoint.state.step >= cfg.max_iters:
        return None
    ends = f"note: this run's {cfg.schedule} schedule ends at update {cfg.decay_iters}"
    max_iters = named(options, "max_iters", cfg.max_iters)
    min_lr = named(options, "min_lr", cfg.min_lr)
    if cfg.decay_iters > cfg.max_iters:  # a shorter run: it stops part-way down
        what = f", after {max_iters}: the run ends before its rate reaches {min_lr}"
    else:
        what = f": its updates after that to {max_iters} train at {min_lr}"
    return (f"{ends}{what} ({give(options)} {named(options, 'lr_decay_iters')} to run the "
            "schedule over another length)")


def starting_note(job: TrainJob) -> str | None:
    """What to say before ``job`` trains: a resumed run with nothing left to train
    (:func:`finished_note`), else a run that ends inside its warmup (:func:`warmup_note`:
    its schedule never starts, so where the schedule ends says nothing more), else one that
    trains past its schedule's end or ends before it (:func:`schedule_note`). The command
    says it, and so does :func:`train` (on stderr), through :func:`with_notes`."""
    return finished_note(job) or warmup_note(job) or schedule_note(job)


def with_notes(job: TrainJob, *notes: str | None,
               say: Callable[[str], None] = print) -> TrainJob:
    """``job``, saying ``notes`` (those not None) by ``say`` once every check has passed,
    just before its first step (:attr:`TrainJob.notes`)."""
    job.notes, job.say = tuple(n for n in notes if n), say
    return job


def to_stderr(line: str) -> None:
    """A note of :func:`train`'s, said on stderr (a picklable ``say``: --nproc processes
    say it)."""
    print(line, file=sys.stderr)


def check_device(train: TrainConfig, options: Mapping[str, str] = FLAGS) -> torch.device:
    """The device of ``train`` exists and computes the precision asked for: the checks of
    :func:`check_resources` that need no model (a run from a base checks them before
    loading it)."""
    device = resolve_device(train.device, options)
    resolve_dtype(train.dtype, device)
    return device


def check_resources(train: TrainConfig, config: ModelConfig,
                    options: Mapping[str, str] = FLAGS) -> None:
    """The device exists, computes the precision asked for, and has the memory the run needs
    (see :mod:`scratchgpt.memory`): checked before any file is touched."""
    device = check_device(train, options)
    estimate = memory.training_estimate(config, train.batch_size, train.optimizer)
    copies = train.nproc if device.type == "cpu" else 1  # each process holds a copy
    memory.check_fits(estimate, "training this model", device, copies)


def lm_task(dataset: Path, block_size: int, extra_data: dict[str, Any] | None = None,
            windows: str = "random") -> LanguageModelTask:
    return LanguageModelTask(TokenDataset(dataset), block_size, extra_data, windows)


def check_same_tokenizer(checkpoint: Checkpoint, data: TokenDataset,
                         options: Mapping[str, str] = FLAGS) -> None:
    """The dataset's tokenizer must be the run's own, entry for entry (the same vocabulary
    size is not enough: ids would mean other characters): :meth:`Tokenizer.same_as`."""
    if "text" not in checkpoint.tokenizers:
        return  # an old checkpoint that kept its tokenizer beside it only
    if data.tokenizer().same_as(checkpoint.tokenizer("text")):
        return
    run = checkpoint.path.parent
    own = checkpoint.data.get("dataset")
    # a converted or fine-tuned run records no dataset: its tokenizer is the way
    use = f"use the run's own dataset ({own}) or " if own else "it records no dataset; "
    how = (f"prepare_text(text, out, tokenizer=load_tokenizer('{run}'))" if keywords(options)
           else f"scratchgpt prepare --data TEXT --tokenizer-from {run} --out DIR")
    raise DataError(f"dataset {data.directory} was tokenized differently from the run in "
                    f"{run}; {use}prepare the text with its tokenizer ({how})")


def check_out(out: Any) -> None:
    """``out`` of :func:`train` names a run directory: None was a TypeError from inside
    pathlib, and an empty path, which Path reads as the current directory, wrote the run's
    files there (the command refuses ``--out ""``)."""
    if not isinstance(out, str | Path):
        raise ConfigError(f"out is the run directory to write (a str or Path), got {out!r}")
    if not str(out).strip():
        raise ConfigError(f"out is empty ({str(out)!r}); give the run its own directory (an "
                          "empty path would be the current one)")


def _model_settings(config: ModelConfig | None) -> dict[str, Any]:
    """The settings a model config names, as the command's model flags name them (its type,
    ``--model``, and its language model's hyperparameters, ``--n-layer`` ...): given with
    ``resume``, each is checked against the run's own as a flag is. None names none."""
    if config is None:
        return {}
    lora = getattr(config, "lora", None)  # (a LoRA run's adapters: GPTLoRAConfig(gpt, lora))
    return {"model": model_type(config), **backbone_settings(config_dict(config)),
            **({"lora": lora} if lora is not None else {})}


def run(job: TrainJob, progress: bool = True) -> TrainResult:
    """Train ``job`` holding its run directory's lock. A run that fails before writing its
    first checkpoint leaves the directory as it found it (an overwritten run comes back)."""
    run_dir = RunDir(job.out, job.options)
    with run_dir.lock():
        _begin(run_dir, job)
        try:
            if job.train.nproc > 1:
                result = distributed.launch(job.train.nproc, job.train.device, run_in_process,
                                            job, progress)
            else:
                result = run_in_process(job, progress)
        except BaseException:
            run_dir.abort()
            raise
        if job.finish is not None:
            job.finish(job.out, result)
        return result


def run_launched(begin: Callable[[bool], TrainJob], device: str,
                 progress: bool = True) -> tuple[TrainJob, TrainResult, bool]:
    """This process's part of a job that torchrun started in several processes: rank 0 plans
    it (``begin(True)``: as the command asked, saying what the command says before training),
    takes the run's lock and begins the run first; the others plan after it (``begin(False)``:
    quietly, and never as an overwrite, the run being begun), then all train together. A
    refusal in rank 0 is its one line, the others leaving without a word
    (:func:`distributed.main_first`); so is a Ctrl-C before the first step, which reaches
    every process (:func:`distributed.quiet_unless_main`), and leaves the run directory as
    it was. Returns (the job, its result, whether this is rank 0), for the command to report
    in rank 0 and then leave by :func:`distributed.exit_process`."""
    held: list[RunDir] = []  # rank 0's run directory, once locked
    with distributed.quiet_unless_main():
        info = distributed.init_from_env(device)
        try:
            begun = distributed.main_first(lambda: _begun(begin(True), held))
            job = begun if begun is not None else begin(False)
            with distributed.process_group():
                result = run_in_process(job, progress and info.is_main)
            if held and job.finish is not None:
                job.finish(job.out, result)  # (what run writes at the end: adapter.pt, a report)
        except BaseException:
            for run_dir in held:  # (as run's lock() does: a directory it made goes)
                run_dir.abort()
                run_dir.release()
            raise
    return job, result, info.is_main


def _begun(job: TrainJob, held: list[RunDir]) -> TrainJob:
    """``job`` with its run directory locked (added to ``held``) and begun (rank 0's part of
    :func:`run_launched`)."""
    run_dir = RunDir(job.out, job.options)
    run_dir.acquire()
    held.append(run_dir)
    _begin(run_dir, job)
    return job


def _begin(run_dir: RunDir, job: TrainJob) -> None:
    """Begin ``job``'s run in ``run_dir``, whose lock this process holds: :meth:`RunDir.begin`
    and, for a resumed run, :func:`check_unchanged` (rank 0 under torchrun began without it,
    and resumed from a plan that newer checkpoints had overtaken)."""
    run_dir.begin(job.mode)
    if job.mode == "resume":
        check_unchanged(job, run_dir)


def check_unchanged(job: TrainJob, run_dir: RunDir) -> None:
    """The run was planned from ``last.pt`` before its lock was taken; if another process
    wrote it meanwhile, resuming from the plan would overwrite newer checkpoints."""
    if job.checkpoint().file_version != run_dir.last_version():
        raise RunInUseError(f"the run in {job.out} changed while this process was starting "
                            "(another process wrote it); run the command again")


def run_in_process(job: TrainJob, progress: bool = True) -> TrainResult:
    """This process's part of ``job`` (the whole of it outside a process group)."""
    with signals_held():  # setting up may import parts of torch (DDP imports torch._dynamo)
        resume = job.checkpoint()
        init = job.init() if job.init is not None and resume is None else None
        trainer = Trainer(job.train, job.model, job.task(), RunDir(job.out, job.options), resume,
                          init_weights=init, progress=progress, extra_config=job.extra)
    if trainer.info.is_main:  # every check has passed: the run starts
        for note in (*job.notes, busy_note(job, trainer)):
            if note:
                job.say(note)
    return trainer.fit()  # from here a signal is a request to stop after a step (StopFlag)


def busy_note(job: TrainJob, trainer: Trainer) -> str | None:
    """What to say of a run about to train on several threads of a CPU that other work keeps
    busy (:func:`scratchgpt.cpu.busy_load`): that its threads will wait on each other, and that
    one thread may be faster. Said on a terminal only, where someone can act on it (a log or a
    test has no one to), for a run that left its threads to torch's default in one process."""
    import torch  # (loaded: the trainer is built)

    threads = torch.get_num_threads()
    if job.train.threads or trainer.info.enabled or trainer.device.type != "cpu" \
            or threads < 2 or not trainer.at_terminal:
        return None
    load = cpu.busy_load()
    if load is None:
        return None
    return (f"note: this machine is busy (load average {load:.1f} on "
            f"{plural(cpu.cores(), 'core')}): the run's {threads} threads wait on each other "
            f"while one of them is not running, which can make each step several times "
            f"slower; {named(job.options, 'threads', 1)} may train faster here")


def train(cfg: TrainConfig, config: ModelConfig | None, data: TokenDataset | str | Path,
          out: str | Path, resume: bool = False, overwrite: bool = False,
          progress: bool = True) -> TrainResult:
    """Train a language model from Python, with the checks and safety of ``scratchgpt train``.

    ``data`` is a prepared dataset, opened or its directory. On ``resume`` the run's own model
    and optimizer are kept and the changeable settings of ``cfg`` apply. ``config`` may then
    be None, or the run's own model config, whose dropouts may differ (and apply, as
    ``--dropout`` does on ``scratchgpt train --resume``); one of another type or shape, or
    (a LoRA run's) other adapters, is refused, naming what differs (``this run has
    n_layer=4``), as the command refuses ``--n-layer 8`` on a 4-layer run; so is a ``cfg``
    of another ``optimizer``. ``cfg`` gives every setting, ``nproc`` too: a run trained in
    2 processes goes on in ``cfg.nproc`` (a note on stderr says so where they differ). The
    notes the command prints before training (a run that ends inside its warmup, or has
    nothing left to train) go to stderr, once every check has passed: a refused call says
    nothing else.

    Ctrl-C (or SIGTERM) stops the run after the current step and saves ``last.pt``, as it
    does the command's; ``train`` then returns, with ``interrupted`` true in its result
    (``result.raise_if_stopped()`` raises the interruption again).

    >>> from scratchgpt.models import model_config                     # doctest: +SKIP
    >>> cfg = TrainConfig(max_iters=100)                                # doctest: +SKIP
    >>> gpt = model_config("gpt", vocab_size=data.vocab_size, n_layer=2) # doctest: +SKIP
    >>> train(cfg, gpt, data, "runs/x").val_loss                        # doctest: +SKIP
    """
    if not isinstance(cfg, TrainConfig):
        raise ConfigError(f"cfg is a TrainConfig (TrainConfig(max_iters=100, ...)), got "
                          f"{type(cfg).__name__}")
    check_out(out)
    if resume and overwrite:  # (resume won, and the run was not replaced as asked)
        raise ConfigError("resume=True continues the run in out and overwrite=True replaces "
                          "it; give one of them")
    if not isinstance(data, TokenDataset):
        data = TokenDataset(data)
    if resume:
        flags = {**cfg.to_dict(), **_model_settings(config)}
        plan_ = _plan_resume(Settings(flags=flags, options=KEYWORDS), str(out),
                             str(data.directory), None, KEYWORDS)
    else:
        plan_ = _new_lm_job(data, cfg, config, Path(out), overwrite, options=KEYWORDS)
    return run(with_notes(plan_, starting_note(plan_), nproc_note(plan_), say=to_stderr),
               progress)


def nproc_note(job: TrainJob) -> str | None:
    """What to say of a run resumed from Python in another number of processes than it
    trained in: ``cfg`` gives every setting, and its default ``nproc=1`` cannot be told from
    one given, so the run goes on in ``cfg.nproc`` processes (the command, whose flags name
    only what is typed, keeps the run's count), which this says. None otherwise."""
    checkpoint = job.checkpoint() if job.mode == "resume" else None
    own = checkpoint.train_config.nproc if checkpoint and checkpoint.train_config else None
    if own is None or own == job.train.nproc:
        return None
    now = job.train.nproc
    return (f"note: the run in {job.out} trained in {plural(own, 'process', 'processes')}; it "
            f"goes on in {plural(now, 'process', 'processes')} (cfg's "
            f"{named(job.options, 'nproc', now)}); give {named(job.options, 'nproc', own)} to "
            "keep its count")
