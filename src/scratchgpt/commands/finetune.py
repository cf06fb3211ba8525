"""``scratchgpt finetune``: a pretrained GPT -> a classifier or an instruction-following chat
model (whole model, some blocks, or LoRA adapters); ``--merge`` folds adapters into weights."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from scratchgpt.commands.argtypes import non_negative_int, positive_int, seed_int
from scratchgpt.commands.options import (
    add_dataclass_flags,
    add_lora_flags,
    given,
    lora_flags,
    lora_from_args,
)
from scratchgpt.validation import flag_of
from scratchgpt.wording import plural

# What a run is made of, besides its base and data (FinetuneRequest's field -> its flag): the
# flags default to None, so that a resume can tell the ones given (it compares them with the
# run's); those not given take FinetuneRequest's defaults.
RUN_SHAPING = {"policy": "--train", "last_k": "--last-k", "epochs": "--epochs",
               "class_weights": "--class-weights", "max_length": "--max-length",
               "split_seed": "--split-seed", "held_out": "--held-out",
               "eval_generate": "--eval-generate", "dropout": "--dropout"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    from scratchgpt.finetune.defaults import shown_defaults
    from scratchgpt.training.config import LM_WINDOW_SETTINGS, TrainConfig

    p = sub.add_parser(
        "finetune", help="fine-tune a pretrained GPT: text classifier or chat model (LoRA too)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Fine-tune a pretrained GPT (--init-from: a run directory, a .pt file, a Hugging Face GPT-2
directory or hf:ID) on the training core: progress bar, metrics.csv and loss.png, best.pt and
last.pt, exact --resume, --time-budget, Ctrl-C saves.

--task classify: a TSV of text<TAB>label lines (or a CSV of text,label rows, or --dataset
  sms-spam) -> a new N-class head reading the last real token. A seeded, stratified
  train/val/test split (70/10/20) is recorded in the run. Each epoch reports validation loss,
  accuracy and macro F1; at the end best.pt is scored on the test split: accuracy, per-class
  precision/recall/F1, confusion matrix (printed, test_metrics.json, confusion.png).
  Texts longer than the context are truncated to their first tokens (with a count).
--task instruct: Alpaca JSON (instruction, input, output) or chat JSONL ({"messages": [...]}
  with roles system/user/assistant), or --dataset instruction-data. Conversations are written
  with the chat template (<|user|>, <|assistant|> lines, replies ending in <|end|>); only reply
  tokens carry the loss. Reports the held-out response loss before and after (the base's,
  measured as the run starts, is kept in its checkpoints: a resumed run reports it too).
--lora trains low-rank adapters only and writes adapter.pt (small; refuses any other base).
--merge RUN|adapter.pt --out DIR folds the adapters into the weights (a plain model that
  'scratchgpt convert --to hf' exports); with --init-from, the adapter goes onto that base.""")
    p.add_argument("--task", choices=("classify", "instruct"), default=None,
                   help="what to fine-tune for (a resumed run keeps its own)")
    p.add_argument("--init-from", default=None, metavar="RUN_OR_HF_DIR",
                   help="the pretrained model to start from")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--data", default=None, help="the fine-tuning data file")
    src.add_argument("--dataset", default=None,
                     help="a named dataset: sms-spam (classify) or instruction-data "
                          "(instruct), fetched and verified by sha256; looked up in "
                          "$SCRATCHGPT_DATA_DIR first (sms-spam as SMSSpamCollection or "
                          "sms-spam.tsv)")
    p.add_argument("--out", default=None, help="run directory (default: runs/TASK-DATA)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out exactly (without --out: the run the same "
                        "--task and --data or --dataset wrote to runs/TASK-DATA)")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
    p.add_argument("--merge", default=None, metavar="RUN_OR_ADAPTER",
                   help="no training: fold the LoRA adapters of this run (or adapter.pt) into "
                        "the weights and write the plain model to --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    what = p.add_argument_group("what trains")
    what.add_argument("--train", dest="policy", choices=("all", "head", "last-k"),
                      default=None,
                      help="classify: all weights (default), the new head alone, or the last "
                           "--last-k blocks with the final LayerNorm and the head")
    what.add_argument("--last-k", type=positive_int, default=None,
                      help="blocks that train with --train last-k (default 2)")
    add_lora_flags(p)
    data = p.add_argument_group("data")
    data.add_argument("--epochs", type=float, default=None,
                      help="passes over the training split (default 3; --max-iters overrides)")
    data.add_argument("--class-weights", choices=("none", "balanced"), default=None,
                      help="classify: weight the loss of each class by n / (classes * n_c), "
                           "for imbalanced labels (default none)")
    data.add_argument("--max-length", type=non_negative_int, default=None,
                      help="tokens per example, at most the base's context (default 0: all "
                           "of it); longer ones are truncated, with a warning and a count")
    data.add_argument("--split-seed", type=seed_int, default=None,
                      help="seed of the data split (0)")
    data.add_argument("--held-out", type=float, default=None,
                      help="instruct: fraction of conversations held out (default 0.1)")
    data.add_argument("--eval-generate", type=non_negative_int, default=None, metavar="N",
                      help="instruct: answer N held-out prompts greedily before and after "
                           "training and report the exact match (default 0: off)")
    data.add_argument("--dropout", type=float, default=None,
                      help="dropout while fine-tuning (default: the base's)")
    hp = p.add_argument_group("training hyperparameters (defaults depend on the task and on "
                              "what trains)")
    add_dataclass_flags(hp, TrainConfig, skip=LM_WINDOW_SETTINGS, shown=shown_defaults())
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from scratchgpt.training.config import train_fields

    if args.merge:
        return merge(args)
    from scratchgpt.finetune.plan import FinetuneRequest, plan, starting_figures
    from scratchgpt.training import distributed, job

    progress = not args.no_progress
    lora = lora_from_args(args)
    shaping = {dest: getattr(args, dest) for dest in RUN_SHAPING
               if getattr(args, dest) is not None}
    flags = [RUN_SHAPING[dest] for dest in shaping]
    req = FinetuneRequest(
        args.task, args.init_from, args.out, args.data, args.dataset, args.resume,
        args.overwrite, given(args, train_fields()), lora=lora,
        given_flags=tuple(flags + lora_flags(args)),
        # the --eval-generate replies' bar: on a terminal only, as every bar (a log gets none)
        progress=progress and sys.stderr.isatty(), **shaping)
    if distributed.launched_by_torchrun():  # torchrun started us: one of its processes
        return _torchrun_process(req, progress)
    train_job = plan(req, log=print)
    before = starting_figures(train_job, log=print)
    # (a resumed run with nothing left to train, or one that ends inside its warmup, says so
    # once every check has passed, the run's lock included)
    result = job.run(job.with_notes(train_job, job.starting_note(train_job)), progress)
    return report(result, train_job, before)


def _torchrun_process(req: Any, progress: bool) -> int:
    """One of torchrun's processes: rank 0 plans the run and says what ``run`` says before
    training (the base's figures too); the others plan after it, quietly (see
    :func:`scratchgpt.training.job.run_launched`), then all train together."""
    import dataclasses

    from scratchgpt.finetune.plan import plan, starting_figures
    from scratchgpt.training import distributed, job

    before: dict[str, Any] = {}

    def begin(main: bool) -> Any:
        if not main:
            # (quietly: rank 0 alone draws the --eval-generate bar)
            return plan(dataclasses.replace(req, overwrite=False, progress=False), log=None)
        train_job = plan(req, log=print)
        before.update(starting_figures(train_job, log=print))
        return job.with_notes(train_job, job.starting_note(train_job))

    device = req.train_flags.get("device", "auto")
    train_job, result, main = job.run_launched(begin, device, progress)
    distributed.exit_process(report(result, train_job, before) if main else 0)


def report(result: Any, train_job: Any, before: dict[str, Any]) -> int:
    from scratchgpt.finetune.plan import saved_at_stop

    out = train_job.out
    if result.interrupted:
        print(f"stopped at step {result.step}; saved {saved_at_stop(out, train_job.model)} "
              f"(continue with scratchgpt finetune --out {out} --resume)")
        return result.exit_code
    extra = "".join(f", {k} {v:.4f}" for k, v in result.metrics.items()
                    if k not in ("train_loss", "val_loss"))
    # (as train's: the last evaluation line's val loss, over --eval-iters batches, is another)
    print(f"done: {plural(result.step, 'step')} in {result.elapsed_s:.1f}s; train loss "
          f"{result.train_loss:.4f}; full val split: val loss {result.val_loss:.4f}{extra}; "
          f"best {result.best_val_loss:.4f}")
    if "val_loss" in before:
        print(f"held-out response loss: {before['val_loss']:.4f} before, "
              f"{result.val_loss:.4f} after")
    if result.report:
        print(result.report)
    print(f"checkpoints, metrics.csv and loss.png in {out}")
    return 0


def merge(args: argparse.Namespace) -> int:
    from scratchgpt.errors import ConfigError
    from scratchgpt.finetune.adapter import merge_run

    if not args.out:
        raise ConfigError("--merge needs --out, the directory to write the merged model to")
    data = [flag for flag, value in (("--task", args.task), ("--data", args.data),
                                     ("--dataset", args.dataset), ("--resume", args.resume))
            if value]
    training = data + training_flags(args)
    if training:
        raise ConfigError(f"--merge trains nothing; drop {' '.join(training)}")
    out, kind = merge_run(args.merge, args.out, args.init_from, args.overwrite)
    # a classifier has no Hugging Face GPT-2 form to export to
    export = (f" (export with: scratchgpt convert --to hf --checkpoint {out} --out DIR)"
              if kind == "gpt" else "")
    print(f"merged the adapters of {args.merge} into the weights: {out / 'best.pt'}{export}")
    return 0


def training_flags(args: argparse.Namespace) -> list[str]:
    """The flags given that shape or tune training (what trains, the data's use, LoRA, the
    hyperparameters): none of them applies to --merge."""
    from scratchgpt.training.config import train_fields

    dests = [*RUN_SHAPING, *sorted(given(args, train_fields()))]
    flags = [RUN_SHAPING.get(d, flag_of(d)) for d in dests
             if getattr(args, d) is not None]
    return flags + lora_flags(args)
