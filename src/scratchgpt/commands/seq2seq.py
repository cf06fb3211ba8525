"""``scratchgpt seq2seq``: train, run and inspect encoder-decoder models (translation-style tasks).

  train      train a Transformer / attention LSTM / plain LSTM on a generated task or a TSV file
  translate  decode sources with a trained checkpoint (greedy or beam search)
  eval       exact match on the held-out pairs, by source length
  attention  plot the cross-attention of one translation as a heatmap (source x target)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scratchgpt.commands.argtypes import (
    add_which_flag,
    finite_float,
    help_text,
    non_negative_int,
    pick_index,
    positive_int,
    thread_count,
)
from scratchgpt.commands.options import add_dataclass_flags, given, show_default
from scratchgpt.data.translation import TASKS
from scratchgpt.errors import (
    CheckpointError,
    ConfigError,
    DataError,
    GenerationError,
)
from scratchgpt.models.configs.seq2seq import ARCH_DEFAULTS, ARCHS, Seq2SeqConfig
from scratchgpt.training.config import LM_WINDOW_SETTINGS, TrainConfig, train_fields
from scratchgpt.training.seq2seq_defaults import DEFAULT_EVAL_PAIRS, DEFAULT_THREADS
from scratchgpt.validation import FLAGS, flag_of
from scratchgpt.wording import first_of, plural

if TYPE_CHECKING:
    from scratchgpt.training.seq2seq import Stopped

# Seq2SeqConfig fields that are not flags: the architecture has --arch, the rest comes from
# the data (vocabularies and the tokenizers' special ids).
NOT_FLAGS = {"arch", "src_vocab", "tgt_vocab", "pad_id", "bos_id", "eos_id", "unk_id"}
# TrainConfig fields that are not flags here: data-parallel processes (a seq2seq run is one
# process) and the language models' token-window curricula (a batch here is whole pairs)
NOT_TRAIN_FLAGS = {"nproc"} | LM_WINDOW_SETTINGS
# (old spelling, setting, type): accepted for one more release, hidden from --help
# (--lr is no longer among them: it is --learning-rate's short name everywhere)
OLD_SPELLINGS = (("--steps", "max_iters", int),
                 ("--warmup", "warmup_iters", int), ("--layers", "n_layer", int),
                 ("--heads", "n_head", int))


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "seq2seq", help="encoder-decoder models: train, translate, eval, attention plots",
        description=help_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    t = actions.add_parser(
        "train", help="train a model into a run directory",
        description="Train an encoder-decoder on (source, target) pairs on the training core "
                    "(progress bar, periodic held-out loss, metrics.csv, loss.png, last.pt / "
                    "best.pt, --resume, --time-budget, Ctrl-C saves), then report held-out "
                    f"exact match, of the first {DEFAULT_EVAL_PAIRS} held-out pairs unless "
                    "--eval-pairs. Without --max-iters a run lasts --time-budget (default "
                    "10m).")
    src = t.add_mutually_exclusive_group()
    src.add_argument("--task", choices=TASKS,
                     help="generated task: 'dates' (dates written many ways -> ISO, default) or "
                          "'numbers' (number words -> digits) or 'reverse' (10-60 letters -> "
                          "reversed, where the no-attention bottleneck shows)")
    src.add_argument("--data", metavar="FILE.tsv",
                     help="your own pairs, one 'source<TAB>target' per line (UTF-8)")
    t.add_argument("--arch", choices=ARCHS, default=None,
                   help="transformer (default), lstm-attention (Bahdanau), or lstm (no "
                        "attention: the fixed-size bottleneck)")
    t.add_argument("--out", required=True, metavar="DIR", help="run directory")
    t.add_argument("--resume", action="store_true", help="continue the run in --out exactly")
    t.add_argument("--overwrite", action="store_true",
                   help="replace a run already in --out (kept until the new one has written "
                        "its first checkpoint)")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--n-train", type=positive_int, default=None,
                   help="generated training pairs (tasks only; default 200000)")
    t.add_argument("--n-test", type=positive_int, default=None,
                   help="generated held-out pairs (tasks only; default 2000)")
    t.add_argument("--valid-fraction", type=float, default=None,
                   help="share of a TSV file's sources held out for evaluation (default 0.1)")
    t.add_argument("--label-smoothing", type=float, default=None,
                   help="cross-entropy label smoothing in [0, 1) (default 0)")
    t.add_argument("--eval-pairs", type=non_negative_int, default=None, metavar="N",
                   help="held-out pairs the final check decodes for its exact match, the "
                        f"first N (default {DEFAULT_EVAL_PAIRS}, a resumed run's own; 0 = all "
                        "of them); the run records N, which 'seq2seq eval' scores unless told "
                        "otherwise; the final held-out loss is over all of them either way")
    hp = t.add_argument_group("training (the settings of 'scratchgpt train', with seq2seq's "
                              "own defaults)")
    add_dataclass_flags(hp, TrainConfig, skip=NOT_TRAIN_FLAGS, shown=train_defaults_shown(),
                        helps=TRAIN_HELPS)
    mp = t.add_argument_group("model (defaults per --arch; a setting the --arch does not use "
                              "is refused)")
    add_dataclass_flags(mp, Seq2SeqConfig, skip=NOT_FLAGS, shown=arch_defaults_shown(),
                        helps=MODEL_HELPS)
    for old, dest, typ in OLD_SPELLINGS:  # spellings of an earlier release, still accepted
        t.add_argument(old, dest=dest, type=typ, default=None, help=argparse.SUPPRESS)
    t.add_argument("--unidirectional", dest="bidirectional", action="store_false",
                   default=None, help=argparse.SUPPRESS)
    t.set_defaults(func=run_train)

    tr = actions.add_parser("translate", help="decode sources with a checkpoint",
                            description="Translate one or more sources with a trained model: "
                                        "one translation a line, in the order of --source "
                                        "(or of the lines of --source-file), "
                                        f"printed {TRANSLATE_BATCH} sources at a time as they "
                                        "are decoded. Ctrl-C or SIGTERM keeps the lines "
                                        "printed and prints those of the batch it stopped, "
                                        "each as far as it was decoded (a note on stderr "
                                        "numbers the ones cut short), then exits 130 / 143.")
    _add_checkpoint(tr)
    given = tr.add_mutually_exclusive_group(required=True)
    given.add_argument("--source", action="append", metavar="TEXT",
                       help="text to translate (repeat for several)")
    given.add_argument("--source-file", metavar="FILE",
                       help="translate every line of FILE (UTF-8; - reads standard input), a "
                            "line out for each line in; an empty or blank line is refused")
    _add_decoding(tr, DEFAULT_MAX_LEN_HELP)
    tr.set_defaults(func=run_translate)

    e = actions.add_parser(
        "eval", help="held-out exact match by source length",
        description="Exact match on the held-out pairs the checkpoint was trained beside "
                    "(rebuilt from its data description): the first --eval-pairs of them, as "
                    "many as the run's final check scored unless given; or on --data FILE.tsv. "
                    f"Ctrl-C scores the pairs decoded so far, {TRANSLATE_BATCH} at a time.")
    _add_checkpoint(e)
    e.add_argument("--data", metavar="FILE.tsv", help="evaluate on all pairs of this file instead")
    e.add_argument("--eval-pairs", type=non_negative_int, default=None, metavar="N",
                   help="score the first N pairs (0 = all of them; default: as many held-out "
                        "pairs as the run's final check scored, its 'train --eval-pairs'; every "
                        "pair of a --data file)")
    # the spelling of an earlier release, still accepted: the first N pairs (N > 0)
    e.add_argument("--limit", dest="eval_pairs", type=positive_int, help=argparse.SUPPRESS)
    e.add_argument("--show-errors", type=non_negative_int, default=5, metavar="N",
                   help="print up to N mistakes, and how many more there are (default 5)")
    _add_decoding(e, "the longest target, plus 2: room for every target and its <eos>; at "
                     "most a transformer's --max-positions")
    e.set_defaults(func=run_eval)

    a = actions.add_parser(
        "attention", help="plot the cross-attention of one translation",
        description="Heatmap of the attention weights while translating --source: one row per "
                    "generated token, one column per source token (as in Bahdanau et al., 2015). "
                    "Transformer: last layer, mean over heads, unless --layer/--head (the title "
                    "names the layer and head drawn). A plain "
                    "--arch lstm model has no attention to draw.")
    _add_checkpoint(a)
    a.add_argument("--source", required=True, metavar="TEXT",
                   help="the sentence to translate and draw the attention of")
    a.add_argument("--out", required=True, metavar="FILE.png",
                   help="figure to write (.png, .svg, .pdf ...)")
    a.add_argument("--overwrite", action="store_true", help="replace the --out file if it exists")
    a.add_argument("--layer", type=int, help="transformer decoder layer (default: last; "
                                              "negative counts from the last)")
    a.add_argument("--head", type=int, help="transformer head (default: mean of heads; "
                                             "negative counts from the last)")
    _add_decoding(a, DEFAULT_MAX_LEN_HELP)
    a.set_defaults(func=run_attention)


# seq2seq's own words for settings whose 'scratchgpt train' help speaks of --nproc or tokens
TRAIN_HELPS = {
    "batch_size": "(source, target) pairs per optimizer micro-step",
    "threads": "CPU threads for torch (0 = torch's default: one per core; one is often "
               "several times faster for these small models, on a busy machine above all)",
}
MODEL_HELPS = {
    "d_model": "embedding and hidden width",
    "n_layer": "encoder layers and decoder layers, each",
    "n_head": "attention heads",
    "d_ff": "feed-forward hidden width",
    "dropout": "dropout probability while training",
    "bidirectional": "encoder reads the source both ways",
    "max_positions": "longest source or target the position table covers, in tokens",
}


def train_defaults_shown() -> dict[str, Any]:
    """The defaults of a new seq2seq run, as its --help states them."""
    from scratchgpt.training.seq2seq_defaults import (
        DEFAULT_BUDGET,
        MIN_LR_FRACTION,
        TRAIN_DEFAULTS,
    )

    return {**TRAIN_DEFAULTS,
            "max_iters": "none, the run lasts --time-budget",
            "time_budget": f"{DEFAULT_BUDGET} without --max-iters",
            "min_lr": f"{MIN_LR_FRACTION} x --learning-rate"}


def arch_defaults_shown() -> dict[str, str]:
    """Each model setting's default per architecture, e.g. ``64 (transformer), 128
    (lstm-attention, lstm)``; ``4 (transformer only)`` for a setting one architecture uses."""
    shown = {}
    for name in model_flag_names():
        by_value: dict[Any, list[str]] = {}
        for arch in ARCHS:
            if name in ARCH_DEFAULTS[arch]:
                by_value.setdefault(ARCH_DEFAULTS[arch][name], []).append(arch)
        if len(by_value) == 1 and len(next(iter(by_value.values()))) == len(ARCHS):
            shown[name] = show_default(next(iter(by_value)))
            continue
        only = " only" if len(by_value) == 1 else ""
        shown[name] = ", ".join(f"{show_default(v)} ({', '.join(archs)}{only})"
                                for v, archs in by_value.items())
    return shown


def _add_checkpoint(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, metavar="DIR",
                   help="run directory written by 'seq2seq train' (its best.pt, or see "
                        "--which)")
    add_which_flag(p)  # (train's report is of the final model: --which last gives it again)
    _add_threads(p)


def _add_threads(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=thread_count, default=DEFAULT_THREADS,
                   help=f"torch CPU threads (default {DEFAULT_THREADS}, as train's: often "
                        "several times faster than more on a busy machine; 0 = torch's "
                        "choice, one per core)")


DEFAULT_MAX_LEN = 64  # translate's and attention's longest output without --max-len
TRANSLATE_BATCH = 256  # sources translate (and eval) decode at a time, each batch printed once
# decoded (eval: scored, if Ctrl-C stops it)
DEFAULT_MAX_LEN_HELP = (f"{DEFAULT_MAX_LEN}, or a transformer's --max-positions where that is "
                        "fewer")


def _add_decoding(p: argparse.ArgumentParser, max_len_help: str) -> None:
    p.add_argument("--beam", type=positive_int, default=1, help="beam size (1 = greedy)")
    p.add_argument("--length-penalty", type=finite_float, default=None,
                   help="with --beam N > 1: beam score = log p / length**penalty (default 1)")
    p.add_argument("--max-len", type=positive_int, default=None,
                   help=f"longest output in tokens (default {max_len_help})")


def max_len(args: argparse.Namespace, model) -> int:
    """``--max-len``, or without it :data:`DEFAULT_MAX_LEN` outputs, as many as a
    transformer's position table holds where that is fewer (``train --max-positions 40``
    made a model that translate refused without a flag: '--max-len 64 exceeds ...')."""
    if args.max_len is not None:
        return args.max_len
    if model.config.arch == "transformer":
        return min(DEFAULT_MAX_LEN, model.config.max_positions)
    return DEFAULT_MAX_LEN


def run_train(args: argparse.Namespace) -> int:
    from scratchgpt.training import job, seq2seq
    from scratchgpt.validation import check_range

    check_range("--label-smoothing", args.label_smoothing, 0, 1, high_open=True)
    train_flags = given(args, train_fields() - NOT_TRAIN_FLAGS)
    model_flags = given(args, model_flag_names())
    spec = data_spec(args, train_flags.get("seed", seq2seq.TRAIN_DEFAULTS["seed"]))
    plan = seq2seq.plan(spec, args.arch, train_flags, model_flags, args.out, args.resume,
                        args.overwrite, args.label_smoothing, args.eval_pairs)
    # (said once every check has passed, the run's lock included: it printed a blank line
    # and the last summary)
    result = job.run(job.with_notes(plan, job.finished_note(plan)),
                     progress=not args.no_progress)
    if result.interrupted:
        print(f"stopped at step {result.step}; saved {plan.out / 'last.pt'} (continue with "
              f"--out {plan.out} --resume)")
        return result.exit_code
    if result.report:  # (none from a run resumed with nothing left to train)
        print(result.report)
    print(f"{plural(result.step, 'step')} in {result.elapsed_s:.0f}s; held-out loss "
          f"{result.val_loss:.4f}; run in {plan.out}")
    if result.best_val_loss < result.val_loss:  # best.pt is an earlier model than these figures
        print(f"note: these are the final model's figures (last.pt); best.pt, which translate, "
              f"eval and attention read unless --which last, is an earlier one (held-out loss "
              f"{result.best_val_loss:.4f} when saved)")
    return 0


DATA_FLAGS = ("task", "data", "n_train", "n_test", "valid_fraction")


def data_spec(args: argparse.Namespace, seed: int):
    """The pairs of a new run as a DataSpec (its defaults for the flags not given); None for a
    resumed run, which keeps its own pairs (a data flag given is refused)."""
    from scratchgpt.data.translation import DataSpec

    given_flags = {f: getattr(args, f) for f in DATA_FLAGS if getattr(args, f) is not None}
    if args.resume:
        if given_flags:
            flags = " ".join(flag_of(f) for f in given_flags)
            raise ConfigError(f"a resumed run keeps its pairs (drop {flags}, or start a new "
                              "run)")
        return None
    sizes = {f: v for f, v in given_flags.items() if f not in ("task", "data")}
    wrong = [f for f in sizes if (f == "valid_fraction") != bool(args.data)]
    if wrong:  # a flag for the other kind of pairs would change nothing
        raise ConfigError(f"{flag_of(wrong[0])} applies to "
                          f"{'generated tasks' if args.data else 'a --data file'} only")
    # the file's absolute path: eval and --resume read it again, from any directory
    path = str(Path(args.data).resolve()) if args.data else None
    return DataSpec(task=None if args.data else (args.task or "dates"), path=path, seed=seed,
                    **sizes)


def model_flag_names() -> set[str]:
    import dataclasses

    return {f.name for f in dataclasses.fields(Seq2SeqConfig)} - NOT_FLAGS


def _load(args: argparse.Namespace):
    """(model, source tokenizer, target tokenizer, what the run records of its data: its
    pairs' DataSpec under 'seq2seq', 'eval_pairs', ...) of a seq2seq run."""
    import torch

    from scratchgpt.checkpoints import load_model

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    check_run_path(args.checkpoint)
    model, source = load_model(args.checkpoint, args.which, FLAGS)
    ckpt = source.checkpoint
    if ckpt is None or ckpt.model_type != "seq2seq":
        raise CheckpointError(f"{args.checkpoint} does not hold a seq2seq model ({TRAIN_ONE})")
    return model, ckpt.tokenizer("source"), ckpt.tokenizer("target"), ckpt.data


TRAIN_ONE = "train one with 'scratchgpt seq2seq train --out DIR'"


def check_run_path(path: str) -> None:
    """``--checkpoint`` names what a seq2seq run can be: no Hugging Face model (GPT-2 language
    models; ``hf:gpt2`` was downloaded before it was refused), and a path that does not
    exist, or a prepared dataset, are told how a seq2seq model is made (the checkpoint
    readers' refusals said a hub model is ``hf:NAME`` and to train one with 'scratchgpt train
    --dataset', neither of which gives a seq2seq model)."""
    from scratchgpt.checkpoints.hf import is_hf_dir
    from scratchgpt.checkpoints.hub import HF_PREFIX
    from scratchgpt.data.prepare import is_dataset

    run = Path(path)
    if path.startswith(HF_PREFIX) or is_hf_dir(run):
        raise CheckpointError(f"{path} is a Hugging Face model, a GPT-2 language model; "
                              f"seq2seq reads a run of 'scratchgpt seq2seq train' ({TRAIN_ONE})")
    if not run.exists():
        raise CheckpointError(f"checkpoint {path} does not exist ({TRAIN_ONE})")
    if is_dataset(run):
        raise CheckpointError(f"{path} holds a prepared dataset, not a model; seq2seq trains "
                              f"on pairs, --task or --data FILE.tsv ({TRAIN_ONE})")
    if (run / "seq2seq.pt").is_file() and not (run / "last.pt").is_file():
        raise CheckpointError(f"{path} was written by an earlier scratchgpt (seq2seq.pt); "
                              "train it again with 'scratchgpt seq2seq train'")


def length_penalty(args: argparse.Namespace) -> float:
    """``--length-penalty``, which only beam search reads: refused with greedy decoding
    (``--beam 1``, the default), where it was taken and changed nothing."""
    if args.length_penalty is None:
        return 1.0
    if args.beam == 1:
        raise ConfigError("--length-penalty scores beam search's hypotheses; it goes with "
                          "--beam N > 1 (--beam 1 is greedy)")
    return args.length_penalty


def run_translate(args: argparse.Namespace) -> int:
    from scratchgpt.training.seq2seq import translate_batches

    penalty = length_penalty(args)
    check_not_blank(args.source or [])
    sources = args.source or read_sources(args.source_file)
    model, src_tok, tgt_tok, _ = _load(args)
    note_unseen(src_tok, sources)
    longest = max_len(args, model)
    done: list[list[int]] = []  # the token ids of the translations printed
    cut: list[Stopped] = []  # what the batch a stop cuts had decoded
    try:
        for texts, ids, _ in translate_batches(model, sources, src_tok, tgt_tok, args.beam,
                                               longest, TRANSLATE_BATCH, penalty, cut):
            print(*texts, sep="\n", flush=True)
            done += ids
    except KeyboardInterrupt:  # what was printed stays; the rest was never decoded
        _print_stopped(done, cut, len(sources), model.config.eos_id, longest)
        raise
    note_cut(done, len(sources), model.config.eos_id, longest)
    return 0


def check_not_blank(sources: list[str]) -> None:
    """A ``--source`` of whitespace alone is refused, as an empty one is: it was decoded into
    whatever the model writes for nothing, with no word."""
    blank = next((n for n, s in enumerate(sources, start=1) if s and not s.strip()), None)
    if blank is not None:
        which = "the source" if len(sources) == 1 else f"source {blank} of {len(sources)}"
        raise GenerationError(f"{which} is blank (whitespace only); give text to translate")


def read_sources(name: str) -> list[str]:
    """The lines of ``--source-file`` (``-``: standard input), read as every file a user
    names is (:func:`~scratchgpt.data.sources.read_text_file`); an empty line is refused by
    its number, as each line in is a line out (skipped, it would pair every later output
    with the wrong source), and so is a blank one (whitespace alone)."""
    from scratchgpt.data.sources import STDIN, read_text_file, text_lines

    lines = text_lines(read_text_file(name, "source file")[0])
    where = "standard input" if name == STDIN else f"source file {name}"
    if not lines:
        raise DataError(f"{where} has no line to translate")
    empty = next((n for n, line in enumerate(lines, start=1) if not line.strip()), None)
    if empty is not None:
        what = "blank line (whitespace only)" if lines[empty - 1] else "empty line"
        raise DataError(f"{where}, line {empty}: {what}; each line is a source to "
                        "translate (remove the empty and blank lines)")
    return lines


def _print_stopped(done: list[list[int]], cut: list[Stopped], total: int, eos_id: int,
                   longest: int) -> None:
    """After a stop: the lines of the batch it cut, as far as they were decoded (the ended
    ones whole: they were lost with the rest of the batch), and the notes numbering the
    translations cut short, by --max-len or by the stop, and saying how many were whole."""
    if cut:
        print(*(c.text for c in cut), sep="\n", flush=True)
    note_cut(done + [c.ids for c in cut if c.whole], total, eos_id, longest)
    stopped = [n for n, c in enumerate(cut, start=len(done) + 1) if not c.whole]
    _note_numbers(stopped, total, "cut short by the stop")
    print(f"note: translated {len(done) + len(cut) - len(stopped)} of "
          f"{plural(total, 'source')} before the stop", file=sys.stderr)  # (ungrouped, as the
    # numbers of the notes before)


def note_cut(ids: list[list[int]], total: int, eos_id: int, longest: int) -> None:
    """A note (stderr) numbering the translations of ``ids`` (the first of ``total``) that ran
    out of ``--max-len`` before ``<eos>``: printed as if finished, they looked complete."""
    cut = [n for n, row in enumerate(ids, start=1) if not _ended(row, eos_id)]
    _note_numbers(cut, total, f"cut at --max-len {longest}, before <eos>")


NUMBERS_SHOWN = 5  # the numbers a note lists; the rest are counted


def _note_numbers(numbers: list[int], total: int, what: str) -> None:
    """A note (stderr) that translations ``numbers`` (counted from 1) of ``total`` were
    ``what``: 'note: translations 2, 5 of 10 were cut ...', the first NUMBERS_SHOWN of them
    and how many more ('1, 2, 3, 4, 5 and 40 more of 300'); nothing for no numbers."""
    if numbers:
        shown = first_of([str(n) for n in numbers], NUMBERS_SHOWN)  # (a batch can cut 256)
        which = ("the translation was" if total == 1 else
                 f"translation {shown} of {total} was" if len(numbers) == 1 else
                 f"translations {shown} of {total} were")
        print(f"note: {which} {what}", file=sys.stderr)


def _ended(ids: list[int], eos_id: int) -> bool:
    """The decoded ``ids`` end in ``<eos>``: the output is whole, not cut at ``--max-len``."""
    return bool(ids) and ids[-1] == eos_id


def note_unseen(tok, texts: list[str], side: str = "source",
                what: str = "the model never saw, read as <unk>") -> None:
    """A note (stderr) naming the characters of ``texts`` that ``tok`` never saw in training:
    in sources they are read as ``<unk>``, which the translation cannot carry over; ``side``
    and ``what`` word it for the other side (targets: characters no output of the model
    holds)."""
    unseen = sorted({c for text in texts for c in text if c not in tok.stoi})
    if unseen:
        shown = " ".join(repr(c) for c in unseen[:10]) + (" ..." if len(unseen) > 10 else "")
        print(f"note: {plural(len(unseen), f'{side} character')} {what}: {shown}",
              file=sys.stderr)


def run_eval(args: argparse.Namespace) -> int:
    from scratchgpt.data.translation import header_note, read_tsv
    from scratchgpt.training.seq2seq import evaluate, format_eval, score, subset_note

    penalty = length_penalty(args)
    model, src_tok, tgt_tok, data = _load(args)
    all_pairs = read_tsv(args.data) if args.data else _held_out(args.checkpoint, data)
    n, whose = eval_count(args.eval_pairs, None if args.data else data.get("eval_pairs"))
    pairs = all_pairs[:n] if n else all_pairs
    if args.data and (note := header_note(all_pairs, args.data)):
        print(note, file=sys.stderr)
    # pairs of another kind than the training's scored 0% with no word why
    note_unseen(src_tok, [src for src, _ in pairs])
    note_unseen(tgt_tok, [tgt for _, tgt in pairs], "target", "the model never wrote in "
                "training (a target holding one cannot be matched)")
    what = f"pairs of {args.data}" if args.data else "held-out pairs"
    decoded: list[str] = []  # the outputs of the pairs decoded so far
    try:
        ev = evaluate(model, pairs, src_tok, tgt_tok, beam=args.beam, max_len=args.max_len,
                      length_penalty=penalty, batch_size=TRANSLATE_BATCH, decoded=decoded)
    except KeyboardInterrupt:  # the batches decoded are scored, not lost
        if decoded:
            print(format_eval(score(pairs[: len(decoded)], decoded)))
            print(subset_note(len(decoded), len(all_pairs), what, "decoded before the stop"),
                  flush=True)
        raise
    print(format_eval(ev))
    if len(pairs) < len(all_pairs):
        print(subset_note(len(pairs), len(all_pairs), what, whose))
    show_errors(pairs, ev.predictions, args.show_errors)
    return 0


def show_errors(pairs: list[tuple[str, str]], predictions: list[str], shown: int) -> None:
    """The first ``shown`` mistakes, source -> output (expected target), and how many more
    there are: the list stopped at --show-errors with no word that it had."""
    errors = [(s, t, p) for (s, t), p in zip(pairs, predictions, strict=True) if p != t]
    for s, t, p in errors[:shown]:
        print(f"  {s!r} -> {p!r} (expected {t!r})")
    if 0 < shown < len(errors):
        print(f"  ... and {plural(len(errors) - shown, 'more mistake', grouped=True)} "
              "(--show-errors N shows more)")


def _held_out(checkpoint: str, data: dict[str, Any]) -> list[tuple[str, str]]:
    """The held-out pairs of the run in ``checkpoint``, rebuilt from its recorded ``data``."""
    from scratchgpt.data.translation import DataSpec

    spec = data.get("seq2seq")
    if spec is None:
        raise CheckpointError(f"{checkpoint}: the run does not record what it was "
                              "trained on; pass --data FILE.tsv")
    if spec.get("path") and not Path(spec["path"]).is_file():
        raise CheckpointError(f"the pairs the run was trained on, {spec['path']}, are no "
                              "longer there; pass --data FILE.tsv")
    return DataSpec(**spec).load()[1]


def eval_count(given: int | None, recorded: int | None) -> tuple[int, str]:
    """(pairs eval scores, the first so many, 0 for all; whose number it is, for the note of
    a subset): ``--eval-pairs`` as given, else the run's recorded ``train --eval-pairs`` (the
    held-out pairs its final check scored: eval scored all of them, other figures than the
    run's report), else all (a --data file, or a run from before runs recorded it)."""
    if given is not None:
        return given, "--eval-pairs"
    if recorded:
        return recorded, (f"as many as the run's final check scored ('train --eval-pairs "
                          f"{recorded}'); --eval-pairs 0 scores them all")
    return 0, ""


def run_attention(args: argparse.Namespace) -> int:
    from scratchgpt.viz import alignment_figure, check_figure_path, save_figure, visible

    check_figure_path(args.out, args.overwrite)  # refused before any work
    penalty = length_penalty(args)
    check_not_blank([args.source])

    from scratchgpt.models.seq2seq import TransformerSeq2Seq
    from scratchgpt.training.seq2seq import translate

    model, src_tok, tgt_tok, _ = _load(args)
    if model.config.arch == "lstm":  # its decoder reads one summary of the source
        raise ConfigError(f"{args.checkpoint} is a plain lstm encoder-decoder, which has no "
                          "attention to draw; train --arch lstm-attention or transformer")
    drawn = _attention_drawn(args, model) if isinstance(model, TransformerSeq2Seq) else ""
    if not drawn and (args.layer is not None or args.head is not None):
        raise ConfigError("--layer/--head only apply to transformer checkpoints")

    note_unseen(src_tok, [args.source])
    longest = max_len(args, model)
    texts, ids, attn = translate(model, [args.source], src_tok, tgt_tok, args.beam, longest,
                                 length_penalty=penalty)
    weights = attn[0].numpy()  # [target tokens, source tokens]
    src_labels = [visible(c) if src_tok.stoi.get(c) is not None else "<unk>"
                  for c in args.source] + ["<eos>"]
    tgt_labels = [visible(t) for t in tgt_tok.token_strings(ids[0])]
    fig = alignment_figure(weights, src_labels, tgt_labels,
                           f"{model.config.arch}{drawn}: {args.source!r} -> {texts[0]!r}")
    out = save_figure(fig, args.out, dpi=120)
    cut = "" if _ended(ids[0], model.config.eos_id) else \
        f" (cut at --max-len {longest}, before <eos>)"
    print(f"{args.source!r} -> {texts[0]!r}{cut}")
    print(f"wrote {out}: {len(tgt_labels)} output x {plural(len(src_labels), 'source token')}")
    return 0


def _attention_drawn(args: argparse.Namespace, model: Any) -> str:
    """Point a transformer's reported cross-attention at ``--layer`` and ``--head`` (default:
    the last layer, the mean of its heads) and say which it is, for the figure's title: the
    figures of two layers or heads had the same title, and nothing told them apart."""
    cfg = model.config
    layer = pick_index(-1 if args.layer is None else args.layer, cfg.n_layer, "--layer")[0]
    model.attn_layer = layer
    if args.head is not None:
        model.attn_head = pick_index(args.head, cfg.n_head, "--head")[0]
    heads = (f"mean of {plural(cfg.n_head, 'head')}" if args.head is None
             else f"head {model.attn_head}")
    return f", decoder layer {layer}, {heads}"
