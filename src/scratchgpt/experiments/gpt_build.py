"""The GPT built one part at a time, as in the lecture "Let's build GPT", replayable.

Eight models, trained one after the other on the same data with the same batch size, learning
rate schedule, budget and seed, so that the only difference between two neighbours is the part
the later one adds:

    1-bigram        a table of next-token logits: the current token alone predicts the next
    2-one-head      + one causal self-attention head of size n_embd (32): tokens see the past
    3-multi-head    4 heads of size 8 side by side instead of one of 32
    4-feed-forward  + a feed-forward layer (ReLU MLP) after attention: tokens "think" alone
    5-blocks        3 such blocks stacked, still without residuals: deeper, harder to train
    6-residual      + residual connections around attention and the MLP
    7-layernorm     + a LayerNorm before each sublayer and before the head (pre-norm)
    8-scaled        bigger (more layers, heads, width and context) with dropout

Stages 2-7 are GPTs of ``n_layer`` blocks built from the flags ``--no-residual``,
``--no-layernorm`` and ``--no-mlp`` (``models/gpt.py``); the bigram is ``models/bigram.py``.
Every stage is a normal run directory (checkpoints, ``metrics.csv``, ``loss.png``), so each can
be sampled and evaluated:

    >>> [s.name for s in stages(BuildSetup())][:3]
    ['1-bigram', '2-one-head', '3-multi-head']

:func:`run` trains the stages, :func:`recorded_results` reads each finished stage back from
its run directory (however it was finished), :func:`write_tables` writes ``gpt_build.csv`` and
``gpt_build.md``, :func:`plot` draws ``gpt_build.png`` (final val loss per stage beside the
lecture's, and each stage's val-loss curve), :func:`plot_from_csv` the first of these from a
report table alone.
"""

from __future__ import annotations

import csv
import math
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from scratchgpt.bench import refuse_repeats
from scratchgpt.checkpoints.rundir import RunDir
from scratchgpt.data.dataset import TokenDataset
from scratchgpt.errors import ConfigError, DataError
from scratchgpt.memory import parameter_count
from scratchgpt.models import ModelConfig, build_model, config_dict, model_config
from scratchgpt.tokenizers import TOKENIZERS
from scratchgpt.tokenizers.char import CharTokenizer
from scratchgpt.training import job as train_job
from scratchgpt.training.config import TrainConfig
from scratchgpt.training.metrics import read_rows

# Shapes of the last stage. "lecture" is the lecture's (and nanoGPT's) Shakespeare model, made
# for a GPU; "cpu" is the cpu-small preset's shape, which learns the most per second on a
# laptop CPU; "tiny" is for smoke tests.
SCALED: dict[str, dict[str, Any]] = {
    "cpu": dict(n_layer=4, n_head=4, n_embd=128, block_size=64),
    "lecture": dict(n_layer=6, n_head=6, n_embd=384, block_size=256),
    "tiny": dict(n_layer=2, n_head=2, n_embd=32, block_size=16),
}

# The validation losses "Let's build GPT" reports for the same stages (character-level Tiny
# Shakespeare; 5,000 or so AdamW steps of batch 32 at context 8, the last stage batch 64 at
# context 256 on a GPU).
LECTURE_VAL_LOSS: dict[str, float] = {
    "bigram": 2.49, "one-head": 2.42, "multi-head": 2.26, "feed-forward": 2.23,
    "blocks": 2.34, "residual": 2.07, "layernorm": 2.06, "scaled": 1.48,
}


OTHER_TEXT = "Tiny Shakespeare"  # how the lecture's losses are labelled beside another text's


def text_of(data: TokenDataset) -> dict[str, Any]:
    """What the report says of the stages' text, from the dataset's ``meta.json``: its
    tokenizer's kind and its source's sha256. Each stage records it in its ``config.json``
    (:func:`recorded_text`), so that a report is written again without the dataset."""
    return {key: data.meta.get(key) for key in ("tokenizer", "source_sha256")}


def lectures_text(text: Mapping[str, Any]) -> bool:
    """``text`` (:func:`text_of`) is the lecture's, Tiny Shakespeare at character level: its
    losses then compare with the lecture's, and where it is not, the lecture's are labelled as
    another text's (a bigram's 4.50 on Python source read beside 2.49 as a target missed)."""
    from scratchgpt.data.sources import DATASETS

    return (text.get("tokenizer") == "char"
            and text.get("source_sha256") == DATASETS["shakespeare"].sha256)


def lecture_label(text: Mapping[str, Any]) -> str:
    """The lecture column's heading: ``lecture``, or ``lecture (Tiny Shakespeare)`` beside the
    losses of another text (or tokenizer)."""
    return "lecture" if lectures_text(text) else f"lecture ({OTHER_TEXT})"


@dataclass(frozen=True)
class Stage:
    """One step of the build: a model, and what it adds to the one before."""

    number: int
    key: str  # short name: "one-head"
    adds: str  # what this stage adds, in a few words
    model: str  # registry type: "bigram" or "gpt"
    values: dict[str, Any] = field(hash=False)  # model hyperparameters except vocab_size

    @property
    def name(self) -> str:
        """The stage's run directory under the experiment's output: ``2-one-head``."""
        return f"{self.number}-{self.key}"

    @property
    def lecture(self) -> float | None:
        return LECTURE_VAL_LOSS.get(self.key)

    def config(self, vocab_size: int) -> ModelConfig:
        return model_config(self.model, vocab_size=vocab_size, **self.values)


@dataclass
class BuildSetup:
    """The recipe every stage shares, and the shapes of the stages."""

    block_size: int = 8  # context of stages 1-7 (the lecture's)
    n_embd: int = 32  # width of stages 2-7 (the lecture's)
    n_layer: int = 3  # blocks of stages 5-7 (the lecture's)
    n_head: int = 4  # heads of stages 3-7 (the lecture's: 4 heads of 8)
    scaled: str = "cpu"  # shape of stage 8: a key of SCALED
    dropout: float = 0.2  # stage 8's dropout (the lecture's)
    weight_init: str = "torch"  # the GPTs' initial weights: PyTorch's defaults, as the lecture
    batch_size: int = 32
    learning_rate: float = 1e-3  # AdamW, the lecture's; a cosine down to a tenth of it
    time_budget: str = "60s"  # per stage ("" = max_iters alone)
    max_iters: int = 1_000_000_000  # per stage
    eval_interval: int = 100
    eval_iters: int = 20
    seed: int = 1337
    device: str = "auto"
    threads: int = 1  # torch's; 0: its own choice (two spin-waiting threads on a busy CPU)

    def __post_init__(self) -> None:
        if self.scaled not in SCALED:
            raise ConfigError(f"scaled must be one of {', '.join(SCALED)}, got {self.scaled!r}")
        if self.n_embd % self.n_head:  # (the GPT's own refusal named n_head, no flag here)
            raise ConfigError(f"n_embd ({self.n_embd}) must be a multiple of {self.n_head}, the "
                              "heads of stages 3-7")

    def train_config(self) -> TrainConfig:
        """The training settings of every stage: only the model differs between stages."""
        return TrainConfig(
            batch_size=self.batch_size, max_iters=self.max_iters, time_budget=self.time_budget,
            learning_rate=self.learning_rate, min_lr=self.learning_rate / 10,
            warmup_iters=min(100, self.max_iters // 10), optimizer="adamw",
            eval_interval=self.eval_interval, eval_iters=self.eval_iters,
            log_interval=max(1, self.eval_interval // 4), seed=self.seed, device=self.device,
            threads=self.threads)


def quick_setup(**overrides: Any) -> BuildSetup:
    """All eight stages in about a minute on a 2-core CPU, as a smoke test: 20 steps each
    and a tiny last stage."""
    values: dict[str, Any] = dict(time_budget="", max_iters=20, eval_interval=10, eval_iters=2,
                                  batch_size=8, scaled="tiny")
    return BuildSetup(**{**values, **overrides})


def stages(setup: BuildSetup) -> list[Stage]:
    """The eight stages. Like the lecture's model, the GPTs have their own output head (not
    tied to the token embedding), a ReLU MLP and, by default, PyTorch's initialisation; unlike
    it, attention always has its output projection and the MLP is always 4x wide (the lecture
    adds both with the residuals)."""
    base = dict(block_size=setup.block_size, n_embd=setup.n_embd, tie_weights=False,
                activation="relu", dropout=0.0, weight_init=setup.weight_init)
    bare = dict(base, residual=False, layernorm=False)
    heads = dict(bare, n_layer=1, n_head=setup.n_head)
    deep = dict(n_layer=setup.n_layer, n_head=setup.n_head)
    return [
        Stage(1, "bigram", "a table of next-token logits", "bigram",
              dict(block_size=setup.block_size)),
        Stage(2, "one-head", f"one self-attention head of size {setup.n_embd}", "gpt",
              dict(bare, n_layer=1, n_head=1, mlp=False)),
        Stage(3, "multi-head", f"{setup.n_head} heads of size {setup.n_embd // setup.n_head}",
              "gpt", dict(heads, mlp=False)),
        Stage(4, "feed-forward", "a feed-forward layer (ReLU MLP)", "gpt", heads),
        Stage(5, "blocks", f"{setup.n_layer} blocks, no residuals", "gpt", dict(bare, **deep)),
        Stage(6, "residual", "residual connections", "gpt",
              dict(base, **deep, layernorm=False)),
        Stage(7, "layernorm", "LayerNorm (pre-norm)", "gpt", dict(base, **deep)),
        Stage(8, "scaled", _scaled_words(setup), "gpt",
              dict(base, **SCALED[setup.scaled], dropout=setup.dropout)),
    ]


def _scaled_words(setup: BuildSetup) -> str:
    s = SCALED[setup.scaled]
    return (f"{s['n_layer']} layers x {s['n_head']} heads, width {s['n_embd']}, context "
            f"{s['block_size']}, dropout {setup.dropout:g}")


def train_command(stage: Stage, setup: BuildSetup, dataset: str, out: str) -> list[str]:
    """The ``scratchgpt train`` arguments that train ``stage`` exactly as the experiment does
    (the same model, settings and seed, so the same numbers): every setting that differs from
    ``train``'s defaults, as a flag.

    >>> " ".join(train_command(stages(BuildSetup())[1], BuildSetup(), "shakespeare", "r")[:9])
    'train --dataset shakespeare --out r --model gpt --block-size 8'
    """
    args = ["train", "--dataset", dataset, "--out", out, "--model", stage.model]
    model_defaults = config_dict(model_config(stage.model))
    args += _flags(stage.values, model_defaults)
    args += _flags(setup.train_config().to_dict(), TrainConfig().to_dict())
    return args


def _flags(values: dict[str, Any], defaults: dict[str, Any]) -> list[str]:
    """``--name value`` (``--name`` / ``--no-name`` for booleans) for each value that differs
    from its default."""
    out: list[str] = []
    for name, value in values.items():
        if value == defaults.get(name):
            continue
        flag = name.replace("_", "-")
        if isinstance(value, bool):
            out.append(f"--{flag}" if value else f"--no-{flag}")
        else:
            out += [f"--{flag}", str(value)]
    return out


def select(all_stages: list[Stage], wanted: Sequence[str] | None,
           name: str = "wanted") -> list[Stage]:
    """The stages named in ``wanted`` (by number, key or full name), in build order; all of
    them for None or an empty list. A stage named twice (``1 1``, ``1 bigram``) is refused,
    the list called ``name`` (``--stages`` from the command)."""
    if not wanted:
        return all_stages
    names = {alias: s for s in all_stages for alias in (str(s.number), s.key, s.name)}
    unknown = [w for w in wanted if w not in names]
    if unknown:
        raise ConfigError(f"no stage {', '.join(map(repr, unknown))}; the stages are "
                          f"{', '.join(s.name for s in all_stages)}")
    refuse_repeats(name, [names[w].name for w in wanted])
    chosen = {names[w] for w in wanted}
    return [s for s in all_stages if s in chosen]


STAGE_NAMES = tuple(s.name for s in stages(BuildSetup()))  # (the same under any setup)


@dataclass
class StageResult:
    """How one stage ended (``interrupted``: Ctrl-C stopped it; no final evaluation)."""

    stage: Stage
    params: int
    steps: int
    tokens: int
    seconds: float
    train_loss: float
    val_loss: float
    run_dir: Path
    command: str = ""  # the equivalent ``scratchgpt train`` command line
    interrupted: bool = False
    exit_code: int = 0
    time_budget: str = ""  # the run's --time-budget ("": steps alone)


def plan(setup: BuildSetup, data: TokenDataset, out: Path, chosen: list[Stage],
         overwrite: bool, dataset_name: str | None = None
         ) -> list[tuple[Stage, train_job.TrainJob]]:
    """A checked training job per stage; nothing is written. A stage whose directory holds a
    run is an error unless ``overwrite`` (its run is then replaced when the stage trains).
    ``dataset_name``: how the stages' ``train`` commands name the data (default: its
    directory)."""
    cfg = setup.train_config()
    refuse_other_datasets(out, data, chosen, overwrite)
    if not overwrite:
        refuse_held_runs(out, chosen)
    jobs = []
    for stage in chosen:
        config = stage.config(data.vocab_size)
        data.check_block_size(config.block_size)
        # a GPT-2-tokenized corpus makes the bigram's table 50257 x 50257: refused, not an
        # allocation failure part way through the stages
        train_job.check_resources(cfg, config)
        path = out / stage.name
        task = partial(train_job.lm_task, data.directory, config.block_size)
        command = shlex.join(["scratchgpt", *train_command(
            stage, setup, dataset_name or str(data.directory), str(path))])
        extra = {"experiment": {"name": "gpt-build", "stage": stage.name, "adds": stage.adds,
                                "train_command": command, "text": text_of(data)}}
        jobs.append((stage, train_job.TrainJob(path, "overwrite" if overwrite else "new", cfg,
                                               config, task, extra)))
    return jobs


def refuse_other_datasets(out: Path, data: TokenDataset, chosen: list[Stage],
                          overwrite: bool) -> None:
    """The stage runs that ``out`` keeps (all but the chosen ones ``overwrite`` replaces)
    were trained on ``data``, or ``out`` would hold stages of two datasets, which its report
    compared as one build. One trained on another dataset is refused, naming both; so is one
    trained on ``data``'s directory before it was prepared again from another text
    (:func:`text_changed`)."""
    replaced = {s.name for s in chosen} if overwrite else set()
    mine = str(data.directory.resolve())
    other = {name: found for name in STAGE_NAMES if name not in replaced
             and (found := trained_on(out / name, data)) not in (None, mine)}
    if not other:
        return
    theirs = next(iter(other.values()))
    again = [n for n in STAGE_NAMES if n in other or n in {s.name for s in chosen}]
    stages_flag = "" if len(again) == len(STAGE_NAMES) else \
        f"--stages {' '.join(n.split('-')[0] for n in again)} "
    what = (f"{mine} before it was prepared again from another text, not on its text now"
            if theirs == CHANGED else f"{theirs}, not on {mine}")
    raise ConfigError(f"{out} holds {', '.join(n for n in other if other[n] == theirs)} "
                      f"trained on {what} (--dataset): one report would compare the stages of "
                      "two datasets; pass --out another directory, or "
                      f"{stages_flag}--overwrite to train them again on it")


CHANGED = "(its text changed)"  # what :func:`trained_on` says of a dataset prepared again


def trained_on(run_dir: Path, data: TokenDataset) -> str | None:
    """The dataset the run in ``run_dir`` was trained on, as :func:`dataset_of` names it, or
    :data:`CHANGED` where that is ``data``'s directory but not its text now; None where
    ``run_dir`` records no dataset (no run there)."""
    found = dataset_of(run_dir)
    if found == str(data.directory.resolve()) and text_changed(run_dir, text_of(data)):
        return CHANGED
    return found


def text_changed(run_dir: Path, text: Mapping[str, Any]) -> bool:
    """The run in ``run_dir`` records a text (tokenizer, source sha256: :func:`text_of`)
    other than ``text``: its dataset directory was prepared again in place from another text
    (or tokenizer) since. Only what both record is compared; a run trained before stages
    recorded their text has not changed."""
    recorded = text_recorded(run_dir) or {}
    return any(recorded.get(key) is not None and text.get(key) is not None
               and recorded.get(key) != text.get(key) for key in ("tokenizer", "source_sha256"))


def on_dataset(results: Sequence[StageResult], data: TokenDataset
               ) -> tuple[list[StageResult], list[StageResult]]:
    """``results`` split into those trained on ``data`` and the others (a build with
    ``overwrite`` cut short keeps stages of the dataset it replaces, or of ``data``'s
    directory before it was prepared again from another text)."""
    mine = str(data.directory.resolve())
    return ([r for r in results if trained_on(r.run_dir, data) == mine],
            [r for r in results if trained_on(r.run_dir, data) != mine])


def refuse_held_runs(out: Path, chosen: list[Stage]) -> None:
    """A chosen stage whose directory holds a run is refused (``--overwrite`` replaces it),
    saying how to go on where a build was cut short: ``--stages`` with the stages not finished
    there (the one cut short with ``--overwrite``: it trains again from its start, where
    ``train --resume`` finishes it), or, every stage finished, ``--report``."""
    held = [s for s in chosen if RunDir(out / s.name).holds_run()]
    if not held:
        return
    finished = {r.stage.name for r in recorded_results(out)}
    rest = [s for s in chosen if s.name not in finished]
    if not rest:
        raise ConfigError(f"{out} already holds a finished run of each stage asked for; pass "
                          "--report to write the report of them, --overwrite to train them "
                          "again, or --out another directory")
    if rest == chosen:  # none finished: each held run was cut short (or is no stage's)
        cut = out / held[0].name
        raise ConfigError(f"{cut} already holds a run, not finished; pass --overwrite to "
                          "train the stages again from their start (scratchgpt train "
                          f"--resume --out {cut} finishes it where it stopped), or --out "
                          "another directory")
    raise ConfigError(_how_to_go_on(out, held, rest))


def _how_to_go_on(out: Path, held: list[Stage], rest: list[Stage]) -> str:
    """The refusal of a build that has some of the chosen stages finished: the stages to go
    on with, and what becomes of one cut short."""
    cut = [s for s in rest if s in held]
    again = " --overwrite" if cut else ""
    resume = (f" (a stage cut short trains again from its start; scratchgpt train --resume "
              f"--out {out / cut[0].name} finishes it where it stopped)") if cut else ""
    return (f"{out} already holds {', '.join(s.name for s in held)}; to go on with the stages "
            f"not finished there, pass --stages {' '.join(str(s.number) for s in rest)}{again}"
            f"{resume}, or --overwrite to train them all again")


def stopped_note(cut: StageResult, chosen: Sequence[Stage], out: Path) -> str:
    """What a build stopped by Ctrl-C in the stage of ``cut`` (one of ``chosen``) says: where
    it stopped, what it saved, and how to go on (it printed nothing after the signal's line:
    neither the step nor that ``train --resume`` finishes the stage)."""
    rest = [s for s in chosen if s.number > cut.stage.number]
    then = (f"then --stages {' '.join(str(s.number) for s in rest)} goes on with the rest"
            if rest else f"then scratchgpt experiment gpt-build --out {out} --report writes "
                         "the report with it")
    return (f"stage {cut.stage.name} stopped at step {cut.steps}; saved {cut.run_dir / 'last.pt'} "
            f"(scratchgpt train --resume --out {cut.run_dir} finishes it; {then})")


def run(setup: BuildSetup, data: TokenDataset, out: Path, wanted: Sequence[str] | None = None,
        overwrite: bool = False, progress: bool = True, log: Callable[[str], None] = print,
        dataset_name: str | None = None) -> list[StageResult]:
    """Train the chosen stages in order, each into ``out/<stage name>``; stops after a stage
    that was interrupted (its result is last, ``interrupted``)."""
    results = []
    chosen = select(stages(setup), wanted)
    for stage, job in plan(setup, data, out, chosen, overwrite, dataset_name):
        log(f"stage {stage.name}: {stage.adds}")
        result = train_job.run(job, progress)
        params = sum(p.numel() for p in build_model(job.model).parameters())
        results.append(StageResult(
            stage, params, result.step, result.step * setup.batch_size * job.model.block_size,
            result.elapsed_s, result.train_loss, result.val_loss, job.out,
            job.extra["experiment"]["train_command"], result.interrupted, result.exit_code,
            setup.time_budget))
        if result.interrupted:
            break
        lecture = (f" ({lecture_label(text_of(data))} {stage.lecture:.2f})"
                   if stage.lecture is not None else "")
        log(f"stage {stage.name}: {result.step:,} steps in {result.elapsed_s:.0f}s, val loss "
            f"{result.val_loss:.4f}{lecture}")
    return results


# ---- the report

COLUMNS = ("stage", "adds", "params", "steps", "tokens", "seconds", "train_loss", "val_loss",
           "lecture_val_loss", "run")


def rows(results: Sequence[StageResult]) -> list[dict[str, Any]]:
    """The report table as plain rows (the columns of :data:`COLUMNS`)."""
    return [dict(stage=r.stage.name, adds=r.stage.adds, params=r.params, steps=r.steps,
                 tokens=r.tokens, seconds=round(r.seconds, 1),
                 train_loss=f"{r.train_loss:.4f}", val_loss=f"{r.val_loss:.4f}",
                 lecture_val_loss="" if r.stage.lecture is None else f"{r.stage.lecture:.2f}",
                 run=r.run_dir.name) for r in results]


def markdown(results: Sequence[StageResult], commands: bool = False,
             lecture: str = "lecture", unit: str = "char") -> str:
    """The report table in Markdown (and, with ``commands``, each stage's ``train`` command);
    ``lecture``: the heading of the lecture's losses (:func:`lecture_label`); ``unit``: what
    the losses are averaged over (:func:`loss_unit`)."""
    lines = [f"| stage | adds | parameters | steps | val loss (nats/{unit}) | {lecture} |",
             "|---|---|---:|---:|---:|---:|"]
    for row in rows(results):
        lines.append(f"| {row['stage']} | {row['adds']} | {row['params']:,} | "
                     f"{row['steps']:,} | {row['val_loss']} | {row['lecture_val_loss']} |")
    if commands:
        lines += ["", "Each stage is this `scratchgpt train` command (same numbers):", "",
                  "```", *(r.command for r in results), "```"]
    return "\n".join(lines) + "\n"


def recorded_results(out: Path, chosen: Sequence[Stage] | None = None) -> list[StageResult]:
    """The finished stages in ``out`` (of ``chosen``, default all), in build order, each as
    its own run directory records it (:func:`recorded_result`): a stage trained by an earlier
    run of the experiment, or finished by ``scratchgpt train --resume``, is reported as one
    trained now."""
    wanted = stages(BuildSetup()) if chosen is None else chosen
    found = (recorded_result(stage, out / stage.name) for stage in wanted)
    return [r for r in found if r is not None]


def recorded_result(stage: Stage, run_dir: Path) -> StageResult | None:
    """``stage``'s result as ``run_dir`` records it: the final evaluation (the last row of
    ``metrics.csv``, without a learning rate), the model and the experiment's words of
    ``config.json``. None where ``run_dir`` holds no finished run of the stage: nothing, a
    run cut short (no final evaluation yet), one without its checkpoints, or another run
    (its ``config.json`` names no such stage)."""
    run = RunDir(run_dir)
    config = run.recorded_config()
    experiment = config.get("experiment")
    if not (isinstance(experiment, dict) and experiment.get("stage") == stage.name
            and run.has_checkpoint()):
        return None
    final = (read_rows(run_dir / "metrics.csv") or [{}])[-1]
    params = _parameters(config.get("model"))
    if not final.get("val_loss") or final.get("lr") or params is None:
        return None
    adds, train = experiment.get("adds"), config.get("train")
    budget = train.get("time_budget") if isinstance(train, dict) else ""
    return StageResult(
        replace(stage, adds=adds) if isinstance(adds, str) else stage, params,
        int(final["step"]), int(final["tokens"]), float(final["elapsed_s"]),
        float(final["train_loss"] or math.nan), float(final["val_loss"]), run_dir,
        str(experiment.get("train_command") or ""), time_budget=str(budget or ""))


def _parameters(model: Any) -> int | None:
    """The parameters of the model a run's ``config.json`` records (None: no model)."""
    if not isinstance(model, dict):
        return None
    values = dict(model)
    try:
        return parameter_count(model_config(str(values.pop("type", "")), **values))
    except (ConfigError, TypeError, ValueError):
        return None


def dataset_of(run_dir: Path) -> str | None:
    """The dataset the run in ``run_dir`` records (its directory, absolute), or None where it
    records none (no run there)."""
    data = RunDir(run_dir).recorded_config().get("data")
    if isinstance(data, dict) and isinstance(data.get("dataset"), str):
        return str(data["dataset"])
    return None


def recorded_dataset(results: Sequence[StageResult]) -> str | None:
    """The dataset the stages' runs record, or None where none does."""
    return next(filter(None, (dataset_of(r.run_dir) for r in results)), None)


def recorded_text(results: Sequence[StageResult]) -> dict[str, Any] | None:
    """What the stages' runs record of their text (:func:`text_of`), or None where none does
    (a stage trained before they recorded it)."""
    return next(filter(None, (text_recorded(r.run_dir) for r in results)), None)


def text_recorded(run_dir: Path) -> dict[str, Any] | None:
    """What the stage run in ``run_dir`` records of its text (:func:`text_of`), or None where
    it records none."""
    experiment = RunDir(run_dir).recorded_config().get("experiment")
    text = experiment.get("text") if isinstance(experiment, dict) else None
    return text if isinstance(text, dict) else None


def of_one_dataset(results: Sequence[StageResult]) -> list[StageResult]:
    """``results``, all trained on one dataset; stages of several are refused, naming two of
    them and their stages (an ``--out`` written before a build refused a second dataset, or
    the same dataset directory prepared again from another text: :func:`text_changed`)."""
    groups: list[list[StageResult]] = []
    for r in results:
        group = next((g for g in groups if not _apart(g[0].run_dir, r.run_dir)), None)
        if group is None:
            groups.append([r])
        else:
            group.append(r)
    if len(groups) > 1:
        first, second = groups[:2]
        a, b = dataset_of(first[0].run_dir), dataset_of(second[0].run_dir)
        again = " as prepared again from another text" if a == b else ""
        raise ConfigError(f"{results[0].run_dir.parent} holds stages trained on different "
                          f"datasets: {', '.join(r.stage.name for r in first)} on {a}, "
                          f"{', '.join(r.stage.name for r in second)} on {b}{again}; a report "
                          "compares the stages of one: pass --stages with one dataset's")
    return list(results)


def _apart(run: Path, other: Path) -> bool:
    """The stage runs ``run`` and ``other`` were trained on different datasets: two
    directories, or one holding another text each time (where both record it)."""
    return dataset_of(run) != dataset_of(other) or text_changed(run, text_recorded(other) or {})


def by_time(results: Sequence[StageResult]) -> bool:
    """Whether the plot's curves go over training time (a stage trained to a time budget)
    or over steps (each to its --max-iters)."""
    return any(r.time_budget for r in results)


def write_tables(results: Sequence[StageResult], out: Path, lecture: str = "lecture",
                 unit: str = "char") -> tuple[Path, Path]:
    """``gpt_build.csv`` and ``gpt_build.md`` in ``out`` (``lecture``, ``unit``: as
    :func:`markdown`)."""
    out.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out / "gpt_build.csv", out / "gpt_build.md"
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows(results))
    md_path.write_text(markdown(results, commands=True, lecture=lecture, unit=unit))
    return csv_path, md_path


def curve(run_dir: Path, by_time: bool) -> list[tuple[float, float]]:
    """A stage's val-loss estimates from its ``metrics.csv``: (seconds or step, loss). The
    final evaluation on the whole split, the row without a learning rate, is left out: it is
    the left panel's figure, of another measure, and at the last estimate's step it drew a
    vertical drop at the end of every curve."""
    key = "elapsed_s" if by_time else "step"
    return [(float(r[key]), float(r["val_loss"])) for r in read_rows(run_dir / "metrics.csv")
            if r["val_loss"] and r["lr"]]


def loss_unit(text: Mapping[str, Any]) -> str:
    """What a stage's loss is averaged over, named by the tokenizer of ``text``
    (:func:`text_of`): a character where each token is one (``char``, the lecture's and the
    default, and ``char-prose``), else a token."""
    kind = TOKENIZERS.get(str(text.get("tokenizer")))
    return "char" if kind is not None and issubclass(kind, CharTokenizer) else "token"


def plot(results: Sequence[StageResult], path: Path, by_time: bool, unit: str = "char",
         lecture_text: bool = True) -> Path:
    """``gpt_build.png``: each stage's final val loss beside the lecture's (left), and its
    val-loss estimates over training time or steps (right). ``unit``: what the losses are
    averaged over (:func:`loss_unit`); ``lecture_text``: whether the run's data is the
    lecture's (:func:`lectures_text`), else the lecture's series is named as another text's."""
    from scratchgpt.viz import pyplot, save_figure

    fig, (left, right) = pyplot().subplots(1, 2, figsize=(12, 4.6))
    _plot_final(left, [(r.stage.name, r.val_loss, r.stage.lecture) for r in results], unit,
                lecture_text)
    _plot_during_training(right, results, by_time)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_from_csv(table: Path, path: Path, unit: str = "char",
                  lecture_text: bool = True) -> Path:
    """The left panel of :func:`plot` alone, the final val loss per stage beside the
    lecture's, drawn from a report table: ``gpt_build.csv``, or rows of its columns
    ``stage``, ``val_loss`` and ``lecture_val_loss`` written from recorded figures (a table
    holds no curves, so there is no right panel). ``unit``, ``lecture_text``: as
    :func:`plot`."""
    from scratchgpt.viz import pyplot, save_figure

    finals = _finals_of(table)
    fig, ax = pyplot().subplots(figsize=(6.5, 4.6))
    _plot_final(ax, finals, unit, lecture_text)
    fig.tight_layout()
    return save_figure(fig, path)


def _finals_of(table: Path) -> list[tuple[str, float, float | None]]:
    """(stage, val loss, lecture's val loss or None) of each row of a report table."""
    try:
        with open(table, newline="", errors="replace") as f:
            found = list(csv.DictReader(f))
        return [(row["stage"], float(row["val_loss"]),
                 float(row["lecture_val_loss"]) if row.get("lecture_val_loss") else None)
                for row in found]
    except OSError as e:
        raise DataError(f"cannot read {table}: {e.strerror or e}") from None
    except (KeyError, TypeError, ValueError):
        raise DataError(f"{table} is not a gpt-build report table (a row without a stage "
                        "or a number for val_loss)") from None


def _plot_final(ax: Any, finals: Sequence[tuple[str, float, float | None]], unit: str,
                lecture_text: bool) -> None:
    """The final val loss of each stage of ``finals`` (name, loss, lecture's loss or None),
    with the lecture's beside it."""
    x = range(len(finals))
    ax.plot(x, [loss for _, loss, _ in finals], "o-", label="this run")
    lecture = [(i, ref) for i, (_, _, ref) in enumerate(finals) if ref]
    if lecture:
        ax.plot(*zip(*lecture, strict=True), "s--", color="gray", mfc="none",
                label="Let's build GPT" + ("" if lecture_text else f", on {OTHER_TEXT}"))
    ax.set_xticks(list(x), [name for name, _, _ in finals], rotation=30, ha="right")
    ax.set_ylabel(f"val loss (nats/{unit})")
    ax.set_title("final val loss per stage")
    _at_least_a_span(ax, [loss for _, loss, _ in finals] + [ref for _, ref in lecture])
    ax.legend()


# The least range of the final losses' axis, in nats: a stage or two alone were drawn on an
# axis of a few thousandths, where 2.4948 against the lecture's 2.49 spanned the whole panel.
MIN_SPAN = 0.5


def _at_least_a_span(ax: Any, values: Sequence[float]) -> None:
    """Widen ``ax``'s vertical range around ``values`` to :data:`MIN_SPAN` if it is less
    (a diverged stage's NaN or infinity aside: matplotlib leaves those out)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return
    low, high = min(finite), max(finite)
    if high - low < MIN_SPAN:
        middle = (low + high) / 2
        ax.set_ylim(middle - MIN_SPAN / 2, middle + MIN_SPAN / 2)


def _plain_log_formatter(base: Any) -> Any:
    """A log axis's ``LogFormatter`` (``base``: matplotlib's, imported by the caller) that
    writes the ticks it labels as plain numbers: 20 and 1000 as such, not 2 x 10^1 and 10^3,
    and 0.3 s as 0.3, where matplotlib's wrote '3e-01', whose labels ran into each other
    ('3e-04e-01') on the time axis of a stage that evaluated within its first second."""

    class PlainLogFormatter(base):  # type: ignore[misc, valid-type]
        def __call__(self, x: float, pos: int | None = None) -> str:
            return f"{x:g}" if super().__call__(x, pos) else ""

    return PlainLogFormatter


def _plot_during_training(right: Any, results: Sequence[StageResult], by_time: bool) -> None:
    """The right panel: each stage's val-loss estimates over training time or steps."""
    from matplotlib.ticker import LogFormatter

    drawn = 0
    for r in results:
        points = curve(r.run_dir, by_time)
        if points:
            right.plot(*zip(*points, strict=True), ".-", label=r.stage.name, lw=1.2, ms=3)
            drawn += 1
    right.set_xlabel("training time (s)" if by_time else "step")
    right.set_ylabel("val loss estimate")
    right.set_title("val loss during training")
    if not drawn:  # an empty frame and an empty legend said nothing of why
        right.text(0.5, 0.5, "no estimate during training:\n--eval-interval is longer than "
                   "the stages' steps", ha="center", va="center", transform=right.transAxes)
        right.set_xticks([])
        right.set_yticks([])
        return
    right.set_xscale("log")
    for ticks in (right.xaxis.set_major_formatter, right.xaxis.set_minor_formatter):
        ticks(_plain_log_formatter(LogFormatter)())
    # beside the axes: eight stages' names inside them covered the curves they name
    right.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
