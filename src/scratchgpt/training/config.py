"""Training configuration: one dataclass, named presets, config files, and CLI flags.

Precedence, lowest to highest: dataclass defaults < preset < config file (TOML or JSON; data,
never executed) < command-line flags. The resolved configuration is saved with every run.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from scratchgpt.errors import ConfigError
from scratchgpt.validation import (
    COUNT_MAX,
    SEED_MAX,
    THREADS_MAX,
    check_range,
    check_types,
    json_loads,
    refuse_unknown_fields,
)


def parse_duration(text: str | float | int | None) -> float | None:
    """'90s', '10m', '1.5h', '45' (seconds) -> seconds; None/'' -> None."""
    if text is None or text == "":
        return None
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(s|sec|m|min|h)?\s*", str(text))
        if not m:
            raise ConfigError(f"cannot read duration {text!r}; use e.g. 90s, 10m or 1.5h")
        seconds = float(m.group(1)) * {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600,
                                        None: 1}[m.group(2)]
    if not 0 < seconds < float("inf"):
        raise ConfigError(f"duration must be positive, got {text!r}")
    return seconds


OPTIMIZERS = ("adamw", "muon")  # see training/optim.py: make_optimizer
SCHEDULES = ("cosine", "wsd")  # see training/optim.py: lr_at
WINDOWS = ("random", "epoch")  # see training/task.py: LanguageModelTask
DTYPES = ("auto", "bf16", "fp32")
DEVICES = ("auto", "cpu", "cuda")


# Settings that shape a language model's windows of tokens: a task of whole examples
# (seq2seq pairs, fine-tuning's labelled texts and conversations) has none of them, and the
# commands that train one do not offer them
LM_WINDOW_SETTINGS = frozenset({"seq_len_warmup", "batch_size_ramp", "windows"})


@refuse_unknown_fields
@dataclass
class TrainConfig:
    """How a model is trained: every training in scratchgpt (language models, seq2seq,
    experiments, fine-tuning) runs on these settings. The model's own shape is in its config."""

    batch_size: int = field(default=12, metadata={
        "help": "sequences per optimizer micro-step (per process with --nproc)"})
    grad_accum: int = field(default=1, metadata={"help": "micro-steps accumulated per update"})
    max_iters: int = field(default=2000, metadata={"help": "optimizer updates to run"})
    time_budget: str = field(default="", metadata={
        "help": "stop after this much wall time of training (e.g. 90s, 10m), the periodic "
                "evaluations included, and one-off set-up (the first run on a machine builds "
                "the C kernels) not; the LR schedule then decays over the budget (or over "
                "max_iters if they end first). Training ends cleanly with a final eval and "
                "checkpoint ('' = no budget, where a preset sets one)"})
    learning_rate: float = field(default=1e-3, metadata={"help": "peak learning rate",
                                                          "aliases": ["--lr"]})
    min_lr: float = field(default=1e-4, metadata={
        "help": "final learning rate of the schedule (cosine or wsd)"})
    warmup_iters: int = field(default=100, metadata={"help": "linear warmup updates"})
    lr_decay_iters: int = field(default=0, metadata={
        "help": "updates over which the schedule runs (0 = max_iters). A resumed run keeps "
                "its own length unless this is given (its lr_decay_iters, the max_iters it "
                "began with, or the step its spent time budget ended it at): a larger "
                "max_iters trains on at min_lr past it"})
    schedule: str = field(default="cosine", metadata={
        "help": "learning-rate shape after the warmup: cosine (from learning_rate down to "
                "min_lr over the run) or wsd (warmup-stable-decay: hold learning_rate, then "
                "decay linearly to min_lr over the last --decay-fraction of the run)"})
    decay_fraction: float = field(default=0.4, metadata={
        "help": "with --schedule wsd: the final fraction of the run (of the updates, or of "
                "the time budget) over which the rate decays"})
    seq_len_warmup: int = field(default=0, metadata={
        "help": "language models: train on shorter windows first; the window grows linearly "
                "from a quarter of the context (block_size) to all of it over this many "
                "updates, in steps of 8 tokens (0 = the whole context from the start)"})
    batch_size_ramp: int = field(default=0, metadata={
        "help": "language models: start with fewer rows; the batch grows linearly from a "
                "quarter of --batch-size to all of it over this many updates (0 = the whole "
                "batch from the start)"})
    windows: str = field(default="random", metadata={
        "help": "language models: how training windows are drawn: random (each start drawn "
                "independently, as nanoGPT does) or epoch (every window of a random phase "
                "once per epoch, in random order: no text skipped or repeated within a pass; "
                "lower loss when a run sees the data only a few times)"})
    weight_decay: float = field(default=0.1, metadata={
        "help": "decoupled weight decay, on matrices only"})
    optimizer: str = field(default="adamw", metadata={
        "help": "adamw, or muon (Muon on the hidden matrices, AdamW on embeddings, head and "
                "vectors; often reaches a given loss in fewer steps)"})
    muon_lr_scale: float = field(default=1.0, metadata={
        "help": "with --optimizer muon: the Muon groups' rate is learning_rate times this"})
    embed_lr_scale: float = field(default=1.0, metadata={
        "help": "the embedding tables' rate (token table, value embeddings, learned "
                "positions; AdamW) is learning_rate times this"})
    muon_dtype: str = field(default="bf16", metadata={
        "help": "with --optimizer muon: precision of its Newton-Schulz orthogonalization: bf16 "
                "(torch.optim.Muon's own), fp32, or auto (bf16 where the hardware has it, else "
                "fp32: CPUs without bf16 instructions emulate it, many times slower)"})
    beta1: float = field(default=0.9, metadata={
        "help": "AdamW's decay of its running mean of gradients (with --optimizer muon: of "
                "the AdamW groups only)"})
    beta2: float = field(default=0.99, metadata={
        "help": "AdamW's decay of its running mean of squared gradients: nearer 1 averages "
                "over more steps (steadier, slower to adapt)"})
    grad_clip: float = field(default=1.0, metadata={"help": "max gradient norm (0 = off)"})
    eval_interval: int = field(default=250, metadata={"help": "updates between evaluations"})
    eval_iters: int = field(default=50, metadata={"help": "batches per periodic estimate"})
    log_interval: int = field(default=10, metadata={"help": "updates between metric rows"})
    dtype: str = field(default="auto", metadata={
        "help": "compute precision: auto (bf16 where the device runs it fast: a GPU that has "
                "it, a CPU with AVX-512 or AMX whose oneDNN has bf16; else fp32; config.json's "
                "dtype_resolved says which), bf16 (autocast), fp32"})
    device: str = field(default="auto", metadata={"help": "auto, cpu or cuda"})
    compile: bool = field(default=False, metadata={"help": "torch.compile the model"})
    threads: int = field(default=0, metadata={
        "help": "CPU threads for torch per process (0 = torch's default: one per core, or "
                "cores / nproc with --nproc). On a machine other jobs keep busy, 1 can be "
                "faster: threads that share a core wait on each other at every product"})
    nproc: int = field(default=1, metadata={
        "help": "data-parallel processes on this machine (torch.distributed: one per GPU "
                "with NCCL; on a CPU, processes sharing its cores with gloo)"})
    seed: int = field(default=1337, metadata={"help": "seed for init, batches and dropout"})

    def __post_init__(self) -> None:
        check_types(self)
        for name in ("batch_size", "grad_accum", "max_iters", "eval_interval", "eval_iters",
                     "log_interval", "nproc"):
            check_range(name, getattr(self, name), 1, COUNT_MAX)
        for name in ("warmup_iters", "lr_decay_iters", "seq_len_warmup", "batch_size_ramp"):
            check_range(name, getattr(self, name), 0, COUNT_MAX)
        check_range("threads", self.threads, 0, THREADS_MAX)
        check_range("seed", self.seed, 0, SEED_MAX)
        check_range("learning_rate", self.learning_rate, 0, low_open=True)
        check_range("min_lr", self.min_lr, 0, self.learning_rate)
        check_range("weight_decay", self.weight_decay, 0)
        check_range("grad_clip", self.grad_clip, 0)
        check_range("beta1", self.beta1, 0, 1, high_open=True)
        check_range("beta2", self.beta2, 0, 1, high_open=True)
        check_range("muon_lr_scale", self.muon_lr_scale, 0, low_open=True)
        check_range("embed_lr_scale", self.embed_lr_scale, 0, low_open=True)
        check_range("decay_fraction", self.decay_fraction, 0, 1, low_open=True)
        for name, choices in (("optimizer", OPTIMIZERS), ("schedule", SCHEDULES),
                              ("windows", WINDOWS), ("dtype", DTYPES), ("muon_dtype", DTYPES),
                              ("device", DEVICES)):
            if getattr(self, name) not in choices:
                raise ConfigError(f"{name} must be one of {', '.join(choices)}, "
                                  f"got {getattr(self, name)!r}")
        try:
            parse_duration(self.time_budget)
        except ConfigError as e:  # say which setting, as the checks above do
            raise ConfigError(f"time_budget: {e}") from None

    @property
    def time_budget_s(self) -> float | None:
        return parse_duration(self.time_budget)

    @property
    def decay_iters(self) -> int:
        return self.lr_decay_iters or self.max_iters

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """From saved settings; names this version does not know are an error."""
        unknown = set(values) - train_fields()
        if unknown:
            raise ConfigError(f"unknown training settings: {', '.join(sorted(unknown))}")
        return cls(**values)


# The options of the GPT-2 training speedrun (modded-nanogpt) that suit a small model on a
# CPU: rotary positions, normalized queries and keys, relu^2, blocks that start as the
# identity, value embeddings, U-net skips, soft-capped logits, an untied head, and a
# warmup-stable-decay schedule. GPT-2 cannot express the model options: the HF and GGUF
# exporters refuse such a model with the reason.
SPEEDRUN_OPTIONS: dict[str, Any] = dict(
    pos_encoding="rope", qk_norm=True, activation="relu2", zero_init_proj=True,
    value_embeds=1, unet_skips=True, logit_softcap=30.0, tie_weights=False,
    schedule="wsd", decay_fraction=0.4,
)

_CPU_SMALL: dict[str, Any] = dict(
    model="gpt", n_layer=4, n_head=4, n_embd=128, block_size=64, dropout=0.0,
    activation="gelu", batch_size=16, optimizer="muon", learning_rate=6e-3, min_lr=0.0,
    warmup_iters=100, max_iters=4000, muon_dtype="auto",
    eval_interval=500, eval_iters=20, beta2=0.99, weight_decay=0.1,
)

_CPU_MEDIUM: dict[str, Any] = dict(
    model="gpt", n_layer=6, n_head=6, n_embd=192, block_size=128, dropout=0.0,
    activation="gelu", batch_size=16, optimizer="muon", learning_rate=4e-3, min_lr=0.0,
    warmup_iters=200, max_iters=10000, muon_dtype="auto",
    eval_interval=1000, eval_iters=20, beta2=0.99, weight_decay=0.1,
)

# Named starting points. Each key is a TrainConfig field or a model hyperparameter.
PRESETS: dict[str, dict[str, Any]] = {
    "cpu-small": dict(
        # A fast demo on a laptop CPU. Small batches and a high learning rate learn the most per
        # second at this size; Muon with a cosine to zero beats AdamW by ~0.13 nats at 90 s
        # (sweeps in docs/BENCHMARKS.md). Muon's orthogonalization in bf16 where the CPU has it,
        # else fp32 (emulated bf16 made a Muon step ~9x an AdamW step on an AVX2 CPU).
        **_CPU_SMALL,
    ),
    "cpu-medium": dict(
        # Ten minutes or so on a CPU: a wider, deeper model with more context, bf16 where fast.
        # Muon reaches a given loss in about half the updates AdamW needs here, which outweighs
        # its ~40% dearer step; annealing to zero beats stopping at lr/10 (sweep in
        # docs/BENCHMARKS.md). Dropout, even on the residual branches alone with masks made
        # cheap, narrows the train-val gap without lowering the 10-minute val loss.
        **_CPU_MEDIUM,
    ),
    "cpu-speedrun": dict(
        # The 90-second speedrun: the lowest 90 s loss measured on two cores. cpu-small with
        # half its layers (twice the updates, which at 90 s matter more than depth) and rotary
        # positions, the one speedrun option that paid for its cost there; the others, alone
        # or all together on cpu-small's shape, did not (docs/BENCHMARKS.md). A higher rate,
        # half the warmup and three times the weight decay: at 850 and at 2,500 updates alike
        # (what 90 s give a slow and a fast CPU) 1e-2 ended lower than cpu-small's 6e-3 and
        # than 1.5e-2, and then 0.3 lower than 0.1 (by 0.06 nats/token at 2,500). The budget is
        # part of the preset: the schedule decays over it, and --time-budget changes it (''
        # turns it off, for runs bounded by --max-iters alone). On a byte-level BPE of 768
        # ids (prepare --tokenizer bpe --vocab-size 768) it reaches 1.446-1.450 nats per
        # character on Tiny Shakespeare on a 2-core Zen 4 (1.49 with cpu-small's rate and
        # decay), and 1.51-1.54 on a CPU a third as fast (1.56 there with cpu-small's). A
        # third layer or 192 dims were level on the Zen 4. Windows epoch by epoch: a
        # 90 s run reads a small text only a few times, and random windows would skip a third
        # of it in a pass (0.038 nats/token lower over four seeds at 850 updates).
        _CPU_SMALL, n_layer=2, learning_rate=1e-2, warmup_iters=50, weight_decay=0.3,
        max_iters=1_000_000, pos_encoding="rope", time_budget="90s", windows="epoch",
    ),
    "cpu-medium-speedrun": dict(
        # cpu-medium with every option of SPEEDRUN_OPTIONS, ramps of 600 updates (about a
        # quarter of what ten minutes on two cores give): the lowest 10-minute loss measured
        # on characters (docs/BENCHMARKS.md: 1.466 against cpu-medium's 1.482 on Tiny
        # Shakespeare, ahead on two other texts too). cpu-speedrun on a 768-id BPE does better:
        # with 4 layers 1.419-1.423 on a CPU a third as fast, and on the Zen 4 that measured
        # this preset (bf16, three times the updates) with 6 layers x 192 and weight decay 0.6
        # 1.391-1.398; since attention moved to C its extra updates fit the text more closely
        # (1.398 and 1.405 at 0.6), and weight decay 0.8 ended at 1.391-1.397 in four runs
        # (docs/BENCHMARKS.md). cpu-medium itself stays GPT-2's architecture, so it exports
        # to HF (GGUF only with --activation gelu_tanh: llama.cpp's gpt2 has no exact GELU).
        # Its rate and shape are the best of their neighbours at 10 minutes (rate 2.5e-3 or
        # 6e-3, 4 layers x 256 or 8 x 192 all ended higher), and it is no
        # better without QK-norm or without the ramps.
        {**_CPU_MEDIUM, **SPEEDRUN_OPTIONS}, seq_len_warmup=600, batch_size_ramp=600,
    ),
    "shakespeare-gpu": dict(
        # nanoGPT's Shakespeare-char model (6 layers, 6 heads, 384 dims, 256 context, dropout
        # 0.2, batch 64) trained with Muon, annealed to zero over 1,400 updates. On one H200
        # six runs (five seeds) ended at 1.451-1.460 on the full validation split in 18-21 s
        # of training; at 1,200 updates seed 1337 ended above 1.47 in two runs of three.
        # nanoGPT's own schedule (AdamW at 1e-3 over 5,000 updates) in this trainer touched
        # 1.458 at update 1,750 (29 s), then overfit to 1.71 by its end (docs/BENCHMARKS.md).
        # 50 batches of each split per evaluation already cover the 111 k validation
        # characters seven times over. On a CPU, add --time-budget.
        model="gpt", n_layer=6, n_head=6, n_embd=384, block_size=256, dropout=0.2,
        batch_size=64, optimizer="muon", learning_rate=4e-3, min_lr=0.0, warmup_iters=100,
        max_iters=1400, muon_dtype="auto", eval_interval=250, eval_iters=50, beta2=0.99,
        weight_decay=0.1,
    ),
    # A target/draft pair for speculative sampling (``scratchgpt bench speculative``). Both are
    # character level and must be trained on the same prepared dataset (same tokenizer). The
    # target has nanoGPT's Shakespeare shape but a CPU-sized batch and no dropout, for short
    # time-budgeted runs; the draft is ~60x cheaper per decode step on a CPU.
    "shakespeare-target": dict(
        model="gpt", n_layer=6, n_head=6, n_embd=384, block_size=256, dropout=0.0,
        batch_size=12, learning_rate=1.5e-3, min_lr=1.5e-4, warmup_iters=30, max_iters=5000,
        eval_interval=100, eval_iters=10, beta2=0.99, weight_decay=0.1,
    ),
    "shakespeare-draft": dict(
        model="gpt", n_layer=2, n_head=4, n_embd=128, block_size=256, dropout=0.0,
        batch_size=16, learning_rate=2e-3, min_lr=2e-4, warmup_iters=50, max_iters=5000,
        eval_interval=200, eval_iters=10, beta2=0.99, weight_decay=0.1,
    ),
    "warandpeace-lstm": dict(
        # Karpathy's char-rnn scale on War and Peace, one size up: a 4-layer LSTM of 512 units
        # (~8.5M parameters), trained on 128-character windows. Use with --dataset warandpeace
        # (character level, prose-normalized). Meant for a GPU; on a CPU add --time-budget.
        model="lstm", n_layer=4, hidden=512, block_size=128, dropout=0.2,
        batch_size=64, learning_rate=2e-3, min_lr=2e-4, warmup_iters=100, max_iters=10000,
        eval_interval=500, eval_iters=50, beta2=0.99, weight_decay=0.0, grad_clip=1.0,
    ),
}


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML or JSON config file into a flat dict of settings."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    if not path.is_file():
        raise ConfigError(f"config file {path} is not a plain file")
    if path.suffix not in (".toml", ".json"):
        raise ConfigError(f"config file {path} must end in .toml or .json")
    try:
        # utf-8-sig: a byte-order mark some editors write is not the first setting's text
        text = path.read_text(encoding="utf-8-sig")
        data = tomllib.loads(text) if path.suffix == ".toml" else json_loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot parse config file {path}: {e}") from None
    except RecursionError:  # tomllib recurses once per level of nesting
        raise ConfigError(f"cannot parse config file {path}: nested too deeply") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold an object of settings "
                          f'({{"n_layer": 4, ...}}), not a {type(data).__name__}')
    return _flatten(path, data)


def _flatten(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """The settings of a file that may group them in [model] / [train] tables, as one flat
    dict. A setting given twice (at the top and in a table, or in both tables) is refused:
    which one won would depend on their order in the file."""
    flat: dict[str, Any] = {}
    where: dict[str, str] = {}
    for key, value in data.items():
        table = key if isinstance(value, dict) and key in ("model", "train") else None
        for name, v in (value.items() if table else [(key, value)]):
            place = f"in [{table}]" if table else "at the top level"
            if name in flat:
                raise ConfigError(f"config file {path} sets {name} twice ({where[name]} and "
                                  f"{place}); keep one")
            flat[name], where[name] = v, place
    return flat


def train_fields() -> set[str]:
    return {f.name for f in fields(TrainConfig)}
