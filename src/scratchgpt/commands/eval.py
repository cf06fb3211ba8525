"""``scratchgpt eval``: train/val loss and perplexity of a checkpoint."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from scratchgpt.commands.argtypes import add_which_flag, figure_file, thread_count


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval", help="train/val loss and perplexity of a checkpoint",
        description="Exact loss over every non-overlapping context window of each split of the "
                    "dataset the checkpoint was trained on (or --dataset), in fp32 (or the "
                    "inference precision --dtype: what bf16 or int8 weights cost in loss), "
                    "and in bits per character of the split's text, as train reports its val "
                    "loss (which compares models with different tokenizers).")
    p.add_argument("--checkpoint", required=True,
                   help="run directory, .pt file, Hugging Face GPT-2 directory, or hf:ID "
                        "(then --dataset, prepared with its tokenizer: prepare --tokenizer-from)")
    add_which_flag(p)
    p.add_argument("--dataset", default=None, help="prepared dataset (default: the run's)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="evaluate at most this many tokens per split: the first whole "
                        "context windows that fit, at least one (default: all); the output "
                        "says how many each split had")
    p.add_argument("--dtype", choices=("fp32", "bf16", "int8"), default="fp32",
                   help="evaluate the model as sample --dtype runs it: fp32, bf16 weights and "
                        "activations, or int8 weight-only (default fp32)")
    p.add_argument("--split", choices=("train", "val", "both"), default="both",
                   help="which split to evaluate (default: both); the training split is "
                        "usually the larger (90%% of the text by default), so 'val' alone is "
                        "the quick look")
    p.add_argument("--by-position", action="store_true",
                   help="also the loss at each position of the window, i.e. by how many tokens "
                        "of context the model had: where a longer context would still pay, and "
                        "how much the short contexts at the start of each window cost")
    p.add_argument("--plot", default=None, metavar="FILE",
                   help="draw the loss by context length to FILE (.png, .svg, .pdf); implies "
                        "--by-position")
    p.add_argument("--overwrite", action="store_true", help="replace the --plot file if it exists")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--threads", type=thread_count, default=0,
                   help="CPU threads for torch (0 = torch's default: one per core). On a "
                        "machine other jobs keep busy, 1 can be several times faster: threads "
                        "that share a core wait on each other at every product, as train's "
                        "--threads says")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (by default one on stderr, on a terminal, for each "
                        "split that takes over a second: a large training split takes minutes)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from scratchgpt.checkpoints.io import load_language_model
    from scratchgpt.errors import ConfigError
    from scratchgpt.models.fast_decode import to_inference_dtype
    from scratchgpt.training.allocator import keep_freed_memory
    from scratchgpt.training.task import evaluated_tokens, full_split_loss, loss_by_position

    if args.max_tokens is not None and args.max_tokens < 1:
        raise ConfigError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    figure_file(args.plot, args.overwrite, "--plot")  # refused before any work
    if args.threads:
        torch.set_num_threads(args.threads)
    keep_freed_memory()  # every batch reuses the last one's memory, as training's steps do
    model, source = load_language_model(args.checkpoint, args.which, "eval")
    to_inference_dtype(model, args.dtype)
    ckpt = source.checkpoint
    data = dataset_of(args, ckpt) if ckpt is not None else hf_dataset(args, source, model)
    block = model.config.block_size
    data.check_block_size(block, fixed=True)
    step = ckpt.state.step if ckpt is not None and ckpt.state is not None else None
    figures: dict = {"checkpoint": str(source.path), "step": step, "dtype": args.dtype}
    by_position = args.by_position or args.plot is not None
    curves, losses = {}, {}
    device = next(model.parameters()).device
    splits = ("train", "val") if args.split == "both" else (args.split,)
    drawn = not args.no_progress and sys.stderr.isatty()  # (as train's: a log gets none)
    for split in splits:
        bar = f"{split} split" if drawn else None
        with torch.inference_mode():
            if by_position:  # the same loss, and the curve from the same pass
                loss, curve = loss_by_position(model, data, split, block, device,
                                               max_tokens=args.max_tokens, progress=bar)
                curves[split] = curve.tolist()
                figures[f"{split}_by_position"] = [round(v, 5) for v in curves[split]]
            else:
                loss = full_split_loss(model, data, split, block, device,
                                       max_tokens=args.max_tokens, progress=bar)
        losses[split] = loss
        figures[f"{split}_tokens"] = evaluated_tokens(data, split, block, args.max_tokens)
        figures[f"{split}_loss"] = round(loss, 5)
        figures[f"{split}_ppl"] = round(perplexity(loss), 4)
        if args.max_tokens is None:  # (the split's characters per token: of all of it)
            figures[f"{split}_bpc"] = round(data.bits_per_char(split, loss), 5)
    if args.plot is not None:
        from scratchgpt.viz import context_loss_figure, save_figure

        title = f"{Path(figures['checkpoint']).parent.name} ({when(step, args.dtype)})"
        save_figure(context_loss_figure(curves, title), args.plot)
    if args.json:
        print(json.dumps(figures))
        return 0
    print(f"{figures['checkpoint']} ({when(step, args.dtype)})")
    for split in splits:  # from the exact losses: rounding twice could move a digit
        per_char = (f"   {data.bits_per_char(split, losses[split]):.4f} bits/char"
                    if args.max_tokens is None else "")
        print(f"  {split:5s} loss {losses[split]:.4f}   "
              f"perplexity {perplexity(losses[split]):.3f}{per_char}   "
              f"over {figures[f'{split}_tokens']:,} tokens")
    if by_position:
        print(position_table(curves))
    if args.plot is not None:
        print(f"wrote {args.plot}")
    return 0


def dataset_of(args: argparse.Namespace, ckpt):
    """The prepared dataset to evaluate on: ``--dataset``, else the run's own; its tokenizer
    must be the run's."""
    from scratchgpt.data.resolve import resolve_dataset
    from scratchgpt.errors import CheckpointError
    from scratchgpt.training.job import (
        check_recorded_dataset,
        check_same_tokenizer,
        data_changed,
    )

    dataset = args.dataset or ckpt.data.get("dataset")
    if not dataset:  # a converted model, or one fine-tuned on conversations or labels
        origin = ckpt.data.get("converted_from")
        why = f" (it was converted from {origin})" if origin else ""
        raise CheckpointError(f"{ckpt.path} records no dataset{why}; pass --dataset DIR, a text "
                              f"prepared with its tokenizer ({_prepare(args.checkpoint)})")
    if args.dataset is None:  # (the run's own, which may have moved: train --resume's check)
        check_recorded_dataset(dataset, args.checkpoint)
    # (a named dataset prepared now says so on stderr: stdout may be --json; it is prepared
    # with the run's tokenizer, not one learned from its text that would then be refused)
    own = ckpt.tokenizer("text") if "text" in ckpt.tokenizers else None
    data, _ = resolve_dataset(dataset, log=lambda line: print(line, file=sys.stderr),
                              tokenizer=own)
    check_same_tokenizer(ckpt, data)
    changed = data_changed(ckpt, data) if args.dataset is None else None
    if changed:  # (on stderr: stdout may be --json)
        print(f"note: {data.directory} was prepared again {changed} since the run was "
              "trained: these figures are on its data now, not on the run's", file=sys.stderr)
    return data


def hf_dataset(args: argparse.Namespace, source, model):
    """The prepared dataset to measure a Hugging Face model on: ``--dataset`` (such a model
    records none), tokenized by the model directory's tokenizer; a directory without
    tokenizer files has nothing to compare the dataset's with, which a note says, and its ids
    must at least fit the model's vocabulary."""
    from scratchgpt.checkpoints.hf import hf_tokenizer
    from scratchgpt.data.resolve import resolve_dataset
    from scratchgpt.errors import ConfigError, DataError

    prepare = _prepare(args.checkpoint)
    if args.dataset is None:
        raise ConfigError(f"{args.checkpoint} is a Hugging Face model, which records no "
                          f"dataset; pass --dataset DIR, a text prepared with its tokenizer "
                          f"({prepare})")
    own = hf_tokenizer(source.hf_dir, required=False, config=source.hf_config)
    data, _ = resolve_dataset(args.dataset, log=lambda line: print(line, file=sys.stderr),
                              tokenizer=own)
    if own is not None and not data.tokenizer().same_as(own):
        raise DataError(f"dataset {data.directory} was tokenized differently from the model "
                        f"in {source.hf_dir}; prepare the text with its tokenizer ({prepare})")
    if own is None:
        if data.vocab_size > model.config.vocab_size:
            raise DataError(f"dataset {data.directory} has {data.vocab_size:,} token ids, "
                            f"more than the model's {model.config.vocab_size:,}: it was "
                            "tokenized for another model")
        print(f"note: {source.hf_dir} has no tokenizer files: nothing says {data.directory} "
              "was tokenized as the model was trained", file=sys.stderr)
    return data


def _prepare(checkpoint: str) -> str:
    """The command that prepares a text with ``checkpoint``'s tokenizer, for eval to read."""
    return f"scratchgpt prepare --data TEXT --tokenizer-from {checkpoint} --out DIR"


def perplexity(loss: float) -> float:
    """``exp(loss)``; infinite past the largest float (a loss above ~709 nats, a model that
    diverged), where ``math.exp`` raises."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


def when(step: int | None, dtype: str) -> str:
    """``step 600, fp32``, or the dtype alone for a checkpoint without training state (an
    adapter, a merged or converted model): it has no step to name."""
    return dtype if step is None else f"step {step}, {dtype}"


def position_table(curves: dict[str, list[float]]) -> str:
    """The loss by context length in doubling ranges (1, 2, 3-4, 5-8, ...), one column per
    split: each row is the mean loss of the positions whose context is in that range."""
    from scratchgpt.viz import by_context_range

    ranges = {split: by_context_range(curve) for split, curve in curves.items()}
    lines = ["  context  " + "".join(f"{split:>9s}" for split in ranges)]
    for i, ((lo, hi), _) in enumerate(next(iter(ranges.values()))):
        label = str(lo) if lo == hi else f"{lo}-{hi}"
        lines.append(f"  {label:>7s}  " + "".join(f"{r[i][1]:9.4f}" for r in ranges.values()))
    return "\n".join(lines)

