"""``scratchgpt convert``: Hugging Face GPT-2 directories <-> our checkpoints, and GGUF files
for llama.cpp."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scratchgpt.commands.argtypes import add_which_flag
from scratchgpt.errors import CheckpointError, ConfigError
from scratchgpt.validation import file_above

if TYPE_CHECKING:
    from scratchgpt.checkpoints.io import ModelSource

GGUF_TYPES = ("f32", "f16", "q8_0")  # checkpoints.gguf.GGUF_TYPES, without importing numpy here


class FromAction(argparse.Action):
    """``--from FORMAT PATH``, and ``--from hf:ID``, the way every reader of a checkpoint names
    a hub model (checkpoints.hub.HF_PREFIX), as ``--from hf ID``: it was refused as
    "expected 2 arguments", as was ``--from gpt2``, now told what to write."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        if len(values) == 1 and values[0].startswith("hf:"):
            values = ["hf", values[0][len("hf:"):]]
        if len(values) != 2:
            path = values[0] if len(values) == 1 and values[0].strip() not in ("", "hf") else "DIR"
            parser.error(f"--from takes a FORMAT and a PATH, as in --from hf {path} (or "
                         f"--from hf:ID for a hub model); got --from {' '.join(values)}")
        setattr(namespace, self.dest, list(values))


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "convert", help="convert between Hugging Face GPT-2 directories and our checkpoints; "
                        "export GGUF for llama.cpp",
        description="--from hf DIR: a Hugging Face GPT-2 directory (config.json + "
                    "model.safetensors or pytorch_model.bin, either whole or in shards) becomes a "
                    "run directory with best.pt "
                    "(and the tokenizer, when DIR has one; without one a note says that the run "
                    "holds weights only, which sample, chat, finetune and train --init-from "
                    "refuse). DIR may also be a hub model "
                    "id (gpt2, gpt2-medium, gpt2-large, gpt2-xl, owner/name): it is downloaded "
                    "through huggingface_hub into the Hugging Face cache once (offline, "
                    "HF_HUB_OFFLINE=1, only that cache is used). --to hf: a GPT checkpoint becomes"
                    " a directory that transformers.GPT2LMHeadModel.from_pretrained loads. (sample"
                    " also reads a Hugging Face directory directly.) --to gguf: a GPT checkpoint "
                    "and its tokenizer (byte-level BPE, GPT-2's or trained, or char) become one "
                    "GGUF file that llama.cpp runs as its gpt2 architecture (--type f32, f16 or "
                    "q8_0); models llama.cpp cannot compute the same way (no biases, sinusoidal "
                    "positions, exact GELU) are refused.")
    way = p.add_mutually_exclusive_group(required=True)
    way.add_argument("--from", dest="source", nargs="+", metavar=("FORMAT", "PATH"),
                     action=FromAction,
                     help="import: FORMAT is 'hf', PATH a Hugging Face GPT-2 directory or "
                          "a hub model id such as gpt2 (--from hf:gpt2 is --from hf gpt2)")
    way.add_argument("--to", dest="target", choices=("hf", "gguf"),
                     help="export to this format: hf (a directory) or gguf (one file)")
    p.add_argument("--checkpoint", default=None,
                   help="with --to: the model to export: a run directory or .pt file (a LoRA "
                        "run, or its adapter.pt, exports with its adapters folded in), a "
                        "Hugging Face GPT-2 directory or hf:ID")
    add_which_flag(p)
    p.add_argument("--type", dest="gguf_type", choices=GGUF_TYPES, default=None,
                   help="with --to gguf: weight precision, f32 (exact), f16, or q8_0 (int8 "
                        "blocks of 32 with an f16 scale; 8.5 bits per weight; a matrix whose "
                        "rows are not a multiple of 32 long stays f16) (default f32)")
    p.add_argument("--out", required=True,
                   help="directory to write (--from hf, --to hf) or file (--to gguf)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace what --out holds: an earlier export (never a run, a prepared "
                        "dataset, the --checkpoint, a device or a pipe; nor, with --to gguf, a "
                        "Hugging Face model's files)")
    p.set_defaults(func=run)


EXPORT_LOCK = ".export.lock"  # a --to hf export's lock, inside --out


EXPORT_NOUN = {"hf": "a directory", "gguf": "one file"}  # what each --to writes, as said


def _check_place(out: Path, target: str, typed: str) -> None:
    """What --out is refused for before anything is read, in the same words for --to hf and
    --to gguf: a device or pipe, a path below a file, or the other kind of thing from what
    ``target`` writes (a file for hf, a directory for gguf: ``typed`` ending in a slash
    names one)."""
    noun = EXPORT_NOUN[target]
    if out.exists() and not (out.is_file() or out.is_dir()):
        # an export is renamed into place: it would replace the device or pipe itself
        raise ConfigError(f"--out {out} is not a regular file or directory (a device, a pipe); "
                          f"name {noun} for the export (nothing was written)")
    above = file_above(out)
    if above is not None:
        raise ConfigError(f"--out {out} is below {above}, a file, not a folder; name {noun} "
                          "for the export (nothing was written)")
    if target == "gguf" and (out.is_dir() or typed.endswith(("/", os.sep))):
        _wrong_kind(target, typed, "a directory", out / "model.gguf")
    if target == "hf" and out.is_file():
        _wrong_kind(target, typed, "a file", out.with_name(f"{out.stem}-hf"))


def _wrong_kind(target: str, typed: str, kind: str, example: Path) -> None:
    noun = EXPORT_NOUN[target]
    raise ConfigError(f"--to {target} writes {noun}; {typed} is {kind} (name {noun} instead, "
                      f"e.g. {example})")


def _check_out(out: Path, checkpoint: str | None) -> None:
    """What an export never writes over, --overwrite or not: its own --checkpoint, a run, a
    prepared dataset, a Hugging Face model's file."""
    if checkpoint and out.is_file() and Path(checkpoint).is_file() and out.samefile(checkpoint):
        # scratchgpt reads no GGUF: the model would be gone
        raise CheckpointError(f"--out {out} is the --checkpoint it exports; write the export "
                              "beside it (nothing was written)")
    holder = _holder(out)
    if holder is not None:
        raise CheckpointError(f"{out} holds (or is part of) {holder}; write the export "
                              "somewhere else (nothing was written)")


def _check_free(out: Path, overwrite: bool) -> None:
    """--out holds nothing the export would write over, or ``overwrite``; checked holding the
    export's lock, so that an export that ended a moment ago is seen."""
    if overwrite or not out.exists():
        return
    from scratchgpt.checkpoints.hf import is_hf_dir
    from scratchgpt.checkpoints.io import is_gguf

    if out.is_file():
        what = "a GGUF file" if is_gguf(out) else "a file"
    elif _holds_files(out):
        what = "a Hugging Face model" if is_hf_dir(out) else "files"
    else:
        return
    raise CheckpointError(f"--out {out} already holds {what} (pass --overwrite to write the "
                          "export there; nothing was written)")


@contextlib.contextmanager
def _export_lock(out: Path, target: str) -> Iterator[None]:
    """One export at a time into ``out``: a lock file in the folder the export writes in
    (``out`` for hf, its folder for gguf), taken before anything is written there, so that
    the first write is the test that --out can be written."""
    from scratchgpt.checkpoints.hf import is_hf_dir
    from scratchgpt.checkpoints.io import held_lock, is_gguf, write_failure

    def in_use(pid: str) -> CheckpointError:
        return CheckpointError(f"--out {out} is being written by another export (process "
                               f"{pid}); wait for it to end, or stop it (nothing was written)")

    lock = out / EXPORT_LOCK if target == "hf" else out.with_name(f".{out.name}.lock")
    earlier = "export" if is_hf_dir(out) or is_gguf(out) else None
    held = False
    try:
        with held_lock(lock, in_use):
            held = True
            yield
    except OSError as e:
        if held:  # the export's own, which names its own file
            raise
        raise write_failure(out, e, earlier) from None


def _holds_files(directory: Path) -> bool:
    """Whether ``directory`` holds anything but this export's lock and what an export killed
    in it left (its temporary folder, which the export removes: see ``save_hf``)."""
    from scratchgpt.checkpoints.hf import STAGING, UNTAGGED_STAGING
    from scratchgpt.checkpoints.io import dead_temporaries

    left = {*dead_temporaries(directory, STAGING, UNTAGGED_STAGING), directory / EXPORT_LOCK}
    return any(p not in left for p in directory.iterdir())


def _holder(out: Path) -> str | None:
    """What ``out`` holds, or is one of the files of, that no export may write over, --overwrite
    or not: a scratchgpt run, a prepared dataset (the export's merges.txt or tokenizer.json
    would replace the dataset's) or a Hugging Face model (a GGUF over its config.json);
    None where the export may go. (--to hf --overwrite over an earlier export replaces it.)"""
    from scratchgpt.checkpoints.hf import DIRECTORY_FILES, WEIGHT_FILES, is_hf_dir
    from scratchgpt.checkpoints.rundir import RUN_FILES
    from scratchgpt.data.prepare import OWN_FILES, is_dataset

    if _holds_run(out) or (out.name in RUN_FILES and _holds_run(out.parent)):
        return "a scratchgpt run"
    if is_dataset(out) or (out.name in OWN_FILES and is_dataset(out.parent)):
        return "a prepared dataset"
    if out.name in (*DIRECTORY_FILES, *WEIGHT_FILES) and is_hf_dir(out.parent):
        return "a Hugging Face model"
    return None


def _holds_run(path: Path) -> bool:
    """A scratchgpt run is there, not an earlier Hugging Face export (whose config.json
    would otherwise pass for a run's): an export is weights and a config, no checkpoint and
    no metrics."""
    from scratchgpt.checkpoints.hf import is_hf_dir
    from scratchgpt.checkpoints.rundir import RunDir

    export = is_hf_dir(path) and not any((path / f).exists()
                                         for f in ("last.pt", "best.pt", "metrics.csv"))
    return RunDir(path).is_scratchgpt_run() and not export


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if args.gguf_type is not None and args.target != "gguf":
        raise ConfigError("--type applies to --to gguf only")
    if args.source:
        if args.checkpoint:
            raise ConfigError("--checkpoint applies to --to only; --from hf reads its PATH")
        if args.which:
            raise ConfigError("--which applies to --to only; --from hf reads its PATH's "
                              "one model")
        return import_from(args.source, out, args.overwrite)
    _check_place(out, args.target, args.out)
    _check_out(out, args.checkpoint)
    if not args.checkpoint:
        raise ConfigError(f"--to {args.target} needs --checkpoint RUN")
    with _export_lock(out, args.target):
        _check_free(out, args.overwrite)
        return export(args, out)


def export(args: argparse.Namespace, out: Path) -> int:
    """``--to hf`` or ``--to gguf`` of ``--checkpoint`` into ``out``, checked and locked."""
    from scratchgpt.checkpoints import load_model
    from scratchgpt.validation import FLAGS

    model, source = load_model(args.checkpoint, args.which, FLAGS)
    tok = _tokenizer_or_none(source)  # a model without one still exports to hf; said below
    from scratchgpt.chat import template_for

    template = template_for(source)  # an instruction-tuned model's template goes along
    if args.target == "gguf":
        return export_gguf(model, tok, out, args.gguf_type or "f32", template)
    from scratchgpt.checkpoints.hf import has_hf_form, save_hf

    save_hf(model, out, tok, template and template.name)
    note = "" if tok is not None else " (no tokenizer found: weights and config only)"
    print(f"wrote {out}{note}")
    if tok is not None and not has_hf_form(tok):
        _note_no_hf_tokenizer(tok.kind, out, template is not None)
    return 0


def _tokenizer_or_none(source: ModelSource) -> Any:
    """The model's tokenizer, or None where it has none. One that is there but cannot be read
    (a BPE checkpoint copied without the merges.txt beside it) is that error: it was taken
    for none, and the export said the model had no tokenizer (GGUF) or wrote weights only."""
    from scratchgpt.checkpoints.hf import hf_tokenizer
    from scratchgpt.tokenizers.base import TOKENIZER_FILE

    ckpt = source.checkpoint
    if ckpt is None:
        return hf_tokenizer(source.hf_dir, required=False, config=source.hf_config)
    beside = ckpt.path is not None and (ckpt.path.parent / TOKENIZER_FILE).is_file()
    return source.tokenizer() if "text" in ckpt.tokenizers or beside else None


def _note_no_hf_tokenizer(kind: str, out: Path, chat: bool) -> None:
    """Say that transformers finds the weights but no tokenizer (AutoTokenizer still loads
    something from the directory: an empty GPT-2 tokenizer, which encodes any text to no ids)."""
    lost = "its tokenizer and chat template have" if chat else "its tokenizer has"
    print(f"note: a {kind} tokenizer has no Hugging Face form: transformers loads the weights of "
          f"{out}, but {lost} no files it reads (AutoTokenizer gives an empty one); "
          f"scratchgpt's sample, chat and serve read the directory with its own tokenizer",
          file=sys.stderr)


def import_from(source: list[str], out: Path, overwrite: bool) -> int:
    """``--from hf DIR_OR_HUB_ID``: a run directory holding the model as ``best.pt``."""
    from scratchgpt.checkpoints.hf import import_hf
    from scratchgpt.checkpoints.hub import resolve_hf_source

    fmt, path = source
    if fmt != "hf":
        from scratchgpt.checkpoints.io import GGUF_NOT_READ

        why = f"{GGUF_NOT_READ}; " if fmt.lower() == "gguf" else ""
        raise ConfigError(f"--from {fmt}: {why}convert reads hf alone (a Hugging Face GPT-2 "
                          "directory or hub model id)")
    hf_dir = resolve_hf_source(path)
    _, has_tokenizer = import_hf(hf_dir, out, overwrite=overwrite)
    print(f"wrote {out / 'best.pt'}")
    if not has_tokenizer:  # the run is written: sample, chat and --init-from refuse it later
        print(f"note: {hf_dir} has no tokenizer (tokenizer.json, vocab.json + merges.txt, or "
              f"encoder.json + vocab.bpe), so {out} holds weights only, which sample, chat, "
              f"finetune and train --init-from refuse; put the model's tokenizer files in "
              f"{hf_dir} and convert again with --overwrite", file=sys.stderr)
    return 0


def export_gguf(model, tok, out: Path, qtype: str, template=None) -> int:
    """``--to gguf``: write the file and say what it holds (and any caveat)."""
    from scratchgpt.checkpoints.gguf import save_gguf

    done = save_gguf(model, out, tok, qtype, chat_template=template)
    size = done.path.stat().st_size / 2**20
    chat = f", chat template {template.name}" if template is not None else ""
    instead = f": {done.instead}" if done.instead else ""  # (--type q8_0 that wrote f16)
    print(f"wrote {done.path} ({done.type}, {done.n_tensors} tensors, {size:.1f} MiB{chat})"
          f"{instead}")
    for note in done.notes:
        print(f"note: {note}")
    return 0
