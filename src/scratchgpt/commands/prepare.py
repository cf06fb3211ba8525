"""``scratchgpt prepare``: text -> tokenizer + memory-mapped token files."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import TYPE_CHECKING

from scratchgpt.commands.argtypes import bpe_vocab_size
from scratchgpt.errors import ConfigError, naming
from scratchgpt.wording import plural

if TYPE_CHECKING:
    from scratchgpt.tokenizers import Tokenizer

# BPE-dropout copies of the training split: enough spellings of each word that a 10-minute run
# on two cores (~17 M tokens of a 1 M-character text) reads each copy about twice.
DEFAULT_TRAIN_COPIES = 16


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "prepare", help="tokenize a text file, folder or named dataset for training",
        description="Read UTF-8 text, learn a tokenizer on the training part (all but the "
                    "last --val-fraction), and write train.bin, val.bin (uint16/uint32 tokens), "
                    "meta.json and tokenizer.json into --out. The dataset is written beside "
                    "--out and renamed into place once complete; an existing dataset is "
                    "replaced only with --overwrite. With no --data or --dataset, the offline "
                    "default corpus is used: the top-level modules of this Python's standard "
                    "library.")
    from scratchgpt.data.sources import DATASET_NAMES

    src = p.add_mutually_exclusive_group()
    src.add_argument("--data", help="a UTF-8 text file, or a folder of .txt files")
    src.add_argument("--dataset", help=f"a named dataset ({', '.join(DATASET_NAMES)}), looked "
                                       "up in $SCRATCHGPT_DATA_DIR first, else fetched; checked "
                                       "against its sha256 where one is pinned")
    p.add_argument("--tokenizer", default="char",
                   help="char, char-prose (letters, digits, space and basic punctuation; "
                        "any other character a space, runs of spaces folded), bpe (trained "
                        "here) or gpt2 "
                        "(default: char)")
    p.add_argument("--tokenizer-from", default=None, metavar="RUN_OR_DATASET",
                   help="use the tokenizer of this model (a run directory, .pt file, Hugging "
                        "Face directory or hf:ID) instead of learning one: the text is then "
                        "ready for 'train --init-from' that model; or of a prepared dataset "
                        "directory, so that a second text shares the first dataset's token ids")
    p.add_argument("--vocab-size", default=None,  # (checked in run, once --tokenizer is known)
                   help="vocabulary size for --tokenizer bpe (default 4096); a small text "
                        "may run out of pairs to merge first, and then gets fewer ids")
    p.add_argument("--bpe-dropout", type=float, default=0.0, metavar="P",
                   help="BPE tokenizers: write the training split as --train-copies "
                        "segmentations sampled by BPE-dropout, each merge skipped with "
                        "probability P (0.1 is usual), so that a model trained for many passes "
                        "over a small text sees each word spelt several ways instead of "
                        "learning one spelling of the text by heart; the validation split stays "
                        "exact (default: 0, off)")
    p.add_argument("--train-copies", type=int, default=None, metavar="K",
                   help=f"with --bpe-dropout: sampled copies of the training split, one after "
                        f"another in train.bin (default: {DEFAULT_TRAIN_COPIES})")
    p.add_argument("--val-fraction", type=float, default=0.1,
                   help="fraction at the end of the text held out for validation (default 0.1)")
    p.add_argument("--out", required=True, help="output directory of the prepared dataset")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a dataset already in --out (the new one is written beside it "
                        "and renamed into place once complete)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bars (on stderr, for BPE training, encoding a long text "
                        "and --bpe-dropout copies, each shown once its step has run for a "
                        "second)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from scratchgpt.data.prepare import check_destination, prepare_text
    from scratchgpt.data.resolve import load_source
    from scratchgpt.tokenizers import BUILD_KINDS
    from scratchgpt.validation import FLAGS, did_you_mean

    if args.tokenizer not in BUILD_KINDS:
        raise ConfigError(f"--tokenizer {args.tokenizer}: choose one of {', '.join(BUILD_KINDS)}"
                          + (_spelt_as_speedrun(args.tokenizer)
                             or did_you_mean(args.tokenizer, BUILD_KINDS)))
    args.vocab_size = vocab_size(args)
    if not 0.0 < args.val_fraction < 1.0:
        raise ConfigError(f"--val-fraction must be between 0 and 1, got {args.val_fraction:g}")
    copies = train_copies(args)
    check_destination(Path(args.out), args.overwrite)  # before reading or downloading
    tokenizer = args.tokenizer
    vocabulary = "the tokenizer's vocabulary (learned from the training split)"
    if args.tokenizer_from is not None:  # (an empty one is an error, not "learn one")
        given = [flag for flag, value in (("--tokenizer", args.tokenizer != "char"),
                                          ("--vocab-size", args.vocab_size is not None)) if value]
        if given:
            raise ConfigError("--tokenizer-from takes the model's or dataset's tokenizer, its "
                              f"vocabulary too; drop {' and '.join(given)}")
        tokenizer, vocabulary = tokenizer_from(args.tokenizer_from)
        if args.bpe_dropout and tokenizer.kind != "bpe":  # before the text is read
            raise ConfigError(f"--bpe-dropout needs a BPE tokenizer; the tokenizer of "
                              f"{args.tokenizer_from} is {tokenizer.kind}")
    text, desc = load_source(args.data, args.dataset)
    meta = prepare_text(text, args.out, tokenizer=tokenizer, vocab_size=args.vocab_size,
                        val_fraction=args.val_fraction, source=desc,
                        overwrite=args.overwrite, bpe_dropout=args.bpe_dropout,
                        train_copies=copies, progress=not args.no_progress, options=FLAGS)
    print(f"prepared {desc}: {meta['chars']:,} characters -> {meta['train_tokens']:,} train + "
          f"{meta['val_tokens']:,} val tokens, vocab {meta['vocab_size']:,} "
          f"({meta['tokenizer']}, {meta['dtype']}) in {args.out}")
    report_unknown(meta, vocabulary)
    report_short_splits(meta)
    report_one_token(args.out, meta)
    if args.tokenizer == "bpe":
        report_short_vocabulary(meta["vocab_size"], args.vocab_size)
    return 0


def vocab_size(args: argparse.Namespace) -> int | None:
    """``--vocab-size``, checked once ``--tokenizer`` says whether it applies: with
    ``--tokenizer char`` a size such as 65 was refused as not above 256 (a BPE's byte tokens)
    rather than as a flag of BPE's alone."""
    if args.vocab_size is None or args.tokenizer_from is not None:  # (refused with it, below)
        return args.vocab_size
    if args.tokenizer != "bpe":
        raise ConfigError("--vocab-size applies to --tokenizer bpe only")
    try:
        return bpe_vocab_size(args.vocab_size)
    except argparse.ArgumentTypeError as e:
        raise ConfigError(f"--vocab-size: {e}") from None


def tokenizer_from(name: str) -> tuple[Tokenizer, str]:
    """The tokenizer of ``name`` and what a note calls its vocabulary: a prepared dataset
    directory's (prepare a second text with the ids of a first), else a model's (a run
    directory, checkpoint, Hugging Face directory or hf:ID)."""
    from scratchgpt.checkpoints.hub import HF_PREFIX, hub_spelling
    from scratchgpt.data.prepare import is_dataset

    if is_dataset(Path(name)):  # (load_model refused it: "not a model")
        from scratchgpt.data.dataset import dataset_tokenizer

        return dataset_tokenizer(name), "the dataset's vocabulary"
    if not name.startswith(HF_PREFIX) and not Path(name).exists():
        raise ConfigError(f"--tokenizer-from {name}: no such run, checkpoint or prepared dataset "
                          f"({hub_spelling(name)}){_built_here(name)}")
    from scratchgpt.checkpoints import load_model

    with naming("--tokenizer-from"):  # it said "checkpoint X does not exist", naming no flag
        return load_model(name)[1].tokenizer(), "the model's vocabulary"


def _built_here(name: str) -> str:
    """Where --tokenizer-from names a tokenizer that --tokenizer builds (``gpt2``: GPT-2's
    own), that flag; else ""."""
    from scratchgpt.tokenizers import BUILD_KINDS

    if name.lower() not in BUILD_KINDS:
        return ""
    return f"; for the {name.lower()} tokenizer itself, give --tokenizer {name.lower()}"


def _spelt_as_speedrun(tokenizer: str) -> str:
    """The flags that say ``bpe:N`` (and ``bpe:N:dropPxK``), as benchmarks/speedrun.sh spells a
    tokenizer, or "" for anything else.

    >>> _spelt_as_speedrun("bpe:768:drop0.1x4")
    '; did you mean --tokenizer bpe --vocab-size 768 --bpe-dropout 0.1 --train-copies 4?'
    """
    match = re.fullmatch(r"bpe:(\d+)(?::drop([\d.]+)(?:x(\d+))?)?", tokenizer)
    if match is None:
        return ""
    size, drop, copies = match.groups()
    flags = f"--tokenizer bpe --vocab-size {size}"
    flags += f" --bpe-dropout {drop}" if drop else ""
    flags += f" --train-copies {copies}" if copies else ""
    return f"; did you mean {flags}?"


def report_short_vocabulary(learned: int, asked: int | None) -> None:
    """A note when BPE training ran out of pairs before the vocabulary size asked for."""
    from scratchgpt.tokenizers import DEFAULT_BPE_VOCAB

    if learned < (asked or DEFAULT_BPE_VOCAB):
        print(f"note: the training split ran out of pairs to merge at a vocabulary of "
              f"{learned:,}, short of the {asked or DEFAULT_BPE_VOCAB:,} "
              f"{'asked for' if asked else '--vocab-size defaults to'} (more text would "
              "learn more)")


def report_short_splits(meta: dict) -> None:
    """A note when a split holds no context window of ``train``'s default --block-size (and
    the token after it): the splits' sizes, and the largest --block-size they hold. A text of
    a few lines was prepared without a word, and the first train refused it."""
    from scratchgpt.models.configs.gpt import GPTConfig

    window = GPTConfig().block_size
    sizes = {"training": meta["train_tokens"], "validation": meta["val_tokens"]}
    short, other = sorted(sizes, key=lambda name: (sizes[name], name == "training"))
    if sizes[short] > window:
        return
    print(f"note: the {short} split holds {plural(sizes[short], 'token', grouped=True)} "
          f"({other}: {sizes[other]:,}), too few for one context window of train's default "
          f"--block-size {window} and the token after it; train with --block-size "
          f"{sizes[short] - 1} or less, or prepare more text")


def report_one_token(out: str, meta: dict) -> None:
    """A note when the training split is one token repeated (data.prepare.repeated_token):
    a text of one character was prepared in silence, and a model trained on it learned
    nothing, its loss 0 at once. Where the vocabulary is that token alone (a character
    tokenizer's), the note says so."""
    from scratchgpt.data.prepare import repeated_token
    from scratchgpt.tokenizers import load_tokenizer

    token = repeated_token(out, meta)
    if token is None:
        return
    spelt = load_tokenizer(out).decode([token])
    one = meta["vocab_size"] == 1
    what = (f"the vocabulary has one token, {spelt!r} (the training split is that character "
            "repeated)" if one else
            f"the training split is one token repeated, {spelt!r} (id {token:,} of "
            f"{meta['vocab_size']:,})")
    print(f"note: {what}: a model trained on it learns nothing but that token (its loss falls "
          f"to 0); prepare a text of more than {'one character' if one else 'that token'}")


def report_unknown(meta: dict, vocabulary: str) -> None:
    """A note per split that holds characters ``vocabulary`` lacks (substituted)."""
    for split in ("train", "val"):
        if meta.get(f"{split}_unknown_chars"):
            n = meta[f"{split}_unknown_chars"]
            print(f"note: {plural(n, f'{split} character', grouped=True)} "
                  f"{'is' if n == 1 else 'are'} not in {vocabulary} and "
                  f"{'was' if n == 1 else 'were'} written as a stand-in character")


def train_copies(args: argparse.Namespace) -> int:
    """The copies of the training split to write; flags that cannot apply are refused before
    anything is read."""
    if not 0.0 <= args.bpe_dropout < 1.0:
        raise ConfigError(f"--bpe-dropout must be in [0, 1), got {args.bpe_dropout:g}")
    if args.bpe_dropout and args.tokenizer not in ("bpe", "gpt2") and args.tokenizer_from is None:
        raise ConfigError(f"--bpe-dropout needs a BPE tokenizer (--tokenizer bpe or gpt2), "
                          f"not {args.tokenizer}")
    if args.train_copies is None:
        return DEFAULT_TRAIN_COPIES if args.bpe_dropout else 1
    if not args.bpe_dropout:
        raise ConfigError("--train-copies applies with --bpe-dropout only (copies of one "
                          "encoding would add nothing)")
    if args.train_copies < 1:
        raise ConfigError(f"--train-copies must be at least 1, got {args.train_copies}")
    return args.train_copies
