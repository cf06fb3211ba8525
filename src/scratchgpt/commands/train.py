"""``scratchgpt train``: train a language model on a prepared (or named) dataset."""

from __future__ import annotations

import argparse
from typing import Any

from scratchgpt.commands.options import (
    add_dataclass_flags,
    add_lora_flags,
    given,
    lora_flags,
    lora_from_args,
)
from scratchgpt.wording import plural


def add_parser(sub: argparse._SubParsersAction) -> None:
    from scratchgpt.models import LM_CONFIGS
    from scratchgpt.training.config import PRESETS, TrainConfig

    p = sub.add_parser(
        "train", help="train a model (progress bar, eval, checkpoints, loss plot)",
        description="Train a language model. Settings are layered: built-in defaults < --preset "
                    "< --config file < flags. Writes last.pt/best.pt, config.json, metrics.csv "
                    "and loss.png into --out. Ctrl-C (or SIGTERM) saves last.pt after the "
                    "current step; --resume continues exactly.")
    from scratchgpt.data.sources import DATASET_NAMES, DEFAULT_CORPUS

    p.add_argument("--dataset", default=None,
                   help="a prepared dataset directory, or a named dataset, prepared on first "
                        f"use ({', '.join(DATASET_NAMES)}"
                        f"); default: {DEFAULT_CORPUS} (offline)")
    p.add_argument("--model", default=None, choices=sorted(LM_CONFIGS),
                   help="model type (default: gpt)")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="named hyperparameter set")
    p.add_argument("--config", default=None, help="TOML or JSON file of settings")
    p.add_argument("--out", default=None, help="run directory (default: runs/<dataset name>)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out exactly, with its own settings (from its "
                        "last.pt); flags given here change what may change (iterations, "
                        "learning rate, budget, evaluation cadence, precision); without "
                        "--out, the run in runs/<dataset name>, where the same command "
                        "without --out wrote it")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a run already in --out (the old run is kept until the new one "
                        "has written its first checkpoint)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar and no line per evaluation: only the summary at the "
                        "end (metrics.csv in the run has every evaluation)")
    p.add_argument("--init-from", default=None, metavar="RUN_OR_HF_DIR",
                   help="continued pretraining: start from this GPT (a run directory, .pt "
                        "file, Hugging Face GPT-2 directory or hf:ID) instead of random "
                        "weights; its model and tokenizer are kept, so --dataset must be "
                        "prepared with the same tokenizer (prepare --tokenizer-from)")
    add_lora_flags(p)
    hp = p.add_argument_group("training hyperparameters")
    add_dataclass_flags(hp, TrainConfig)
    mp = p.add_argument_group("model hyperparameters (each applies to the models that have it)")
    seen: set[str] = set()
    shown = defaults_by_model(LM_CONFIGS)
    for cfg_cls in LM_CONFIGS.values():
        add_dataclass_flags(mp, cfg_cls, skip={"vocab_size"}, seen=seen, shown=shown)
    p.set_defaults(func=run)


def defaults_by_model(types: dict[str, type]) -> dict[str, str]:
    """The default --help states for a setting the model types default differently, each
    with the types it is theirs: "6 (gpt), 2 (rnn, lstm, gru)". The flag is added once, from
    the first type that has it: --n-layer said "default: 6" to a user training an LSTM, which
    gets 2."""
    import dataclasses

    from scratchgpt.commands.options import show_default

    by_name: dict[str, dict[str, list[str]]] = {}
    for model, cfg_cls in types.items():
        for f in dataclasses.fields(cfg_cls):
            if f.init and f.default is not dataclasses.MISSING:
                by_name.setdefault(f.name, {}).setdefault(show_default(f.default), []).append(
                    model)
    return {name: ", ".join(f"{value} ({', '.join(models)})" for value, models in seen.items())
            for name, seen in by_name.items() if len(seen) > 1}


def run(args: argparse.Namespace) -> int:
    from scratchgpt.training import distributed

    with distributed.quiet_unless_main():  # (a Ctrl-C as torchrun's processes start)
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from scratchgpt.training import distributed, job
    from scratchgpt.training.settings import Settings, known_settings

    settings = Settings(args.preset, args.config, given(args, known_settings() - {"dataset"}))
    progress = not args.no_progress
    if distributed.launched_by_torchrun():  # torchrun started us: one of its processes
        return _torchrun_process(args, settings, progress)
    plan = _plan(args, settings, print if progress else None)
    # (said once every check has passed, the run's lock and the optimizer's included)
    return report(job.run(job.with_notes(plan, job.starting_note(plan)), progress), plan)


def _plan(args: argparse.Namespace, settings: Any, log: Any) -> Any:
    """The job of a new run, a continued-pretraining run (--init-from) or a resumed one."""
    from scratchgpt.errors import ConfigError
    from scratchgpt.finetune.plan import lora_named, plan_continued, with_adapter_finish
    from scratchgpt.training import job

    lora = lora_from_args(args)
    if args.init_from and args.resume:
        raise ConfigError("--init-from starts a new run; a resumed run continues from its own "
                          "last.pt (drop --init-from)")
    if args.init_from:
        return plan_continued(settings, args.init_from, lora, args.out, args.overwrite,
                              args.dataset, log)
    if lora is not None and not args.resume:
        raise ConfigError(f"{lora_named(lora_flags(args))} adapts a pretrained model: give "
                          "--init-from RUN_OR_HF_DIR")
    plan = job.plan(settings, args.out, args.resume, args.overwrite, args.dataset, log=log)
    if lora is not None:
        _check_lora_kept(args, lora, plan.model)
    return with_adapter_finish(plan)


def _check_lora_kept(args: argparse.Namespace, lora: Any, config: Any) -> None:
    """LoRA flags given to a resume pass when they are the run's own adapters' values, as
    ``--n-layer`` equal to the run's does (and as ``finetune --resume`` takes them); another
    value, or adapters the run does not have, is refused, naming what it has."""
    from scratchgpt.errors import ConfigError
    from scratchgpt.finetune.plan import lora_kept_by
    from scratchgpt.models.lora import GPTLoRAConfig

    flags = lora_flags(args)
    has = lora_kept_by(flags, lora, config) if isinstance(config, GPTLoRAConfig) else ""
    if has is not None:
        runs = f" (this run has {has})" if has else " (this run has no adapters)"
        raise ConfigError(f"a resumed run keeps its model, adapters included: drop "
                          f"{' '.join(flags)}, or start a new run{runs}")


def _torchrun_process(args: argparse.Namespace, settings: Any, progress: bool) -> int:
    """One of torchrun's processes: rank 0 plans the job as ``run`` does (``--init-from``,
    LoRA, ``--resume``) and says what ``run`` says; the others plan after it (see
    :func:`scratchgpt.training.job.run_launched`), then all train together."""
    from scratchgpt.training import distributed, job

    def begin(main: bool) -> Any:
        if not main:
            return _plan(argparse.Namespace(**{**vars(args), "overwrite": False}), settings,
                         None)
        plan = _plan(args, settings, print if progress else None)
        return job.with_notes(plan, job.starting_note(plan))

    plan, result, main = job.run_launched(begin, settings.given.get("device", "auto"), progress)
    distributed.exit_process(report(result, plan) if main else 0)


def report(result: Any, plan: Any) -> int:
    """Print how the training of ``plan`` (its job) ended; return the exit code (130 after
    Ctrl-C, 143 after SIGTERM)."""
    from scratchgpt.finetune.plan import saved_at_stop

    out = plan.out
    if result.interrupted:
        print(f"stopped at step {result.step}; saved {saved_at_stop(out, plan.model)} "
              f"(continue with --out {out} --resume)")
        return result.exit_code
    bpc = result.metrics.get("val_bpc")
    per_char = f", {bpc:.4f} bits/char" if bpc is not None else ""
    # tokens/s of this process's steps (none when a resumed run had nothing left to train)
    speed = f" ({result.tokens_per_s:,.0f} tokens/s)" if result.tokens_per_s > 0 else ""
    print(f"done: {plural(result.step, 'step')} in {result.elapsed_s:.1f}s{speed}; train loss "
          f"{result.train_loss:.4f}, "
          f"val loss {result.val_loss:.4f} (full val split{per_char}); "
          f"best {result.best_val_loss:.4f}")
    print(f"checkpoints, metrics.csv and loss.png in {out}")
    return 0
