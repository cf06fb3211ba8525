"""``scratchgpt classify``: label texts with a fine-tuned classifier (or score it on a labelled
file)."""

from __future__ import annotations

import argparse
import json
import sys

from scratchgpt.commands.argtypes import add_which_flag, figure_file
from scratchgpt.errors import ConfigError, DataError
from scratchgpt.wording import a_kind, some_of


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "classify", help="label texts with a classifier made by 'finetune --task classify'",
        description="Print the most likely label of each text and its probability. Texts come "
                    "as arguments, or one per line of --file; --eval FILE scores the model on "
                    "a labelled TSV/CSV (text<TAB>label) instead: accuracy, per-class "
                    "precision/recall/F1 and the confusion matrix. Texts are cut to the length the "
                    "run trained with (its --max-length, else the model's context), as in "
                    "the run's own test report; a warning counts the texts cut.")
    p.add_argument("texts", nargs="*", help="texts to classify")
    p.add_argument("--checkpoint", required=True,
                   help="a classification run directory, .pt file or adapter.pt")
    add_which_flag(p)
    p.add_argument("--file", default=None,
                   help="classify every non-empty line of this file, or of standard input "
                        "with -; UTF-8 text (other bytes are refused, naming the first)")
    p.add_argument("--eval", default=None, metavar="LABELLED_FILE",
                   help="score the model on a labelled TSV (text<TAB>label) or CSV file, or "
                        "on TSV lines of standard input with -; UTF-8 text")
    p.add_argument("--confusion", default=None, metavar="PNG",
                   help="with --eval: also draw the confusion matrix into this file (.png, "
                        ".svg, .pdf ...)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the --confusion file if it exists")
    p.add_argument("--json", action="store_true", help="print results as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from scratchgpt.checkpoints import load_model
    from scratchgpt.models.classifier import GPTClassifier
    from scratchgpt.validation import FLAGS

    if args.file == "-" and args.eval == "-":
        raise ConfigError("--file - and --eval - would both read standard input; give one of "
                          "them")
    if sum(map(bool, (args.texts, args.file, args.eval))) != 1:
        raise ConfigError("give texts, --file FILE or --eval FILE (one of them)")
    if args.confusion and not args.eval:
        raise ConfigError("--confusion goes with --eval")
    figure_file(args.confusion, args.overwrite, "--confusion")  # before the model is loaded
    empty = next((i for i, t in enumerate(args.texts, 1) if not t.strip()), None)
    if empty is not None:  # nothing to read: the model would label a stand-in token
        raise ConfigError(f"text {empty} is empty; give each text some words")
    model, source = load_model(args.checkpoint, args.which, FLAGS)
    if not isinstance(model, GPTClassifier):
        raise ConfigError(f"{args.checkpoint} holds {a_kind(source.model_type)} model, not a "
                          "classifier (make one with scratchgpt finetune --task classify)")
    record = source.checkpoint.data["classify"]
    labels = record["labels"]
    if args.eval:
        return evaluate_file(model, source.tokenizer(), record, args)
    texts = args.texts or read_lines(args.file)
    if args.file:
        note_labelled_file(texts, labels, args.file)
    probs = probabilities(model, source.tokenizer(), texts, record)
    rows = [{"text": t, "label": labels[int(p.argmax())], "probability": float(p.max()),
             "probabilities": dict(zip(labels, map(float, p), strict=True))}
            for t, p in zip(texts, probs, strict=True)]
    if args.json:
        print(json.dumps(rows, ensure_ascii=False, indent=1))
    elif len(rows) == 1 and not args.file:  # (a file's lines keep their column of text,
        print(f"{rows[0]['label']}\t{rows[0]['probability']:.4f}")  # one line or many)
    else:
        for r in rows:
            print(f"{r['label']}\t{r['probability']:.4f}\t{r['text']}")
    return 0


def read_lines(path: str) -> list[str]:
    """The non-empty lines of ``--file``, read as finetune reads its data (UTF-8, a BOM
    dropped, bytes that are not UTF-8 refused in one line, as are a missing file or a
    directory), or of standard input (``-``, read the same way)."""
    from scratchgpt.data.sources import text_lines
    from scratchgpt.finetune.data import read_source

    text, where, _ = read_source(path, None, stdin=True)
    lines = [line for line in text_lines(text) if line.strip()]
    if not lines:
        raise DataError(f"{where} has no non-empty line")
    return lines


def note_labelled_file(lines: list[str], labels: list[str], path: str) -> None:
    """A note on stderr when every line of ``--file`` ends in a tab and one of the model's
    labels: the file is likely labelled, for ``--eval``. (Not refused: a text may hold a
    tab.)"""
    if all("\t" in line and line.rsplit("\t", 1)[1].strip() in labels for line in lines):
        print(f"note: every line of --file {path} ends in a tab and one of the model's labels "
              f"({', '.join(labels)}), and each was classified whole, label and all; to score "
              f"the model on a labelled file, give --eval {path}", file=sys.stderr)


def probabilities(model, tokenizer, texts: list[str], record: dict):
    """(N, classes) probabilities of texts cut as the run (``record``: its
    ``data["classify"]``) cut its own; warns about truncated texts and replaced characters."""
    from scratchgpt.finetune.classify import encode_texts, predict, replaced_warning, text_length
    from scratchgpt.finetune.data import lacking_characters

    block_size = model.config.gpt.block_size
    limit = text_length(record.get("max_length", 0), block_size)
    ids, truncated, replaced = encode_texts(tokenizer, texts, limit)
    if truncated:
        what = "the context" if limit == block_size else "the run's --max-length"
        print(f"warning: {some_of(truncated, len(texts), 'text')} longer than {what} "
              f"({limit} tokens); {'it' if truncated == 1 else 'each'} is truncated to its "
              f"first {limit} tokens", file=sys.stderr)
    if replaced:
        print(replaced_warning(replaced, len(texts), "text",
                               lacking_characters(tokenizer, texts)), file=sys.stderr)
    return predict(model, ids)


def evaluate_file(model, tokenizer, record: dict, args: argparse.Namespace) -> int:
    """``--eval``: the model's report on a labelled file; a label it does not know is an
    error."""
    from scratchgpt.finetune.classify import ClassReport, check_labels_come_last, format_report
    from scratchgpt.finetune.data import check_labels_are_spelt_one_way, read_labelled

    labels = record["labels"]
    pairs, where, sha = read_labelled(args.eval, None, min_labels=1, stdin=True)
    check_labels_come_last(pairs, where, labels)
    check_labels_are_spelt_one_way(pairs, where)
    unknown = sorted({label for _, label in pairs} - set(labels))
    if unknown:
        raise DataError(f"{where}: label {unknown[0]!r} is not one the model knows "
                        f"({', '.join(labels)})"
                        + (f"; {len(unknown) - 1} more unknown" if len(unknown) > 1 else ""))
    probs = probabilities(model, tokenizer, [t for t, _ in pairs], record)
    index = {label: i for i, label in enumerate(labels)}
    rep = ClassReport.of(labels, [index[label] for _, label in pairs],
                         probs.argmax(-1).tolist())
    if args.json:
        print(json.dumps(rep.to_dict(), indent=1))
    else:
        print(format_report(rep, where))
    if sha == record.get("sha256"):
        print(own_data_note(record, where), file=sys.stderr)
    if args.confusion:
        from scratchgpt.viz import plot_confusion

        plot_confusion(rep.confusion, labels, args.confusion, f"{where}: {rep.accuracy:.2%}")
        if not args.json:  # (as eval's --plot and inspect's --out say: stdout may be JSON)
            print(f"wrote {args.confusion}")
    return 0


def own_data_note(record: dict, where: str) -> str:
    """The note that ``--eval`` scored the run's own data (the same bytes): its report, whose
    figures looked like a test's, counts the texts the model trained on, and finetune's
    report of the held-out test split is the one to quote."""
    sizes = record.get("split_sizes", {})
    trained = (f"{sizes['train']:,} of its texts trained the model and {sizes['val']:,} chose "
               "its best.pt" if {"train", "val"} <= sizes.keys() else "most of its texts "
               "trained the model")
    return (f"note: {where} is the data the run was fine-tuned on: {trained}, so the figures "
            "above are not those of unseen text; the run's test_metrics.json scores its "
            "held-out test split alone")
