"""``scratchgpt prepare``: text -> tokenizer + memory-mapped token files."""

from __future__ import annotations

import argparse
from pathlib import Path

from scratchgpt.errors import ConfigError


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
    src = p.add_mutually_exclusive_group()
    src.add_argument("--data", help="a UTF-8 text file, or a folder of .txt files")
    src.add_argument("--dataset", help="a named dataset (e.g. shakespeare), fetched and verified "
                                       "by sha256; looked up in $SCRATCHGPT_DATA_DIR first")
    p.add_argument("--tokenizer", default="char",
                   help="char, char-prose (letters, digits, space and basic punctuation; "
                        "newlines and repeated spaces folded), bpe (trained here) or gpt2 "
                        "(default: char)")
    p.add_argument("--tokenizer-from", default=None, metavar="RUN_OR_HF_DIR",
                   help="use the tokenizer of this model (a run directory, .pt file, Hugging "
                        "Face directory or hf:ID) instead of learning one: the text is then "
                        "ready for 'train --init-from' that model")
    p.add_argument("--vocab-size", type=int, default=None,
                   help="vocabulary size for --tokenizer bpe (default 4096)")
    p.add_argument("--val-fraction", type=float, default=0.1,
                   help="fraction at the end of the text held out for validation (default 0.1)")
    p.add_argument("--out", required=True, help="output directory of the prepared dataset")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a dataset already in --out (the new one is written beside it "
                        "and renamed into place once complete)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from scratchgpt.data.prepare import check_destination, prepare_text
    from scratchgpt.data.resolve import load_source

    if args.vocab_size is not None and args.tokenizer != "bpe":
        raise ConfigError("--vocab-size applies to --tokenizer bpe only")
    check_destination(Path(args.out), args.overwrite)  # before reading or downloading
    tokenizer = args.tokenizer
    if args.tokenizer_from:
        from scratchgpt.checkpoints import load_model

        if args.tokenizer != "char" or args.vocab_size is not None:
            raise ConfigError("--tokenizer-from takes the model's tokenizer; drop --tokenizer "
                              "and --vocab-size")
        tokenizer = load_model(args.tokenizer_from)[1].tokenizer()
    text, desc = load_source(args.data, args.dataset)
    meta = prepare_text(text, args.out, tokenizer=tokenizer, vocab_size=args.vocab_size,
                        val_fraction=args.val_fraction, source=desc,
                        overwrite=args.overwrite)
    print(f"prepared {desc}: {meta['chars']:,} characters -> {meta['train_tokens']:,} train + "
          f"{meta['val_tokens']:,} val tokens, vocab {meta['vocab_size']:,} "
          f"({meta['tokenizer']}, {meta['dtype']}) in {args.out}")
    return 0
