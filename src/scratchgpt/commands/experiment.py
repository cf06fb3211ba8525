"""``scratchgpt experiment``: small, self-contained experiments.

  gpt-build  the GPT built one part at a time, as in "Let's build GPT": bigram, one attention
             head, several heads, + feed-forward, stacked blocks, + residuals, + LayerNorm,
             scaled up; each trained with the same data, budget and seed, then compared.
  memory     can the network recall the FIRST symbol of a sequence, by sequence length?
             A tanh RNN loses it as sequences grow (vanishing gradients); an LSTM keeps it.
  count      learn to count (predict the next number): the smallest end-to-end language model,
             then generation that carries the hidden state forward one token at a time.
"""

from __future__ import annotations

import argparse
import csv
import json
from typing import Any

from scratchgpt.bench import refuse_repeats
from scratchgpt.commands.argtypes import (
    finite_float,
    help_text,
    new_tokens,
    positive_int,
    results_dir,
    seed_int,
    thread_count,
)
from scratchgpt.commands.options import given
from scratchgpt.errors import ConfigError
from scratchgpt.validation import flag_of

MEMORY_CSV, MEMORY_SETTINGS, MEMORY_PNG = "memory.csv", "settings.json", "memory.png"
MEMORY_FILES = (MEMORY_CSV, MEMORY_SETTINGS, MEMORY_PNG)
COUNT_FILE = "count.json"
# what --quick sets itself, so a flag among them given beside it would be ignored
MEMORY_QUICK = {"steps", "eval_samples"}
THREADS_HELP = "torch CPU threads (default 1; 0: torch's own choice)"
BUILD_QUICK = {"time_budget", "max_iters", "scaled", "batch_size", "eval_interval", "eval_iters"}
# gpt-build's settings of the stages' training (each None unless given): --report trains nothing
BUILD_SHARED = {"block_size", "n_embd", "dropout", "weight_init", "learning_rate", "seed",
                "device", "threads"}
BUILD_DATASET = "shakespeare"


def refuse_with_quick(args: argparse.Namespace, names: set[str]) -> None:
    """``--quick`` with a flag among ``names`` (what it sets itself) is refused."""
    clash = sorted(given(args, names)) if args.quick else []
    if clash:
        flags = " and ".join(flag_of(n) for n in clash)
        raise ConfigError(f"--quick sets its own {flags}; drop --quick or {flags}")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("experiment",
                       help="small experiments: the GPT built step by step, RNN vs LSTM memory, "
                            "counting",
                       description=help_text(__doc__),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    kinds = p.add_subparsers(dest="experiment", metavar="NAME", required=True)
    _add_gpt_build(kinds)

    m = kinds.add_parser(
        "memory", help="recall the first symbol: RNN vs LSTM accuracy by sequence length",
        description="Train each network of --cells (default: a tanh RNN and an LSTM) to output "
                    "the first symbol of a random sequence after reading all of it (lengths "
                    "--min-len..--max-len), then write "
                    "accuracy by length as memory.csv and memory.png into --out, with the "
                    "settings that produced them in settings.json.")
    m.add_argument("--out", required=True, metavar="DIR",
                   help=f"folder for {', '.join(MEMORY_FILES)} (made if missing)")
    m.add_argument("--cells", nargs="+", choices=("rnn", "lstm", "gru"), default=["rnn", "lstm"],
                   help="which recurrent networks to compare (default: rnn lstm)")
    m.add_argument("--impl", choices=("torch", "scratch"), default="torch",
                   help="how the recurrence runs: 'torch' (its fused kernels, default) or "
                        "'scratch' (the cells of models/rnn.py written from their equations; "
                        "the same accuracies to float tolerance, several times slower)")
    m.add_argument("--min-len", type=positive_int, default=4,
                   help="shortest sequence length tested (default 4)")
    m.add_argument("--max-len", type=positive_int, default=20,
                   help="longest sequence length tested (default 20)")
    m.add_argument("--symbols", type=positive_int, default=8, help="alphabet size (default 8)")
    m.add_argument("--hidden", type=positive_int, default=64,
                   help="units in each network's hidden state (default 64)")
    m.add_argument("--steps", type=positive_int, default=None,
                   help="training steps per model (default 600)")
    m.add_argument("--forget-bias", type=finite_float, default=None,
                   help="initial LSTM forget-gate bias, -100 to 100 (default 1.0; torch's "
                        "init is ~0)")
    m.add_argument("--mixed", action="store_true",
                   help="train one model on all lengths at once instead of one model per length "
                        "(given more steps, e.g. --steps 3000, the short sequences then teach the "
                        "RNN what to keep, and it copes; in the default 600 it stays near "
                        "chance)")
    m.add_argument("--batch-size", type=positive_int, default=64,
                   help="sequences per training step (default 64)")
    m.add_argument("--learning-rate", "--lr", type=finite_float, default=3e-3,
                   help="Adam learning rate (default 3e-3)")
    m.add_argument("--eval-samples", type=positive_int, default=None,
                   help="test sequences per length (default 1000)")
    m.add_argument("--quick", action="store_true",
                   help="a few seconds: 20 steps, 100 test sequences (for smoke tests)")
    m.add_argument("--seed", type=seed_int, default=0,
                   help="seed for the data, the weights and the test sets (default 0)")
    m.add_argument("--threads", type=thread_count, default=1, help=THREADS_HELP)
    m.add_argument("--overwrite", action="store_true",
                   help=f"replace the results already in --out ({', '.join(MEMORY_FILES)})")
    m.set_defaults(func=run_memory)

    c = kinds.add_parser(
        "count", help="learn to count: next-number prediction with a recurrent LM",
        description="Train a small recurrent language model on sequences 'k k+1 k+2 ...' "
                    "(mod --modulus) and continue a prompt one token at a time.")
    c.add_argument("--out", required=True, metavar="DIR",
                   help=f"folder for the result, {COUNT_FILE}: the settings, the losses, the "
                        "accuracy and the generated numbers (made if missing)")
    c.add_argument("--cell", choices=("rnn", "lstm", "gru"), default="gru",
                   help="the recurrent cell (default gru)")
    c.add_argument("--modulus", type=positive_int, default=20,
                   help="numbers 0..N-1, then wrap (default 20)")
    c.add_argument("--steps", type=positive_int, default=300,
                   help="training steps (default 300)")
    c.add_argument("--hidden", type=positive_int, default=32,
                   help="units in the hidden state (default 32)")
    c.add_argument("--prompt", default=None,
                   help="numbers to continue (default '3 4 5', each modulo --modulus: '3 0 1' "
                        "for --modulus 4)")
    c.add_argument("--generate", type=new_tokens, default=10,
                   help="numbers to generate (default 10)")
    c.add_argument("--seed", type=seed_int, default=0,
                   help="seed for the data and the weights (default 0)")
    c.add_argument("--threads", type=thread_count, default=1, help=THREADS_HELP)
    c.add_argument("--overwrite", action="store_true",
                   help=f"replace the result already in --out ({COUNT_FILE})")
    c.set_defaults(func=run_count)


GPT_BUILD_HELP = """\
Train the eight stages of "Let's build GPT" one after the other, each with the same data,
batch, learning rate schedule, budget and seed, each into its own run directory under --out
(sample from any of them: scratchgpt sample --checkpoint DIR/2-one-head):

  1-bigram        a table of next-token logits
  2-one-head      one causal self-attention head of size 32 (no MLP, residual, LayerNorm)
  3-multi-head    4 heads of size 8
  4-feed-forward  + a ReLU feed-forward layer
  5-blocks        3 blocks stacked, without residual connections
  6-residual      + residual connections
  7-layernorm     + pre-LayerNorm
  8-scaled        a bigger model with dropout (--scaled cpu or lecture)

Then writes gpt_build.csv, gpt_build.md (the table, with the lecture's val losses beside) and
gpt_build.png (final val loss per stage, and val loss during training) into --out, reading
each finished stage from its run directory: a stage cut short by Ctrl-C and finished with
scratchgpt train --resume --out DIR/2-one-head is in the report of the next run, or of
--report, which writes the report of the stages in --out and trains nothing.

The budget is per stage: --time-budget (default 60s: equal wall time, which favours small
models), or --max-iters alone (equal steps, as in the lecture's 5000), or both (whichever ends
first)."""


def _add_gpt_build(kinds: argparse._SubParsersAction) -> None:
    g = kinds.add_parser(
        "gpt-build", help="the GPT built step by step: val loss per stage, as in the lecture",
        description=GPT_BUILD_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    g.add_argument("--out", required=True, metavar="DIR",
                   help="where the stages' run directories and the report go")
    g.add_argument("--dataset", metavar="NAME|DIR",
                   help="a prepared dataset directory, or a named dataset (default: "
                        f"{BUILD_DATASET}, character level; found in $SCRATCHGPT_DATA_DIR or the "
                        "cache, else downloaded; --report reads what it needs of the text "
                        "from the stages, and the dataset they record only where they do not "
                        "record it)")
    g.add_argument("--stages", nargs="+", metavar="STAGE",
                   help="train only these stages (numbers or names, e.g. 1 2 or one-head); "
                        "default: all eight. The report in --out keeps the stages finished "
                        "there before")
    g.add_argument("--time-budget", metavar="DURATION",
                   help="wall time per stage, e.g. 60s or 2m (default 60s unless --max-iters "
                        "is given)")
    g.add_argument("--max-iters", type=positive_int, help="optimizer steps per stage")
    g.add_argument("--scaled", choices=("cpu", "lecture"), default=None,
                   help="shape of stage 8: 'cpu' (4 layers x 4 heads, width 128, context 64: "
                        "trains in minutes on a CPU; default) or 'lecture' (6 x 6, width 384, "
                        "context 256, the lecture's GPU model)")
    g.add_argument("--weight-init", choices=("torch", "gpt2"),
                   help="initial weights of the GPT stages: 'torch' (PyTorch's defaults, as in "
                        "the lecture; default) or 'gpt2' (N(0, 0.02): without residuals and "
                        "LayerNorm the signal then fades through the layers)")
    g.add_argument("--dropout", type=float,
                   help="stage 8's dropout (default 0.2, the lecture's)")
    g.add_argument("--block-size", type=positive_int,
                   help="context of stages 1-7 (default 8, the lecture's)")
    g.add_argument("--n-embd", type=positive_int,
                   help="width of stages 2-7 (default 32, the lecture's)")
    g.add_argument("--batch-size", type=positive_int, default=None,
                   help="windows per step, every stage (default 32, the lecture's)")
    g.add_argument("--learning-rate", "--lr", type=finite_float,
                   help="AdamW peak learning rate of every stage, with a cosine down to a "
                        "tenth of it (default 1e-3, the lecture's)")
    g.add_argument("--eval-interval", type=positive_int, default=None,
                   help="steps between val-loss estimates (the curves of the plot; default "
                        "100)")
    g.add_argument("--eval-iters", type=positive_int, default=None,
                   help="batches per val-loss estimate (default 20)")
    g.add_argument("--seed", type=seed_int,
                   help="seed of every stage's weights and batches (default 1337)")
    g.add_argument("--device", choices=("auto", "cpu", "cuda"),
                   help="where to train: auto (a GPU if there is one; default), cpu or cuda")
    g.add_argument("--threads", type=thread_count,
                   help="torch CPU threads of every stage (default 1, as memory's and "
                        "count's: on a busy 2-core machine one thread took ten times as many "
                        "steps in a stage's budget as torch's own choice of two; 0: torch's "
                        "own choice, one per core)")
    g.add_argument("--overwrite", action="store_true",
                   help="replace the stages' runs already in --out")
    g.add_argument("--quick", action="store_true",
                   help="a smoke test, about a minute in all on a 2-core CPU: 20 steps per "
                        "stage and a tiny stage 8")
    g.add_argument("--report", action="store_true",
                   help="train nothing: write the report (gpt_build.csv, .md, .png) of the "
                        "stages finished in --out, e.g. one finished with scratchgpt train "
                        "--resume")
    g.add_argument("--no-progress", action="store_true", help="no progress bars")
    g.set_defaults(func=run_gpt_build)


def run_gpt_build(args: argparse.Namespace) -> int:
    from scratchgpt.data.resolve import resolve_dataset
    from scratchgpt.experiments import gpt_build

    if args.report:
        return _report_gpt_build(args, gpt_build)
    setup = _build_setup(args, gpt_build)
    # before the data is read (a named dataset may be downloaded)
    chosen = gpt_build.select(gpt_build.stages(setup), args.stages, "--stages")
    # (the report in --out is added to, not refused: no file of it is named here)
    out_dir = results_dir(args.out, (), args.overwrite)
    dataset = args.dataset or BUILD_DATASET
    data, _ = resolve_dataset(dataset, log=lambda line: print(line, flush=True))
    results = gpt_build.run(setup, data, out_dir, args.stages, args.overwrite,
                            progress=not args.no_progress,
                            log=lambda line: print(line, flush=True), dataset_name=dataset)
    if any(not r.interrupted for r in results):
        kept, other = gpt_build.on_dataset(gpt_build.recorded_results(out_dir), data)
        if other:  # (a build with --overwrite cut short: the stages it had yet to replace)
            on = gpt_build.trained_on(other[0].run_dir, data)
            what = ("the dataset's text before it was prepared again" if on == gpt_build.CHANGED
                    else f"another dataset ({on})")
            print(f"the report leaves out {', '.join(r.stage.name for r in other)}, trained "
                  f"on {what}")
        _write_build_report(gpt_build, kept, gpt_build.text_of(data), out_dir,
                            {r.stage.name for r in results})
    if results and results[-1].interrupted:  # (after the report of the stages before it)
        print(gpt_build.stopped_note(results[-1], chosen, out_dir))
    return results[-1].exit_code if results else 0


def _report_gpt_build(args: argparse.Namespace, gpt_build: Any) -> int:
    """``--report``: the report of the stages finished in ``--out`` (of ``--stages``), each
    read from its run directory; nothing trains."""
    from scratchgpt.data.resolve import resolve_dataset
    from scratchgpt.training.job import check_recorded_dataset

    clash = [flag_of(n) for n in sorted(given(args, BUILD_QUICK | BUILD_SHARED))]
    clash += [f"--{n}" for n in ("overwrite", "quick") if getattr(args, n)]
    if clash:
        raise ConfigError(f"--report writes the report of the stages in --out and trains "
                          f"nothing; drop {' and '.join(clash)}")
    chosen = gpt_build.select(gpt_build.stages(gpt_build.BuildSetup()), args.stages,
                              "--stages")
    out_dir = results_dir(args.out, (), overwrite=True)
    results = gpt_build.of_one_dataset(gpt_build.recorded_results(out_dir, chosen))
    if not results:
        raise ConfigError(f"--out {args.out} holds no finished stage to report; train them "
                          f"first: scratchgpt experiment gpt-build --out {args.out}")
    text = None if args.dataset else gpt_build.recorded_text(results)
    if text is None:  # (stages trained before they recorded their text: read the dataset)
        dataset = args.dataset or gpt_build.recorded_dataset(results) or BUILD_DATASET
        if not args.dataset:
            check_recorded_dataset(dataset, results[0].run_dir)
        data, _ = resolve_dataset(dataset, log=lambda line: print(line, flush=True))
        text = gpt_build.text_of(data)
    _write_build_report(gpt_build, results, text, out_dir, set())
    return 0


def _write_build_report(gpt_build: Any, results: list[Any], text: dict[str, Any],
                        out_dir: Any, trained: set[str]) -> None:
    """gpt_build.csv, .md and .png of ``results`` in ``out_dir``, the table printed too;
    ``text``: what the stages trained on (gpt_build.text_of); ``trained``: the stages this run
    trained (the others are said to be kept)."""
    earlier = [r.stage.name for r in results if r.stage.name not in trained]
    if earlier and trained:
        print(f"the report keeps {', '.join(earlier)} from earlier runs in {out_dir} (each "
              "with its own train command)")
    lecture, unit = gpt_build.lecture_label(text), gpt_build.loss_unit(text)
    paths = gpt_build.write_tables(results, out_dir, lecture, unit)
    png = gpt_build.plot(results, out_dir / "gpt_build.png", by_time=gpt_build.by_time(results),
                         unit=unit, lecture_text=gpt_build.lectures_text(text))
    print(gpt_build.markdown(results, lecture=lecture, unit=unit), end="")
    print(f"wrote {paths[0]}, {paths[1]} and {png}")


def _build_setup(args: argparse.Namespace, gpt_build: Any) -> Any:
    """The experiment's settings from the flags (``--quick``: its own budget and shapes; a
    setting not given: the experiment's default)."""
    refuse_with_quick(args, BUILD_QUICK)
    if args.dropout is not None and not 0.0 <= args.dropout < 1.0:
        raise ConfigError(f"--dropout must be in [0, 1), got {args.dropout}")
    if args.learning_rate is not None and args.learning_rate <= 0:
        raise ConfigError(f"--learning-rate must be positive, got {args.learning_rate}")
    shared = given(args, BUILD_SHARED)
    if args.quick:
        return gpt_build.quick_setup(**shared)
    budget = args.time_budget if args.time_budget else ("" if args.max_iters else "60s")
    setup = gpt_build.BuildSetup(**shared, **given(args, BUILD_QUICK - {"time_budget"}),
                                 time_budget=budget)
    setup.train_config()  # checks the budget and the rest now, before any data is read
    return setup


def run_memory(args: argparse.Namespace) -> int:
    import torch

    from scratchgpt.experiments import memory

    _check_memory_flags(args)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    steps, n_eval = (20, 100) if args.quick else (args.steps or 600, args.eval_samples or 1000)
    forget_bias = 1.0 if args.forget_bias is None else args.forget_bias
    setup = memory.MemorySetup(args.symbols, args.hidden, steps, args.batch_size,
                               args.learning_rate, forget_bias, n_eval, args.seed, args.impl)
    memory.check_fits(setup, args.cells, args.max_len)
    lengths = list(range(args.min_len, args.max_len + 1))
    out_dir = results_dir(args.out, MEMORY_FILES, args.overwrite)
    accuracy = memory.run(setup, args.cells, lengths, args.mixed,
                          log=lambda line: print(line, flush=True))
    settings = memory.recorded_settings(setup, args.cells, lengths, args.mixed, args.threads)
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / MEMORY_CSV, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["length", *args.cells])
        for i, t in enumerate(lengths):
            w.writerow([t, *(f"{accuracy[c][i]:.4f}" for c in args.cells)])
    (out_dir / MEMORY_SETTINGS).write_text(json.dumps(settings, indent=1) + "\n")
    memory.plot(out_dir / MEMORY_PNG, lengths, accuracy, args.symbols, memory.caption(settings))
    print(f"wrote {', '.join(str(out_dir / name) for name in MEMORY_FILES)}")
    return 0


def _check_memory_flags(args: argparse.Namespace) -> None:
    """The memory experiment's flags that cannot run together, refused before anything runs."""
    if args.min_len > args.max_len:
        raise ConfigError(f"--min-len {args.min_len} is larger than --max-len {args.max_len}")
    if args.symbols < 2:
        raise ConfigError("--symbols must be at least 2")
    refuse_repeats("--cells", args.cells)  # one column and one curve per cell
    refuse_with_quick(args, MEMORY_QUICK)
    if args.forget_bias is not None and "lstm" not in args.cells:  # a gate of LSTMs alone
        raise ConfigError(f"--forget-bias sets the LSTM's forget gate; --cells "
                          f"{' '.join(args.cells)} has no LSTM")


def count_prompt(text: str | None, n: int) -> list[int]:
    """``--prompt``'s numbers, each in [0, n); by default 3 4 5 modulo n (they were 3 4 5
    whatever n, refused below --modulus 6 though the user gave no prompt)."""
    if text is None:
        return [k % n for k in (3, 4, 5)]
    try:
        prompt = [int(tok) for tok in text.split()]
    except ValueError:
        raise ConfigError(f"--prompt must be numbers separated by spaces, got {text!r}"
                          ) from None
    if not prompt:
        raise ConfigError("--prompt is empty; give the numbers to continue from, e.g. "
                          f"--prompt '0 1 2' (each in [0, {n - 1}])")
    if any(not 0 <= k < n for k in prompt):
        raise ConfigError(f"--prompt needs numbers in [0, {n - 1}] (--modulus {n}), got {text!r}")
    return prompt


def run_count(args: argparse.Namespace) -> int:
    import torch

    from scratchgpt.experiments.count import continue_counting, recorded_settings, train_counter

    n = args.modulus
    if n < 2:
        raise ConfigError(f"--modulus must be at least 2 (numbers 0..N-1 to count), got {n}")
    prompt = count_prompt(args.prompt, n)
    out_dir = results_dir(args.out, (COUNT_FILE,), args.overwrite)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    model, metrics, first = train_counter(args.cell, n, args.hidden, args.steps, args.seed)
    generated = continue_counting(model, prompt, args.generate)
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = recorded_settings(args.cell, n, args.hidden, args.steps, args.seed, args.threads)
    result = {"settings": settings, "first_loss": first, "final_loss": metrics["val_loss"],
              "next_number_accuracy": metrics["next_number_accuracy"], "prompt": prompt,
              "generated": generated}
    (out_dir / COUNT_FILE).write_text(json.dumps(result, indent=1))
    print(f"loss {first:.3f} -> {metrics['val_loss']:.3f}; next-number accuracy "
          f"{metrics['next_number_accuracy']:.2%}")
    print(f"{' '.join(map(str, prompt))} -> {' '.join(map(str, generated))}")
    return 0
