"""``scratchgpt eval``: train/val loss and perplexity of a checkpoint."""

from __future__ import annotations

import argparse
import json
import math

from scratchgpt.commands.argtypes import add_which_flag


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval", help="train/val loss and perplexity of a checkpoint",
        description="Exact loss over every non-overlapping context window of each split of the "
                    "dataset the checkpoint was trained on (or --dataset), in fp32 (or the "
                    "inference precision --dtype: what bf16 or int8 weights cost in loss).")
    p.add_argument("--checkpoint", required=True, help="run directory or .pt file")
    add_which_flag(p)
    p.add_argument("--dataset", default=None, help="prepared dataset (default: the run's)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="evaluate at most this many tokens per split (default: all)")
    p.add_argument("--dtype", choices=("fp32", "bf16", "int8"), default="fp32",
                   help="evaluate the model as sample --dtype runs it: fp32, bf16 weights and "
                        "activations, or int8 weight-only (default fp32)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from scratchgpt.checkpoints import load_model
    from scratchgpt.data.resolve import resolve_dataset
    from scratchgpt.errors import CheckpointError, ConfigError
    from scratchgpt.models.fast_decode import to_inference_dtype
    from scratchgpt.training.job import check_same_tokenizer
    from scratchgpt.training.task import full_split_loss

    if args.max_tokens is not None and args.max_tokens < 1:
        raise ConfigError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    model, source = load_model(args.checkpoint, args.which)
    to_inference_dtype(model, args.dtype)
    ckpt = source.checkpoint
    if ckpt is None or not hasattr(ckpt.model_config, "block_size"):
        raise CheckpointError(f"{args.checkpoint}: eval measures language models trained here "
                              "(a scratchgpt run or .pt file)")
    dataset = args.dataset or ckpt.data.get("dataset")
    if not dataset:
        raise CheckpointError("the checkpoint does not record its dataset; pass --dataset")
    data, _ = resolve_dataset(dataset)
    check_same_tokenizer(ckpt, data)
    block = ckpt.model_config.block_size
    data.check_block_size(block)
    step = ckpt.state.step if ckpt.state is not None else None
    figures: dict = {"checkpoint": str(source.path), "step": step, "dtype": args.dtype}
    for split in ("train", "val"):
        with torch.inference_mode():
            loss = full_split_loss(model, data, split, block, next(model.parameters()).device,
                                   max_tokens=args.max_tokens)
        figures[f"{split}_loss"] = round(loss, 5)
        figures[f"{split}_ppl"] = round(math.exp(loss), 4)
    if args.json:
        print(json.dumps(figures))
    else:
        print(f"{figures['checkpoint']} (step {figures['step']}, {args.dtype})")
        for split in ("train", "val"):
            print(f"  {split:5s} loss {figures[split + '_loss']:.4f}   "
                  f"perplexity {figures[split + '_ppl']:.3f}")
    return 0
