"""Training and evaluation of the encoder-decoder models on (source, target) pairs.

Training runs on the training core (``training/trainer.py``) with :class:`Seq2SeqTask`:
teacher forcing with cross-entropy over the target tokens, batches of similar source length
(less padding), periodic held-out loss, and at the end the loss over every held-out pair and
the exact match of greedy decodes of the first ``eval_pairs`` of them (all by default here;
``seq2seq train`` decodes ``seq2seq_defaults.DEFAULT_EVAL_PAIRS`` unless told otherwise, and
a run records how many: a resumed run decodes as many unless told otherwise), decoded in
batches of similar target length, each to its own longest target plus ``EVAL_MARGIN``.

Evaluation: exact match of greedy (or beam) decodes against the references, overall and by
source length.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from scratchgpt import memory
from scratchgpt.checkpoints.rundir import RunDir
from scratchgpt.data.translation import DataSpec, Pair
from scratchgpt.errors import ConfigError, GenerationError
from scratchgpt.generation.beam import check_length_penalty
from scratchgpt.models.seq2seq import (
    Seq2Seq,
    Seq2SeqConfig,
    SoFar,
    default_config,
    unused_settings,
)
from scratchgpt.tokenizers.seq2seq import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Seq2SeqTokenizer
from scratchgpt.training.config import TrainConfig
from scratchgpt.training.epochs import EpochBatches
from scratchgpt.training.job import TrainJob
from scratchgpt.training.precision import resolve_device, resolve_dtype
from scratchgpt.training.seq2seq_defaults import (
    DEFAULT_BUDGET,
    DEFAULT_EVAL_PAIRS,
    MIN_LR_FRACTION,
    TRAIN_DEFAULTS,
    UNLIMITED_ITERS,
)
from scratchgpt.training.settings import Settings, check_resumed_by, resumed_run
from scratchgpt.training.task import Batch, EvalSetting, _eval_mode
from scratchgpt.validation import flag_of
from scratchgpt.wording import plural, some_of

Example = tuple[list[int], list[int]]  # (source ids ending in <eos>, target ids without specials)


def encode_pairs(
    pairs: Sequence[Pair], src_tok: Seq2SeqTokenizer, tgt_tok: Seq2SeqTokenizer
) -> list[Example]:
    """Strings -> ids. Sources get a closing ``<eos>``; unknown characters become ``<unk>``."""
    return [(src_tok.encode(s) + [EOS_ID], tgt_tok.encode(t)) for s, t in pairs]


def collate(batch: Sequence[Example]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """-> src [B, S], src_lengths [B], tgt_in [B, T] (``<bos> y``), tgt_out [B, T] (``y <eos>``),
    right-padded with ``<pad>``."""
    b = len(batch)
    s = max(len(x) for x, _ in batch)
    t = max(len(y) for _, y in batch) + 1
    src = torch.full((b, s), PAD_ID, dtype=torch.long)
    tgt_in = torch.full((b, t), PAD_ID, dtype=torch.long)
    tgt_out = torch.full((b, t), PAD_ID, dtype=torch.long)
    for i, (x, y) in enumerate(batch):
        src[i, : len(x)] = torch.tensor(x)
        tgt_in[i, : len(y) + 1] = torch.tensor([BOS_ID] + y)
        tgt_out[i, : len(y) + 1] = torch.tensor(y + [EOS_ID])
    lengths = torch.tensor([len(x) for x, _ in batch])
    return src, lengths, tgt_in, tgt_out


def sequence_loss(model: nn.Module, batch: Batch, label_smoothing: float = 0.0) -> Tensor:
    """Mean cross-entropy over the real (non-pad) target tokens of a collated batch."""
    src, lengths, tgt_in, tgt_out = batch
    logits = model(src, lengths, tgt_in)  # [B, T, V]
    return F.cross_entropy(logits.flatten(0, 1).float(), tgt_out.flatten(),
                           ignore_index=PAD_ID, label_smoothing=label_smoothing)


class Seq2SeqTask:
    """Encoder-decoder training on (source, target) pairs, for the training core.

    Epochs of length-sorted batches are drawn with the core's generator
    (``training/epochs.py``), so a resumed run continues with the very next batch."""

    def __init__(self, spec: DataSpec, src_tok: Seq2SeqTokenizer, tgt_tok: Seq2SeqTokenizer,
                 train_pairs: Sequence[Pair], held_out: Sequence[Pair],
                 label_smoothing: float = 0.0, eval_pairs: int | None = None):
        self.spec, self.src_tok, self.tgt_tok = spec, src_tok, tgt_tok
        self.held_out = list(held_out)
        self.eval_pairs = eval_pairs  # the final check decodes the first so many (None: all)
        self.examples = encode_pairs(train_pairs, src_tok, tgt_tok)
        self.held_examples = encode_pairs(self.held_out, src_tok, tgt_tok)
        self.label_smoothing = label_smoothing
        self.epochs = EpochBatches([len(x) for x, _ in self.examples])
        self.final_eval: EvalResult | None = None

    @classmethod
    def from_spec(cls, spec: DataSpec, tokenizers: dict[str, Seq2SeqTokenizer] | None = None,
                  label_smoothing: float = 0.0, eval_pairs: int | None = None) -> Seq2SeqTask:
        """Pairs from ``spec``; tokenizers learned from the training pairs unless given (a
        resumed run keeps its own); ``eval_pairs`` held-out pairs decoded at the end (None:
        all)."""
        train_pairs, held = spec.load()
        if tokenizers is None:
            tokenizers = {"source": Seq2SeqTokenizer.train(s for s, _ in train_pairs),
                          "target": Seq2SeqTokenizer.train(t for _, t in train_pairs)}
        return cls(spec, tokenizers["source"], tokenizers["target"], train_pairs, held,
                   label_smoothing, eval_pairs)

    def fresh(self) -> Seq2SeqTask:
        """This task as it was made, on the same pairs (made and encoded once): no batch
        drawn yet and no final evaluation, for another model to train on."""
        task = copy.copy(self)
        task.epochs = EpochBatches(self.epochs.lengths)
        task.final_eval = None
        return task

    def model_config(self, arch: str, **overrides: Any) -> Seq2SeqConfig:
        """The default config of ``arch`` for these vocabularies, with ``overrides``."""
        return default_config(arch, self.src_tok.vocab_size, self.tgt_tok.vocab_size,
                              **self.src_tok.special_ids, **overrides)

    def train_batch(self, batch_size: int, generator: torch.Generator,
                    shard: tuple[int, int] = (0, 1)) -> Batch:
        return collate([self.examples[i] for i in self.epochs.next(batch_size, generator,
                                                                     shard)])

    def warm_up_batch(self, batch_size: int, seq_len: int | None = None) -> Batch:
        """A batch of the training batches' shape that draws from no generator and moves no
        epoch: the first ``batch_size`` training pairs (the trainer's untimed warm-up step;
        ``seq_len`` is a language model's: this task refuses a sequence-length warmup)."""
        return collate(self.examples[:batch_size])

    def loss(self, model: nn.Module, batch: Batch) -> Tensor:
        return sequence_loss(model, batch, self.label_smoothing)

    def batch_tokens(self, batch: Batch) -> int:
        return int((batch[3] != PAD_ID).sum())

    @torch.no_grad()
    def estimate(self, model: nn.Module, split: str, iters: int, setting: EvalSetting,
                 progress: str | None = None) -> float:
        """Teacher-forced loss over the first ``iters`` batches of a split, per target token.
        ``progress``: the name of a bar on stderr, by pairs, shown once the pass has run for a
        second."""
        from scratchgpt.bars import named_bar  # (not for training's imports)

        examples = self.examples if split == "train" else self.held_examples
        end = min(len(examples), iters * setting.batch_size)
        total, count = 0.0, 0
        with _eval_mode(model), named_bar(end, progress, "pair") as bar:
            for start in range(0, end, setting.batch_size):
                batch = tuple(t.to(setting.device)
                              for t in collate(examples[start:start + setting.batch_size]))
                n = self.batch_tokens(batch)
                total += sequence_loss(model, batch).item() * n
                count += n
                bar.update(batch[0].size(0))
        return total / max(count, 1)

    def final_pairs(self) -> tuple[list[Pair], list[Example]]:
        """(pairs, their ids): the held-out pairs the final check decodes, the first
        ``eval_pairs``."""
        n = self.eval_pairs or len(self.held_out)
        return self.held_out[:n], self.held_examples[:n]

    def final_metrics(self, model: nn.Module, iters: int,
                      setting: EvalSetting) -> dict[str, float]:
        """Train estimate, the loss over every held-out pair, and the greedy exact match of
        :meth:`final_pairs` (:func:`evaluate_by_length`). With ``setting.progress``, the
        decodes and the held-out loss each show a bar once they have run for a second."""
        self.final_eval = evaluate_by_length(model, self.final_pairs()[0], self.src_tok,
                                             self.tgt_tok, setting.batch_size,
                                             progress=setting.progress)  # (as check_memory
        # counts: batches of --batch-size, to at most the longest target + 2)
        return {"train_loss": self.estimate(model, "train", iters, setting),
                "val_loss": self.estimate(model, "val", len(self.held_examples), setting,
                                          "held-out loss" if setting.progress else None),
                "exact_match": self.final_eval.exact_match}

    def final_scope(self) -> str:
        """What :meth:`final_metrics` goes through, said before it by a run its budget ended."""
        decoded, held = len(self.final_pairs()[0]), len(self.held_out)
        which = f"the first {decoded:,}" if decoded < held else "all of them"
        return (f"the loss over {plural(held, 'held-out pair', grouped=True)} and greedy decodes "
                f"of {which} (in batches of similar target length, each to its longest target "
                f"+ {EVAL_MARGIN} tokens)")

    def report(self) -> str:
        if self.final_eval is None:
            return ""
        text = format_eval(self.final_eval)
        if self.final_eval.total < len(self.held_out):
            text += "\n" + subset_note(self.final_eval.total, len(self.held_out),
                                       "held-out pairs", "--eval-pairs; 'seq2seq eval --which "
                                       "last --eval-pairs 0' scores them all")
        return text

    def tokenizers(self) -> dict[str, Any]:
        return {"source": self.src_tok, "target": self.tgt_tok}

    def data(self) -> dict[str, Any]:
        """What the run records of its data and how it is scored: the pairs, the label
        smoothing, and ``eval_pairs``, as ``--eval-pairs`` gives it (0: all)."""
        return {"seq2seq": asdict(self.spec), "label_smoothing": self.label_smoothing,
                "eval_pairs": self.eval_pairs or 0}

    def state_dict(self) -> dict[str, Any]:
        return self.epochs.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epochs.load_state_dict(state)


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------


@dataclass
class EvalResult:
    correct: int
    total: int
    by_length: dict[str, tuple[int, int]]  # "lo-hi" source characters -> (correct, total)
    predictions: list[str]

    @property
    def exact_match(self) -> float:
        return self.correct / max(self.total, 1)


def length_bucket(n: int, width: int = 5) -> str:
    lo = (n - 1) // width * width + 1
    return f"{lo:>2}-{lo + width - 1}"


def translate(
    model: Seq2Seq, sources: Sequence[str], src_tok: Seq2SeqTokenizer,
    tgt_tok: Seq2SeqTokenizer, beam: int = 1, max_len: int = 64, batch_size: int = 256,
    length_penalty: float = 1.0, out: list[str] | None = None,
    limits: Sequence[int] | None = None, progress: str | None = None,
) -> tuple[list[str], list[list[int]], list[Tensor]]:
    """Decode ``sources``; -> (texts, token ids, attention [out tokens, source tokens] each).
    An empty source, or one longer than the model reads, is a GenerationError. ``out``: a list
    that holds the texts decoded so far, a batch at a time (for a caller Ctrl-C stops);
    ``limits``: see :func:`translate_batches`; ``progress``: the name of a bar on stderr, by
    source (pair), shown once decoding has run for a second."""
    from scratchgpt.bars import named_bar  # (not for training's imports)

    texts: list[str] = []
    all_ids: list[list[int]] = []
    all_attn: list[Tensor] = []
    with named_bar(len(sources), progress, "pair") as bar:
        for batch_texts, ids, attn in translate_batches(model, sources, src_tok, tgt_tok, beam,
                                                        max_len, batch_size, length_penalty,
                                                        limits=limits):
            texts += batch_texts
            if out is not None:
                out += batch_texts
            all_ids += ids
            all_attn += attn
            bar.update(len(batch_texts))
    return texts, all_ids, all_attn


def translate_batches(
    model: Seq2Seq, sources: Sequence[str], src_tok: Seq2SeqTokenizer,
    tgt_tok: Seq2SeqTokenizer, beam: int = 1, max_len: int = 64, batch_size: int = 256,
    length_penalty: float = 1.0, cut: list[Stopped] | None = None,
    limits: Sequence[int] | None = None,
) -> Iterator[tuple[list[str], list[list[int]], list[Tensor]]]:
    """:func:`translate` a batch at a time: yields (texts, token ids, attention) of each
    ``batch_size`` sources in order, as soon as they are decoded, so that a caller stopped by
    Ctrl-C has the batches before; and ``cut``, a list, holds then what the batch the stop
    cut had decoded (:class:`Stopped`, one a source of it; none before its first step).
    Every source is checked before the first is decoded. ``limits``: the most output tokens
    each source needs (at most ``max_len``): a batch then decodes to its rows' largest, not
    to ``max_len``."""
    check_length_penalty(length_penalty)
    device = next(model.parameters()).device
    model.eval()
    examples = [(src_tok.encode(s) + [EOS_ID], []) for s in sources]
    check_lengths(model, [len(x) for x, _ in examples], max_len)
    check_decode_fits(model, min(len(examples), batch_size) * beam,
                      max(len(x) for x, _ in examples), max_len, beam)
    for i in range(0, len(examples), batch_size):
        src, lengths, _, _ = collate(examples[i : i + batch_size])
        src, lengths = src.to(device), lengths.to(device)
        so_far: SoFar | None = None if cut is None else []
        bound = max_len if limits is None else min(max_len, max(limits[i : i + batch_size]))
        try:
            if beam == 1:
                ids, attn = model.greedy_decode(src, lengths, bound, out=so_far)
            else:
                ids, attn = model.beam_decode(src, lengths, beam, bound, length_penalty,
                                              out=so_far)
        except KeyboardInterrupt:  # (Ctrl-C, or SIGTERM's Terminated)
            if cut is not None:
                cut[:] = [Stopped(tgt_tok.decode(x), x, whole) for x, whole in so_far or []]
            raise
        yield [tgt_tok.decode(x) for x in ids], ids, attn


@dataclass
class Stopped:
    """A translation a stop cut part-way (:func:`translate_batches`): its ``text`` and ``ids``
    so far, ``whole`` where they are what the whole decode gives (it had ended)."""

    text: str
    ids: list[int]
    whole: bool


def check_lengths(model: Seq2Seq, source_lengths: Sequence[int], max_len: int) -> None:
    """Sources (with their end token) and outputs must fit the model: not empty, and within
    a transformer's position table (``max_positions``)."""
    if any(n <= 1 for n in source_lengths):
        raise GenerationError("a source is empty; give text to translate")
    limit = model.config.max_positions if model.config.arch == "transformer" else None
    if limit is None:
        return
    trained = f"trained with --max-positions {limit}"
    too_long = [n for n, length in enumerate(source_lengths, start=1) if length > limit]
    if too_long:  # (it said 'a source has N tokens': which of thousands of lines, it did not)
        first, total = too_long[0], len(source_lengths)
        which = "the source" if total == 1 else f"source {first} of {total}"
        also = (f"; {some_of(len(too_long), total, 'source')} too long in all"
                if len(too_long) > 1 else "")
        raise GenerationError(f"{which} has {source_lengths[first - 1] - 1} tokens, more than "
                              f"the {limit - 1} this model reads ({trained}){also}")
    if max_len > limit:
        raise GenerationError(f"--max-len {max_len} exceeds the {limit} positions this model "
                              f"can write ({trained})")


def check_decode_fits(model: Seq2Seq, rows: int, source_len: int, max_len: int,
                      beam: int) -> None:
    """A decode of ``rows`` hypotheses (sources x beam) fits in memory: checked before it
    starts, so a huge ``--beam`` or ``--max-len`` is refused rather than failing to allocate.
    Per row: the log-probabilities and the beam's candidates (3 x vocabulary), and per output
    token the attention kept for the heatmap (a source's length) and the decoder's activations
    (a transformer re-reads its outputs: about 8 x d_model per layer)."""
    c = model.config
    what = f"decoding with --beam {beam} and --max-len {max_len}"
    memory.check_fits(decode_estimate(c, rows, source_len, max_len), what,
                      next(model.parameters()).device, error=GenerationError)


def decode_estimate(c: Seq2SeqConfig, rows: int, source_len: int, max_len: int
                    ) -> memory.Estimate:
    """Bytes :func:`check_decode_fits` counts, with the attention of the encoder and of a
    decoder step (:func:`attention_floats`)."""
    per_token = source_len + 8 * c.d_model * c.n_layer
    floats = rows * (3 * c.tgt_vocab + max_len * per_token
                     + attention_floats(c, source_len, max_len, training=False))
    return memory.Estimate({"decoding": memory.FP32 * floats})


def evaluate(
    model: Seq2Seq, pairs: Sequence[Pair], src_tok: Seq2SeqTokenizer,
    tgt_tok: Seq2SeqTokenizer, beam: int = 1, max_len: int | None = None,
    length_penalty: float = 1.0, batch_size: int = 256, decoded: list[str] | None = None,
) -> EvalResult:
    """Exact-match accuracy of targets decoded as :func:`translate` decodes them (``batch_size``
    sources at a time), overall and by source length. ``decoded``: a list that holds the
    outputs of the first pairs as their batches are decoded, so that a caller stopped by
    Ctrl-C can :func:`score` them."""
    if max_len is None:
        max_len = eval_max_len(model.config, max(len(t) for _, t in pairs))
    preds, _, _ = translate(model, [s for s, _ in pairs], src_tok, tgt_tok, beam, max_len,
                            batch_size=batch_size, length_penalty=length_penalty, out=decoded)
    return score(pairs, preds)


def evaluate_by_length(model: Seq2Seq, pairs: Sequence[Pair], src_tok: Seq2SeqTokenizer,
                       tgt_tok: Seq2SeqTokenizer, batch_size: int = 256,
                       progress: bool = False) -> EvalResult:
    """:func:`evaluate`'s greedy exact match, overall and by source length, for less: the
    pairs are decoded in batches of similar target length, each batch to its own longest
    target plus :data:`EVAL_MARGIN` (:func:`eval_max_len`), where :func:`evaluate` decodes
    every batch to the longest target of all. An output that runs past its own target and
    ``<eos>`` matches nothing either way, so no figure changes; but an undertrained model,
    which ends no output, decoded every batch to the longest: on reverse (10-60 letters) the
    short pairs' batches took as long as the longest's. The predictions are in ``pairs``'
    order; one that never ended is cut at its batch's bound. ``progress``: a bar on stderr, by
    pairs, once the decodes have run for a second."""
    order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][1]))
    ranked = [pairs[i] for i in order]
    limits = [eval_max_len(model.config, len(t)) for _, t in ranked]
    preds, _, _ = translate(model, [s for s, _ in ranked], src_tok, tgt_tok,
                            max_len=max(limits), batch_size=batch_size, limits=limits,
                            progress="greedy decodes" if progress else None)
    outputs = [""] * len(pairs)
    for i, pred in zip(order, preds, strict=True):
        outputs[i] = pred
    return score(pairs, outputs)


def score(pairs: Sequence[Pair], preds: Sequence[str]) -> EvalResult:
    """The exact match of outputs ``preds`` against the targets of ``pairs``, overall and by
    source length."""
    by_length: dict[str, tuple[int, int]] = {}
    correct = 0
    for (s, t), p in zip(pairs, preds, strict=True):
        ok = int(p == t)
        correct += ok
        key = length_bucket(len(s))
        c, n = by_length.get(key, (0, 0))
        by_length[key] = (c + ok, n + 1)
    return EvalResult(correct, len(pairs), dict(sorted(by_length.items())), list(preds))


# Output tokens :func:`evaluate` decodes beyond the longest target: its ``<eos>`` and one
# more, so that an output longer than every reference shows as longer. An output that has not
# ended by then matches no target: decoding on would change no exact match, and an untrained
# model (which never ends) decoded twice the longest target, plus 2, every time.
EVAL_MARGIN = 2


def eval_max_len(config: Seq2SeqConfig, longest_target: int) -> int:
    """:func:`evaluate`'s longest output without ``max_len``: the longest target plus
    :data:`EVAL_MARGIN`; at most a transformer's position table."""
    max_len = longest_target + EVAL_MARGIN
    return min(max_len, config.max_positions) if config.arch == "transformer" else max_len


def subset_note(scored: int, total: int, what: str, why: str) -> str:
    """The line under an exact-match table of the first ``scored`` of ``total`` pairs:
    ``(the first 12 of the 300 held-out pairs, --eval-pairs)``, ``why`` saying whose number."""
    return f"(the first {scored:,} of the {total:,} {what}, {why})"


def format_eval(ev: EvalResult) -> str:
    """Multi-line report: exact match overall and by source length."""
    lines = [f"exact match {ev.exact_match:.2%} ({ev.correct}/{ev.total})",
             "  source chars   exact match"]
    for key, (c, n) in ev.by_length.items():
        lines.append(f"  {key:>12}   {c / n:7.2%}  ({c}/{n})")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# A seq2seq training job
# ---------------------------------------------------------------------------------------------

def train_config(flags: dict[str, Any]) -> TrainConfig:
    """The training settings of a new seq2seq run: :data:`TRAIN_DEFAULTS` < ``flags``."""
    values = {**TRAIN_DEFAULTS, **flags}
    if "max_iters" not in flags:
        values["max_iters"] = UNLIMITED_ITERS
        values.setdefault("time_budget", DEFAULT_BUDGET)
    values.setdefault("min_lr", MIN_LR_FRACTION * values["learning_rate"])
    return check_ends(TrainConfig(**values))


def check_ends(cfg: TrainConfig) -> TrainConfig:
    """A run without --max-iters ends at its time budget: ``--time-budget ''`` (no budget)
    there trained for ever (10^12 updates), its schedule stuck at the peak rate."""
    if cfg.max_iters >= UNLIMITED_ITERS and not cfg.time_budget:
        raise ConfigError("--time-budget '' leaves this run no end: it has no --max-iters; "
                          "give --max-iters N or a --time-budget such as 10m")
    return cfg


def seq2seq_task(spec: dict[str, Any], tokenizers: dict[str, dict[str, Any]] | None,
                 label_smoothing: float = 0.0, eval_pairs: int | None = None) -> Seq2SeqTask:
    """The task of a run (picklable for data-parallel processes): pairs from ``spec``, the
    run's saved tokenizers when resuming."""
    toks = None if tokenizers is None else {
        role: Seq2SeqTokenizer.from_dict(state) for role, state in tokenizers.items()}
    return Seq2SeqTask.from_spec(DataSpec(**spec), toks, label_smoothing, eval_pairs)


class PlannedTask:
    """``TrainJob.task`` of a seq2seq run: the task its plan built, whose pairs were made and
    encoded to check the run (seconds for dates), reused by the training in this process;
    made again by ``make`` in any other, to which it is not sent (picklable)."""

    def __init__(self, make: Callable[[], Seq2SeqTask], task: Seq2SeqTask | None = None):
        self.make, self.task = make, task

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "task": None}

    def __call__(self) -> Seq2SeqTask:
        if self.task is None:
            self.task = self.make()
        return self.task


def eval_pairs_of(given: int | None, recorded: int | None = None) -> int | None:
    """The held-out pairs the final check decodes (None: all): ``--eval-pairs`` as given (0:
    all), else the run's recorded one (a resumed run), else
    :data:`~scratchgpt.training.seq2seq_defaults.DEFAULT_EVAL_PAIRS` (a new run, or one from
    before runs recorded it)."""
    for n in (given, recorded):
        if n is not None:
            return n or None
    return DEFAULT_EVAL_PAIRS


def plan(spec: DataSpec | None, arch: str | None, train_flags: dict[str, Any],
         model_flags: dict[str, Any], out: str, resume: bool, overwrite: bool,
         label_smoothing: float | None = None, eval_pairs: int | None = None) -> TrainJob:
    """A checked seq2seq job (see :func:`scratchgpt.training.job.plan`). ``arch``,
    ``label_smoothing`` and ``eval_pairs`` (the held-out pairs the final check decodes, 0 for
    all: ``--eval-pairs``) None: a new run's defaults (transformer, 0, ``DEFAULT_EVAL_PAIRS``),
    a resumed run's own."""
    if resume and overwrite:
        raise ConfigError("--resume continues the run in --out and --overwrite replaces it; "
                          "give one of them")
    if resume:
        flags = {**train_flags, **model_flags, **({"arch": arch} if arch else {})}
        return _resumed(out, flags, label_smoothing, eval_pairs)
    spec = spec or DataSpec()
    arch = arch or "transformer"
    label_smoothing = label_smoothing or 0.0
    # Bad flags fail at once, not after the pairs are made and encoded (seconds for dates):
    # the model's flags are checked on stand-in vocabularies, then on the real ones.
    cfg = train_config(train_flags)
    check_arch_takes(arch, model_flags)
    default_config(arch, UNK_ID + 1, UNK_ID + 1, **model_flags)  # the special ids alone
    check_pairs_fit(spec)
    mode = "overwrite" if overwrite else "new"
    RunDir(out).check_can_begin(mode)  # (before the pairs are made, as a language model's)
    eval_pairs = eval_pairs_of(eval_pairs)
    task = Seq2SeqTask.from_spec(spec, None, label_smoothing, eval_pairs)
    config = task.model_config(arch, **model_flags)
    check_positions(task, config)
    cfg = fitted(cfg, task, config)
    if note := spec.header_note():  # (once nothing is left to refuse, as fitted's note)
        print(note, file=sys.stderr)
    make = partial(seq2seq_task, asdict(spec), None, label_smoothing, eval_pairs)
    return TrainJob(Path(out), mode, cfg, config, PlannedTask(make, task), {"arch": arch})


def check_arch_takes(arch: str, flags: dict[str, Any]) -> None:
    """A model flag that only another architecture uses is refused: it would change nothing,
    yet a new run's config.json would record it."""
    unused = unused_settings(arch, flags)
    if unused:  # (a switch turned off is named as it was given: --no-bidirectional)
        raise ConfigError(f"--arch {arch} does not take " + ", ".join(
            flag_of(k).replace("--", "--no-", 1) if flags[k] is False else flag_of(k)
            for k in unused))


# Memory a generated pair takes once made and encoded (measured: ~0.8 KiB for reverse's
# strings of 10-60 letters, ~0.95 KiB for dates), rounded up.
PAIR_BYTES = 1024


def check_positions(task: Seq2SeqTask, config: Seq2SeqConfig) -> None:
    """A transformer's position table covers every source (with its ``<eos>``) and target
    (with its ``<bos>``) of the pairs: a longer one failed at the first step, in a message
    that named neither --max-positions nor where the long sequence was."""
    if config.arch != "transformer":
        return
    longest = max(longest_pair(task))
    if longest > config.max_positions:
        raise ConfigError(f"--max-positions {config.max_positions} is shorter than the "
                          f"longest source or target of the pairs, {longest} tokens with its "
                          f"<eos> or <bos>; give --max-positions {longest} or more")


def check_pairs_fit(spec: DataSpec) -> None:
    """A generated task's pairs (``n_train + n_test`` of them) fit in memory; checked before
    any is made (a TSV file's pairs are as many as its lines)."""
    if spec.task is None:
        return
    n = spec.n_train + spec.n_test
    memory.check_fits(memory.Estimate({"pairs": n * PAIR_BYTES}), f"generating {n:,} pairs")


def _resumed(out: str, flags: dict[str, Any], label_smoothing: float | None,
             eval_pairs: int | None) -> TrainJob:
    """The run in ``out`` continued with its own model, pairs and label smoothing; ``flags``
    may change what a resumed run may change (see :func:`resumed_run`), and ``eval_pairs``
    the held-out pairs its final check decodes (the run's own without it)."""
    checkpoint = RunDir(out).load_last()
    check_resumed_by(checkpoint, "seq2seq")
    check_arch_takes(checkpoint.model_config.arch, flags)
    config, cfg = resumed_run(checkpoint, Settings(flags=flags))
    check_ends(cfg)
    saved = checkpoint.data.get("label_smoothing")  # None: a run that did not record it
    if saved is not None and label_smoothing not in (None, saved):
        raise ConfigError(f"a resumed run keeps its label smoothing: this run has "
                          f"--label-smoothing {saved} (drop --label-smoothing, or start a new "
                          "run)")
    smoothing = saved if saved is not None else label_smoothing or 0.0
    eval_pairs = eval_pairs_of(eval_pairs, checkpoint.data.get("eval_pairs"))
    make = PlannedTask(partial(seq2seq_task, checkpoint.data["seq2seq"], checkpoint.tokenizers,
                               smoothing, eval_pairs))
    cfg = fitted(cfg, make(), config)  # (a new --batch-size is checked as a new run's)
    return TrainJob(Path(out), "resume", cfg, config, make, {}, checkpoint)


def fitted(cfg: TrainConfig, task: Seq2SeqTask, config: Seq2SeqConfig) -> TrainConfig:
    """``cfg`` with a batch of at most every training pair (:func:`whole_set`), checked to fit
    in memory (:func:`check_memory`); the note of a smaller batch is printed once nothing is
    left to refuse, so that a refusal stays one line."""
    cfg, note = whole_set(cfg, task)
    check_memory(task, config, cfg)
    if note:
        print(note, file=sys.stderr)
    return cfg


def whole_set(cfg: TrainConfig, task: Seq2SeqTask) -> tuple[TrainConfig, str]:
    """(``cfg`` with a batch of at most every training pair, as the batches are drawn: an
    epoch's one batch is all of them; a note saying so where ``--batch-size`` asks for more,
    else ''). A batch of 10^8 pairs was refused as needing some 790,000 GiB, where ``bench
    seq2seq`` trained on the same settings."""
    n = len(task.examples)
    if cfg.batch_size <= n:
        return cfg, ""
    return replace(cfg, batch_size=n), (f"note: --batch-size {cfg.batch_size:,} is more than "
                                        f"the {plural(n, 'training pair', grouped=True)}; each "
                                        f"batch is {'all of them' if n > 1 else 'that one'}")


# ---------------------------------------------------------------------------------------------
# Memory: the pairs' own lengths, not the position table's
# ---------------------------------------------------------------------------------------------

# Floats per attention weight (one token attending to one other, per head) that a training
# step keeps for the backward pass, in every attention of every layer (the probabilities and
# the mask: measured 1.4 on a CPU), and more with attention dropout (its mask and output);
# and those the largest attention holds on top while it is worked out, scores masked and
# exponentiated (measured 1.75 training, 2.25 decoding).
ATTENTION_KEPT = 1.5
ATTENTION_DROPPED = 1.25
ATTENTION_PEAK = 2.5


def attention_floats(c: Seq2SeqConfig, source: int, target: int, training: bool) -> int:
    """Floats the attention of one pair of ``source`` and ``target`` tokens takes: in a
    training step, or in a decode step ``target`` tokens long. A transformer writes out each
    attention's weights (``source**2`` in the encoder, ``target**2`` and ``target x source``
    in each decoder layer), so a pair of thousands of characters takes gigabytes; the additive
    attention of ``lstm-attention`` keeps ``source x width`` for each output token."""
    if c.arch == "lstm-attention":
        return (target if training else 2) * source * (c.d_model + 2)
    if c.arch != "transformer":
        return 0
    sizes = (source * source, target * target, target * source)
    if training:
        kept = ATTENTION_KEPT + (ATTENTION_DROPPED if c.dropout > 0 else 0.0)
        floats = c.n_layer * kept * sum(sizes) + ATTENTION_PEAK * max(sizes)
    else:  # (a decode step returns every layer's cross-attention)
        floats = ATTENTION_PEAK * max(sizes) + c.n_layer * target * source
    return int(c.n_head * floats)


def longest_pair(task: Seq2SeqTask) -> tuple[int, int]:
    """(longest source with its ``<eos>``, longest target with its ``<bos>``), in tokens, of
    the training and held-out pairs."""
    pairs = (*task.examples, *task.held_examples)
    return max(len(x) for x, _ in pairs), max(len(y) for _, y in pairs) + 1


def training_memory(c: Seq2SeqConfig, fixed: dict[str, int], rows: int, source: int,
                    target: int) -> memory.Estimate:
    """Bytes a training step on ``rows`` pairs padded to ``source`` and ``target`` tokens
    takes: ``fixed`` (weights, gradients, optimizer state), the layers' activations and
    logits, and the attention."""
    per_row = ((source + target) * c.n_layer * memory.ACTIVATION_FLOATS * c.d_model
               + 3 * target * c.tgt_vocab)
    return memory.Estimate({**fixed, "activations": memory.FP32 * rows * per_row,
                            "attention": memory.FP32 * rows
                            * attention_floats(c, source, target, training=True)})


def check_memory(task: Seq2SeqTask, config: Seq2SeqConfig, cfg: TrainConfig) -> None:
    """The device exists and computes ``--dtype``, and training and the final evaluation fit
    in its memory, counted from the longest pair (each batch is padded to its longest) rather
    than from ``--max-positions``: following the advice 'give --max-positions 20001' for a pair
    of 20,000 characters ended in a failed allocation of some 77 GB, as its attention had not
    been counted. Checked before any file is touched."""
    device = resolve_device(cfg.device)
    resolve_dtype(cfg.dtype, device)
    free = memory.available_bytes(device)
    parts = memory.training_estimate(config, 1, cfg.optimizer).parts
    fixed = {k: v for k, v in parts.items() if k != "activations"}
    rows = min(cfg.batch_size, max(len(task.examples), len(task.held_examples)))
    source, target = longest_pair(task)
    estimate = training_memory(config, fixed, rows, source, target)
    if estimate.total > free:
        memory.check_fits(estimate, f"training on these pairs, {rows:,} to a batch,", device,
                          available=free, remedy=_training_remedy(config, fixed, estimate,
                                                                  rows, (source, target), free))
    _check_final_eval_fits(task, config, rows, fixed["weights"], device, free)


def _training_remedy(c: Seq2SeqConfig, fixed: dict[str, int], estimate: memory.Estimate,
                     rows: int, longest: tuple[int, int], free: int) -> str:
    """What to do when training does not fit: the largest --batch-size that does, or, where
    one pair alone does not, how long a pair may be."""
    source, target = longest
    shape = (f"the longest source has {source - 1:,} characters and the longest target "
             f"{target - 1:,} (attention grows with the square of the length)")
    per_row = (estimate.total - sum(fixed.values())) / rows
    fits = int((free - sum(fixed.values())) // per_row)
    if fits >= 1:
        return (f"{shape}, and every pair of a batch is padded to its longest: give "
                f"--batch-size {fits} or less, or drop the longest pairs")
    lo, hi = 0, max(source, target)  # the longest length that fits: lo fits, hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        fits_mid = training_memory(c, fixed, 1, min(source, mid), min(target, mid)).total <= free
        lo, hi = (mid, hi) if fits_mid else (lo, mid)
    return f"{shape}, and one such pair alone does not fit: drop the pairs longer than " \
           f"about {max(lo - 1, 1):,} characters"


def _check_final_eval_fits(task: Seq2SeqTask, c: Seq2SeqConfig, batch: int, weights: int,
                           device: torch.device, free: int) -> None:
    """The final evaluation's greedy decodes of the held-out pairs, ``batch`` at a time (as
    :meth:`Seq2SeqTask.final_metrics` runs them), fit in memory: checked before training
    rather than failing after it."""
    held = task.final_pairs()[1]
    rows = min(batch, len(held))
    if not rows:
        return
    source = max(len(x) for x, _ in held)
    max_len = eval_max_len(c, max(len(y) for _, y in held))
    estimate = memory.Estimate({"weights": weights,
                                **decode_estimate(c, rows, source, max_len).parts})
    memory.check_fits(estimate, f"decoding the held-out pairs for the final evaluation, "
                      f"{rows:,} at a time,", device, available=free,
                      remedy=f"their longest source has {source - 1:,} characters and an "
                      f"output may run to {max_len:,} tokens: give a smaller --batch-size, or "
                      "drop the longest pairs")
