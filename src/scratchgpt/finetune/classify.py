"""Text classification on the training core: labelled texts -> a GPT with an N-class head.

:class:`ClassifyTask` trains ``gpt-classifier`` models (``models/classifier.py``): epochs of
length-batched, right-padded texts (``training/epochs.py``), cross-entropy on the head's
logits, optionally weighted by class (``balanced``: ``n / (classes * n_c)``, so a rare class
weighs as much in total as a common one). Each evaluation (one per epoch by default) adds the
validation accuracy (``val_acc``), the macro-averaged F1 (``val_f1``: the mean of the classes'
F1, which a model that ignores a rare class cannot hide) and each class's precision, recall and
F1 (``val_precision:spam``, ...) to ``metrics.csv``; the progress line shows the accuracy, the
macro F1 and, for up to four classes, each class's F1.

:func:`evaluate` scores a model on a split: accuracy, per-class precision, recall and F1, and
the confusion matrix (:class:`ClassReport`, printed by :func:`format_report`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import InitVar, asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from scratchgpt.errors import CheckpointError, ConfigError, DataError
from scratchgpt.finetune.data import (
    Log,
    check_labels_are_spelt_one_way,
    check_unchanged,
    encode_plain,
    lacking_characters,
    read_labelled,
    shown_characters,
    split_digest,
    stratified_split,
)
from scratchgpt.training.epochs import EpochBatches
from scratchgpt.training.task import Batch, EvalSetting, _eval_mode
from scratchgpt.validation import KEYWORDS, named
from scratchgpt.wording import plural, some_of

SPLITS = ("train", "val", "test")
CLASS_WEIGHTS = ("none", "balanced")
Example = tuple[list[int], int]  # (token ids, class index)


@dataclass
class ClassifySpec:
    """Where a classification run's data comes from and how it is split and encoded; saved
    with the run (``data["classify"]``), so a resumed run and ``classify --eval`` rebuild it."""

    data: str | None = None
    dataset: str | None = None
    sha256: str = ""  # of the data file, filled in when read; a resumed run checks it
    split_seed: int = 0
    fractions: list[float] = field(default_factory=lambda: [0.7, 0.1, 0.2])  # train/val/test
    class_weights: str = "none"
    max_length: int = 0  # tokens per text (0: the model's context); longer ones are truncated
    labels: list[str] = field(default_factory=list)  # class names in index order
    # how a refusal names a setting: the Python API's keywords, or finetune's flags (FLAGS);
    # not a field, so neither saved with the run nor compared
    options: InitVar[Mapping[str, str]] = KEYWORDS

    def __post_init__(self, options: Mapping[str, str]) -> None:
        if self.class_weights not in CLASS_WEIGHTS:
            raise ConfigError(f"{named(options, 'class_weights')} must be one of "
                              f"{', '.join(CLASS_WEIGHTS)}, got {self.class_weights!r}")
        if len(self.fractions) != 3 or any(f < 0 for f in self.fractions) or \
                not 0 < self.fractions[0] < 1 or abs(sum(self.fractions) - 1) > 1e-6:
            raise ConfigError(f"split fractions must be 3 numbers summing to 1 with train in "
                              f"(0, 1), got {self.fractions}")
        if self.max_length < 0:
            raise ConfigError(f"{named(options, 'max_length')} must be >= 0, got "
                              f"{self.max_length}")


@dataclass
class ClassifyData:
    """Encoded examples of each split, and what encoding them took."""

    labels: list[str]
    splits: dict[str, list[Example]]
    record: dict[str, Any]  # what the run records about the data (data["classify"])
    truncated: int = 0
    replaced: int = 0


def encode_texts(tokenizer: Any, texts: Sequence[str],
                 max_length: int) -> tuple[list[list[int]], int, int]:
    """(ids per text cut to its first ``max_length`` tokens, how many were cut, how many had
    characters the vocabulary lacks replaced)."""
    out, truncated, replaced = [], 0, 0
    for text in texts:
        ids, rep = encode_plain(tokenizer, text)
        replaced += rep
        if len(ids) > max_length:
            ids, truncated = ids[:max_length], truncated + 1
        out.append(ids or [0])
    return out, truncated, replaced


def text_length(max_length: int, block_size: int) -> int:
    """Tokens a text keeps: ``max_length`` (0: the model's context), never more than the
    context. Training, the run's test report and ``scratchgpt classify`` all cut texts to it
    (the run records it as ``data["classify"]["max_length"]``)."""
    return min(max_length or block_size, block_size)


TAB = "\t"


def check_labels_come_last(pairs: Sequence[tuple[str, str]], where: str,
                           known: Sequence[str] = ()) -> None:
    """Refuse labelled data that looks written label first: labels (those not among a model's
    ``known`` ones) nearly one a text, or, scored against a model, texts that are all labels it
    knows (in any case: ``POS`` for ``pos``) while the labels are not. The message says so
    first, then why, then what to do."""
    labels = {label for _, label in pairs}
    unknown = labels - set(known)
    if not unknown:
        return
    if len(unknown) > max(2, len(pairs) // 2):
        raise DataError(label_first(where, f"{len(labels):,} labels among {len(pairs):,} "
                                           "texts, nearly one a text"))
    folded = {k.casefold() for k in known}
    if known and all(text.strip().casefold() in folded for text, _ in pairs):
        raise DataError(label_first(where, f"its texts are the model's labels "
                                           f"({', '.join(known)}) and its labels are not"))


def label_first(where: str, why: str) -> str:
    """The refusal of ``where``, a file that looks written label first, for reason ``why``:
    the columns swapped, why they look so, how the file is read and what to do (no flag reads
    a file label first: the named dataset sms-spam alone is read so)."""
    csv_file = where.lower().endswith(".csv")
    first, last, rows = ("label,text", "text,label", "rows") if csv_file else (
        "label<TAB>text", "text<TAB>label", "lines")
    return (f"{where}: its label and text columns look swapped ({why}: are its {rows} "
            f"{first}?); a {'CSV' if csv_file else 'TSV'}'s {rows} are read as {last}, the "
            "label last: swap its two columns")


def check_no_label_stands_alone(pairs: Sequence[tuple[str, str]], where: str) -> None:
    """Refuse a label only one text has: the split keeps it in training alone, so it is never
    validated nor tested, and a header the reader does not know (``review<TAB>sentiment``) is
    such a text, its names a class of their own."""
    counts = Counter(label for _, label in pairs)
    alone = next((i for i, (_, label) in enumerate(pairs) if counts[label] == 1), None)
    if alone is None:
        return
    text, label = pairs[alone]
    shown = text if len(text) <= 40 else text[:40] + "…"
    header = (" Is the first row a header? Only text<TAB>label (text,label in a CSV) is read "
              "as one" if alone == 0 else " Give it more texts, or leave it out")
    if alone == 0 and "\t" in text:  # 'id<TAB>text<TAB>label': the text would hold the ids
        header += (f", and a text is all {text.count(TAB) + 1} columns before the label: keep "
                   "only the text and label columns")
    raise DataError(f"{where}: the label {label!r} has one text ({shown!r}), which no "
                    f"validation or test split can hold.{header}")


def columns_warning(pairs: Sequence[tuple[str, str]], where: str) -> str:
    """A warning when every text holds as many tabs, one or more: the file has more columns
    than text<TAB>label (an id first, 'id<TAB>text<TAB>label'), and all but the last were
    read as the text, tabs and all, so a model learns from the ids; or ''. (Not refused: a
    text may hold a tab.)"""
    tabs = {text.count(TAB) for text, _ in pairs}
    if len(pairs) < 2 or len(tabs) != 1 or 0 in tabs:
        return ""
    columns = tabs.pop() + 2
    return (f"warning: every line of {where} has {columns} tab-separated columns; the label is "
            f"the last and the text the {columns - 1} before it, tabs and all (an id column "
            "is read as words of the text); if some are not the text, keep text<TAB>label")


def load_data(spec: ClassifySpec, tokenizer: Any, block_size: int, log: Log = None
              ) -> ClassifyData:
    """Read, check, split (seeded, stratified) and encode ``spec``'s data. A resumed run's
    data must be the same file (sha256) with the same labels."""
    pairs, where, sha = read_labelled(spec.data, spec.dataset)
    check_unchanged(where, sha, spec.sha256)
    check_labels_come_last(pairs, where)
    check_labels_are_spelt_one_way(pairs, where)
    check_no_label_stands_alone(pairs, where)
    if log and (columns := columns_warning(pairs, where)):
        log(columns)
    labels = sorted({label for _, label in pairs})
    if spec.labels and labels != spec.labels:
        raise DataError(f"{where} has labels {labels}, the run has {spec.labels}")
    max_length = text_length(spec.max_length, block_size)
    ids, truncated, replaced = encode_texts(tokenizer, [t for t, _ in pairs], max_length)
    index = {label: i for i, label in enumerate(labels)}
    parts = stratified_split([label for _, label in pairs], spec.fractions, spec.split_seed)
    splits = {name: [(ids[i], index[pairs[i][1]]) for i in part]
              for name, part in zip(SPLITS, parts, strict=True)}
    _check_no_split_is_empty(splits, spec.fractions, where)
    record = {**asdict(spec), "sha256": sha, "labels": labels, "max_length": max_length,
              "source": where, "split_sizes": {k: len(v) for k, v in splits.items()},
              "split_digest": split_digest(parts)}
    lacking = lacking_characters(tokenizer, (t for t, _ in pairs)) if replaced else []
    _notify(log, truncated, (replaced, lacking), len(pairs), max_length)
    return ClassifyData(labels, splits, record, truncated, replaced)


def _check_no_split_is_empty(splits: dict[str, list[Example]], fractions: list[float],
                             where: str) -> None:
    """Every split holds a text: an empty validation split would score as a loss of 0 (and
    choose best.pt by it), an empty test split leave nothing to report."""
    empty = [name for name in SPLITS if not splits[name]]
    if empty:
        sizes = " / ".join(f"{name} {len(splits[name])}" for name in SPLITS)
        shares = "/".join(f"{f:.0%}" for f in fractions)
        raise DataError(f"{where}: too few texts to split ({sizes}): the {' and '.join(empty)} "
                        f"split would be empty; each split takes its share ({shares}) of every "
                        "label's texts, so give more of them")


def _notify(log: Log, truncated: int, replaced: tuple[int, list[str]], n: int,
            max_length: int) -> None:
    if log is None:
        return
    if truncated:
        log(f"warning: {some_of(truncated, n, 'text')} longer than {max_length} tokens; "
            f"{'it' if truncated == 1 else 'each'} is truncated to its first {max_length} "
            "tokens")
    if replaced[0]:
        log(replaced_warning(replaced[0], n, "text", replaced[1]))


def replaced_warning(replaced: int, n: int, what: str, lacking: Sequence[str]) -> str:
    """The warning that ``replaced`` of ``n`` texts (``what``: "text", or "conversation") had
    characters the tokenizer lacks, naming them."""
    return (f"warning: {some_of(replaced, n, what, ('has', 'have'))} characters the "
            f"tokenizer lacks ({shown_characters(lacking)}); "
            f"{'it is' if replaced == 1 else 'they are'} replaced")


def collate(examples: Sequence[Example], pad_id: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """-> ids (B, T) right-padded, lengths (B,), labels (B,)."""
    T = max(len(ids) for ids, _ in examples)
    x = torch.full((len(examples), T), pad_id, dtype=torch.long)  # (B, T)
    for i, (ids, _) in enumerate(examples):
        x[i, :len(ids)] = torch.tensor(ids)
    lengths = torch.tensor([len(ids) for ids, _ in examples])  # (B,)
    labels = torch.tensor([label for _, label in examples])  # (B,)
    return x, lengths, labels


def class_weights(examples: Sequence[Example], n_classes: int, mode: str) -> Tensor | None:
    """``balanced``: n / (classes * n_c) per class (from the training split); ``none``: None."""
    if mode == "none":
        return None
    counts = torch.bincount(torch.tensor([y for _, y in examples]), minlength=n_classes)
    return len(examples) / (n_classes * counts.clamp_min(1).float())


PER_CLASS = ("precision", "recall", "f1")  # ClassReport's figures of one class, by name


class ClassifyTask:
    """Classification for the training core (see the module docstring)."""

    def __init__(self, data: ClassifyData, tokenizer: Any, class_weighting: str = "none",
                 extra_data: dict[str, Any] | None = None):
        self.examples, self.tokenizer = data, tokenizer
        # metrics.csv gets every class's figures at each evaluation; the progress line only
        # the summary (and the classes' F1 while there are few of them).
        per_class = [f"val_{m}:{name}" for name in data.labels for m in PER_CLASS]
        self.eval_fields = ("val_acc", "val_f1", *per_class)
        self.eval_shown = ("val_acc", "val_f1", *(
            [f"val_f1:{name}" for name in data.labels] if len(data.labels) <= 4 else []))
        self.train_examples = data.splits["train"]
        self.weight = class_weights(self.train_examples, len(data.labels), class_weighting)
        self.epochs = EpochBatches([len(ids) for ids, _ in self.train_examples])
        self.extra_data = extra_data or {}
        self._val_report: ClassReport | None = None

    def train_batch(self, batch_size: int, generator: torch.Generator,
                    shard: tuple[int, int] = (0, 1)) -> Batch:
        idx = self.epochs.next(batch_size, generator, shard)
        return collate([self.train_examples[i] for i in idx])

    def warm_up_batch(self, batch_size: int, seq_len: int | None = None) -> Batch:
        """A batch of the training batches' shape that draws from no generator and moves no
        epoch: the first ``batch_size`` training texts (the trainer's untimed warm-up step;
        ``seq_len`` is a language model's: this task refuses a sequence-length warmup)."""
        return collate(self.train_examples[:batch_size])

    def loss(self, model: nn.Module, batch: Batch) -> Tensor:
        x, lengths, labels = batch
        logits = model(x, lengths)  # (B, n_classes)
        weight = None if self.weight is None else self.weight.to(logits.device)
        return F.cross_entropy(logits.float(), labels, weight=weight)

    def batch_tokens(self, batch: Batch) -> int:
        return int(batch[1].sum())

    @torch.no_grad()
    def estimate(self, model: nn.Module, split: str, iters: int, setting: EvalSetting,
                 progress: str | None = None) -> float:
        """Mean (unweighted) loss over the first ``iters`` batches of a split; the validation
        split's :class:`ClassReport` is kept for :meth:`eval_extras`. ``progress``: the name
        of a bar on stderr, by texts, shown once the pass has run for a second."""
        examples = self.examples.splits[split][:iters * setting.batch_size]
        loss, true, pred = _loss_and_predictions(model, examples, setting, progress)
        if split == "val" and examples:
            self._val_report = ClassReport.of(self.examples.labels, true, pred)
        return loss

    def eval_extras(self) -> dict[str, float]:
        """Accuracy, macro F1 and each class's precision, recall and F1 of the latest
        validation estimate (named as in ``eval_fields``)."""
        rep = self._val_report
        if rep is None:
            return dict.fromkeys(self.eval_fields, float("nan"))
        figures = {"val_acc": rep.accuracy, "val_f1": rep.macro_f1}
        for c, name in enumerate(rep.labels):
            figures.update({f"val_{m}:{name}": getattr(rep, m)(c) for m in PER_CLASS})
        return figures

    def final_metrics(self, model: nn.Module, iters: int,
                      setting: EvalSetting) -> dict[str, float]:
        """Train estimate; loss, accuracy and macro F1 over the whole validation split (with
        ``setting.progress``, a bar once that pass has run for a second)."""
        n_val = len(self.examples.splits["val"])
        val_iters = -(-n_val // setting.batch_size)
        return {"train_loss": self.estimate(model, "train", iters, setting),
                "val_loss": self.estimate(model, "val", val_iters, setting,
                                          "val split" if setting.progress else None),
                **self.eval_extras()}

    def final_scope(self) -> str:
        """What the final evaluation goes through, said before it by a run its budget ended:
        the validation split :meth:`final_metrics` reads whole, then the test split that the
        run's end scores with ``best.pt``."""
        val, test = (len(self.examples.splits[name]) for name in ("val", "test"))
        return (f"the {plural(val, 'validation text', grouped=True)}, then best.pt on the "
                f"{plural(test, 'test text', grouped=True)}")

    def report(self) -> str:
        return ""

    def tokenizers(self) -> dict[str, Any]:
        return {"text": self.tokenizer}

    def data(self) -> dict[str, Any]:
        return {"task": "classify", "classify": self.examples.record, **self.extra_data}

    def state_dict(self) -> dict[str, Any]:
        return self.epochs.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epochs.load_state_dict(state)


def _batches(examples: Sequence[Example], batch_size: int) -> list[list[int]]:
    """Index batches of similar lengths (less padding), in a fixed order."""
    order = sorted(range(len(examples)), key=lambda i: len(examples[i][0]))
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def _loss_and_predictions(model: nn.Module, examples: Sequence[Example], setting: EvalSetting,
                          progress: str | None = None) -> tuple[float, list[int], list[int]]:
    """(mean unweighted loss, true classes, predicted classes) of ``examples``; ``progress``:
    as :meth:`ClassifyTask.estimate`'s."""
    from scratchgpt.bars import named_bar  # (not for training's imports)

    total, true, pred = 0.0, [], []
    with _eval_mode(model), named_bar(len(examples), progress, "text") as bar:
        for idx in _batches(examples, setting.batch_size):
            x, lengths, labels = (t.to(setting.device) for t in collate([examples[i]
                                                                         for i in idx]))
            logits = model(x, lengths).float()  # (B, n_classes)
            total += F.cross_entropy(logits, labels, reduction="sum").item()
            true += labels.tolist()
            pred += logits.argmax(-1).tolist()
            bar.update(len(idx))
    return total / max(len(examples), 1), true, pred


@torch.no_grad()
def predict(model: nn.Module, ids: Sequence[list[int]], batch_size: int = 64) -> Tensor:
    """Class probabilities (N, n_classes) of token-id sequences, in their order."""
    device = next(model.parameters()).device
    examples = [(x, 0) for x in ids]
    probs = torch.empty(len(examples), model.config.n_classes)
    with _eval_mode(model):
        for idx in _batches(examples, batch_size):
            x, lengths, _ = (t.to(device) for t in collate([examples[i] for i in idx]))
            probs[idx] = torch.softmax(model(x, lengths).float(), -1).cpu()
    return probs


# ---- evaluation


@dataclass
class ClassReport:
    """How a classifier did on a set: ``confusion[t][p]`` counts texts of class ``t``
    predicted as ``p``."""

    labels: list[str]
    confusion: list[list[int]]

    @classmethod
    def of(cls, labels: Sequence[str], true: Sequence[int], pred: Sequence[int]) -> ClassReport:
        m = [[0] * len(labels) for _ in labels]
        for t, p in zip(true, pred, strict=True):
            m[t][p] += 1
        return cls(list(labels), m)

    @property
    def total(self) -> int:
        return sum(map(sum, self.confusion))

    @property
    def accuracy(self) -> float:
        return sum(self.confusion[i][i] for i in range(len(self.labels))) / max(self.total, 1)

    def precision(self, c: int) -> float:
        predicted = sum(row[c] for row in self.confusion)
        return self.confusion[c][c] / predicted if predicted else 0.0

    def recall(self, c: int) -> float:
        actual = sum(self.confusion[c])
        return self.confusion[c][c] / actual if actual else 0.0

    def f1(self, c: int) -> float:
        p, r = self.precision(c), self.recall(c)
        return 2 * p * r / (p + r) if p + r else 0.0

    @property
    def macro_f1(self) -> float:
        """The unweighted mean of the F1 of the classes the set has or the model predicted
        (scikit-learn's ``average="macro"``): a class that is neither has no F1 to count (0/0),
        where a 0 would halve the score of a two-class model that labelled a set of one class
        without a mistake."""
        seen = [c for c in range(len(self.labels))
                if sum(self.confusion[c]) or sum(row[c] for row in self.confusion)]
        return sum(self.f1(c) for c in seen) / max(len(seen), 1)

    def to_dict(self) -> dict[str, Any]:
        return {"accuracy": self.accuracy, "macro_f1": self.macro_f1, "total": self.total,
                "labels": self.labels, "confusion": self.confusion,
                "per_class": {name: {"precision": self.precision(c), "recall": self.recall(c),
                                     "f1": self.f1(c), "support": sum(self.confusion[c])}
                              for c, name in enumerate(self.labels)}}


def evaluate(model: nn.Module, examples: Sequence[Example], labels: Sequence[str],
             batch_size: int = 64) -> ClassReport:
    """The model's :class:`ClassReport` on labelled examples."""
    if not examples:
        raise DataError("no examples to evaluate on")
    if model.config.n_classes != len(labels):
        raise CheckpointError(f"the model has {model.config.n_classes} classes, the data "
                              f"{len(labels)}")
    probs = predict(model, [x for x, _ in examples], batch_size)
    return ClassReport.of(labels, [y for _, y in examples], probs.argmax(-1).tolist())


def format_report(rep: ClassReport, title: str) -> str:
    """Accuracy, per-class precision / recall / F1, and the confusion matrix, as text."""
    correct = round(rep.accuracy * rep.total)
    width = max(8, *(len(name) for name in rep.labels))
    lines = [f"{title}: accuracy {rep.accuracy:.2%} ({correct}/{rep.total}), macro F1 "
             f"{rep.macro_f1:.4f}",
             f"  {'class':<{width}}  precision  recall     f1  support"]
    for c, name in enumerate(rep.labels):
        lines.append(f"  {name:<{width}}  {rep.precision(c):9.4f}  {rep.recall(c):6.4f}  "
                     f"{rep.f1(c):.4f}  {sum(rep.confusion[c]):7d}")
    lines.append("  confusion matrix (rows: true class, columns: predicted)")
    lines.append("  " + " " * width + "".join(f"  {name:>{width}}" for name in rep.labels))
    for name, row in zip(rep.labels, rep.confusion, strict=True):
        lines.append(f"  {name:<{width}}" + "".join(f"  {n:>{width}d}" for n in row))
    return "\n".join(lines)
