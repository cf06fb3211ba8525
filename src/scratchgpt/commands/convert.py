"""``scratchgpt convert``: Hugging Face GPT-2 directories <-> our checkpoints."""

from __future__ import annotations

import argparse
from pathlib import Path

from scratchgpt.errors import CheckpointError, ConfigError, ScratchGPTError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "convert", help="convert between Hugging Face GPT-2 directories and our checkpoints",
        description="--from hf DIR: a Hugging Face GPT-2 directory (config.json + "
                    "model.safetensors or pytorch_model.bin) becomes a run directory with "
                    "best.pt (and the tokenizer, when DIR has one). DIR may also be a hub model "
                    "id (gpt2, gpt2-medium, gpt2-large, gpt2-xl, owner/name): it is downloaded "
                    "through huggingface_hub into the Hugging Face cache once (offline, "
                    "HF_HUB_OFFLINE=1, only that cache is used). --to hf: a GPT checkpoint "
                    "becomes a directory that transformers.GPT2LMHeadModel.from_pretrained "
                    "loads. (sample also reads a Hugging Face directory directly.)")
    way = p.add_mutually_exclusive_group(required=True)
    way.add_argument("--from", dest="source", nargs=2, metavar=("FORMAT", "PATH"),
                     help="import: FORMAT is 'hf', PATH a Hugging Face GPT-2 directory or "
                          "a hub model id such as gpt2")
    way.add_argument("--to", dest="target", choices=("hf",), help="export to this format")
    p.add_argument("--checkpoint", default=None, help="with --to: run directory or .pt file")
    p.add_argument("--which", choices=("best", "last"), default="best")
    p.add_argument("--out", required=True, help="directory to write")
    p.add_argument("--overwrite", action="store_true", help="replace what --out holds")
    p.set_defaults(func=run)


def _check_out(out: Path, overwrite: bool) -> None:
    from scratchgpt.checkpoints.rundir import RunDir

    if RunDir(out).is_scratchgpt_run():
        raise CheckpointError(f"{out} holds a scratchgpt run; write the export somewhere else "
                              "(nothing was written)")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise CheckpointError(f"{out} is not empty (pass --overwrite to write into it)")


def run(args: argparse.Namespace) -> int:
    from scratchgpt.checkpoints import checkpoint_tokenizer, load_model
    from scratchgpt.checkpoints.hf import import_hf, save_hf
    from scratchgpt.checkpoints.hub import resolve_hf_source

    out = Path(args.out)
    if args.source:
        fmt, path = args.source
        if fmt != "hf":
            raise ConfigError(f"--from {fmt}: only 'hf' is supported")
        import_hf(resolve_hf_source(path), out, overwrite=args.overwrite)
        print(f"wrote {out / 'best.pt'}")
        return 0
    if not args.checkpoint:
        raise ConfigError("--to hf needs --checkpoint RUN")
    _check_out(out, args.overwrite)
    model, source = load_model(args.checkpoint, args.which)
    try:
        tok = checkpoint_tokenizer(source)
    except ScratchGPTError:
        tok = None  # a model without a tokenizer still exports; say so below
    save_hf(model, out, tok)
    note = "" if tok is not None else " (no tokenizer found: weights and config only)"
    print(f"wrote {out}{note}")
    return 0
