"""``scratchgpt train``: train a language model on a prepared (or named) dataset."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from scratchgpt.commands.options import add_dataclass_flags, given
from scratchgpt.errors import CheckpointError, ConfigError, DataError


def add_parser(sub: argparse._SubParsersAction) -> None:
    from scratchgpt.models import MODEL_TYPES
    from scratchgpt.training.config import PRESETS, TrainConfig

    p = sub.add_parser(
        "train", help="train a model (progress bar, eval, checkpoints, loss plot)",
        description="Train a language model. Settings are layered: built-in defaults < --preset "
                    "< --config file < flags. Writes last.pt/best.pt, config.json, metrics.csv "
                    "and loss.png into --out. Ctrl-C saves last.pt; --resume continues exactly.")
    p.add_argument("--dataset", default=None,
                   help="a prepared dataset directory, or a named dataset (shakespeare, "
                        "warandpeace, python-stdlib) prepared on the fly; default: "
                        "python-stdlib (offline)")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="named hyperparameter set")
    p.add_argument("--config", default=None, help="TOML or JSON file of settings")
    p.add_argument("--out", default=None, help="run directory (default: runs/<dataset name>)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out exactly, with its own settings (from its "
                        "config.json; flags given here override them)")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    hp = p.add_argument_group("training hyperparameters")
    add_dataclass_flags(hp, TrainConfig)
    mp = p.add_argument_group("model hyperparameters (each applies to the models that have it)")
    seen: set[str] = set()
    for cfg_cls, _ in MODEL_TYPES.values():
        add_dataclass_flags(mp, cfg_cls, skip={"vocab_size"}, seen=seen)
    p.set_defaults(func=run)


def resolve_settings(args: argparse.Namespace, saved: dict[str, Any] | None = None,
                     ) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """Layer defaults < ``saved`` (a resumed run's settings) < preset < file < flags.
    Returns (TrainConfig, model config, sources)."""
    from scratchgpt.models import MODEL_TYPES, config_fields
    from scratchgpt.training.config import PRESETS, TrainConfig, load_config_file, train_fields

    all_model_fields = set().union(*(config_fields(m) for m in MODEL_TYPES)) - {"vocab_size"}
    known = train_fields() | all_model_fields
    preset = dict(PRESETS[args.preset]) if args.preset else {}
    from_file = load_config_file(args.config) if args.config else {}
    unknown = set(from_file) - known
    if unknown:
        raise ConfigError(f"{args.config}: unknown settings: {', '.join(sorted(unknown))}")
    flags = given(args, known)
    merged = {**(saved or {}), **preset, **from_file, **flags}
    tcfg = TrainConfig(**{k: v for k, v in merged.items() if k in train_fields()})
    if tcfg.model not in MODEL_TYPES:
        raise ConfigError(f"unknown model {tcfg.model!r}; choose from {', '.join(MODEL_TYPES)}")
    fields = config_fields(tcfg.model)
    user_set = {**from_file, **flags}
    wrong = sorted(k for k in user_set if k in all_model_fields and k not in fields)
    if wrong:
        raise ConfigError(f"--model {tcfg.model} does not take "
                        + ", ".join("--" + k.replace("_", "-") for k in wrong))
    model_cfg = {k: v for k, v in merged.items() if k in fields and k != "vocab_size"}
    return tcfg, model_cfg, {"preset": args.preset, "config_file": args.config}


def saved_settings(out: Path) -> dict[str, Any] | None:
    """A run's own settings from its ``config.json``, so ``--resume`` needs no other flag."""
    import json

    path = out / "config.json"
    if not path.is_file():
        return None
    try:
        resolved = json.loads(path.read_text())
        model = {k: v for k, v in resolved["model"].items() if k not in ("type", "vocab_size")}
        return {**model, **resolved["train"], "dataset": resolved.get("dataset")}
    except (ValueError, KeyError, AttributeError, TypeError) as e:
        raise CheckpointError(f"{path}: not a scratchgpt run configuration ({e})") from None


def resolve_dataset(name_or_path: str | None, progress: bool = True):
    """A TokenDataset from a prepared directory, or a named dataset prepared into the cache."""
    from scratchgpt.data import sources
    from scratchgpt.data.dataset import TokenDataset
    from scratchgpt.data.prepare import META_FILE, prepare_text

    name = name_or_path or sources.DEFAULT_CORPUS
    path = Path(name)
    if path.is_dir():
        return TokenDataset(path), path.name
    if name not in sources.DATASETS and name != sources.DEFAULT_CORPUS:
        raise DataError(f"--dataset {name}: no such prepared dataset directory, and not a named "
                        f"dataset ({', '.join([*sources.DATASETS, sources.DEFAULT_CORPUS])})")
    kind = sources.DATASETS[name].tokenizer if name in sources.DATASETS else "char"
    target = sources.cache_dir() / "datasets" / f"{name}-{kind}"
    if not (target / META_FILE).is_file():
        from scratchgpt.commands.prepare import load_source

        text, desc = load_source(None, name)
        meta = prepare_text(text, target, kind, source=desc)
        if progress:
            print(f"prepared {desc}: {meta['train_tokens']:,} train / {meta['val_tokens']:,} "
                  f"val tokens in {target}")
    return TokenDataset(target), name


def _train_in_process(tcfg: Any, model_cfg: dict[str, Any], data_dir: Path, out: Path,
                      resume: bool, overwrite: bool, progress: bool,
                      extra: dict[str, Any]) -> Any:
    """One process of ``--nproc N``: open the dataset and train (picklable for spawn)."""
    from scratchgpt.data.dataset import TokenDataset
    from scratchgpt.training.trainer import train

    return train(tcfg, model_cfg, TokenDataset(data_dir), out, resume=resume,
                 overwrite=overwrite, progress=progress, extra_config=extra)


def run(args: argparse.Namespace) -> int:
    from scratchgpt.training import distributed
    from scratchgpt.training.trainer import preflight, train

    saved = saved_settings(Path(args.out)) if args.resume and args.out else None
    tcfg, model_cfg, sources_used = resolve_settings(args, saved)
    progress = not args.no_progress
    info = None
    if distributed.launched_by_torchrun():  # torchrun started us: one of its processes
        info = distributed.init_from_env(tcfg.device)
        if not info.is_main:
            distributed.dist.barrier()  # rank 0 prepares a named dataset first, alone
    data, name = resolve_dataset(args.dataset or (saved or {}).get("dataset"),
                                 progress=progress and (info is None or info.is_main))
    out = Path(args.out or Path("runs") / name)
    if info is not None:
        if info.is_main:
            distributed.dist.barrier()
        with distributed.process_group():
            result = train(tcfg, model_cfg, data, out, resume=args.resume,
                           overwrite=args.overwrite, progress=progress and info.is_main,
                           extra_config=sources_used)
        distributed.exit_process(_report(result, out) if info.is_main else 0)
    elif tcfg.nproc > 1:
        # Every check that can fail on bad input runs here, before any process starts, so a
        # mistake is one line and exit code 2 rather than N tracebacks.
        preflight(tcfg, model_cfg, data, out, args.resume, args.overwrite)
        result = distributed.launch(tcfg.nproc, tcfg.device, _train_in_process, tcfg, model_cfg,
                                    data.directory, out, args.resume, args.overwrite, progress,
                                    sources_used)
    else:
        result = train(tcfg, model_cfg, data, out, resume=args.resume, overwrite=args.overwrite,
                       progress=progress, extra_config=sources_used)
    return _report(result, out)


def _report(result: Any, out: Path) -> int:
    """Print how training ended; return the exit code (130 after Ctrl-C)."""
    if result.interrupted:
        print(f"interrupted at step {result.step}; saved {out / 'last.pt'} "
              f"(continue with --resume)")
        return 130
    print(f"done: {result.step} steps in {result.elapsed_s:.1f}s "
          f"({result.tokens_per_s:,.0f} tokens/s); train loss {result.train_loss:.4f}, "
          f"val loss {result.val_loss:.4f} (full val split); best {result.best_val_loss:.4f}")
    print(f"checkpoints, metrics.csv and loss.png in {out}")
    return 0
