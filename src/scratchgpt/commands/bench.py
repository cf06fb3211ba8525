"""``scratchgpt bench NAME``: the benchmarks behind docs/BENCHMARKS.md.

Each benchmark is a module ``scratchgpt/bench/<name>.py`` with ``add_arguments(parser)`` and
``run(args) -> int``, and a one-line ``__doc__`` that becomes its help.
"""

from __future__ import annotations

import argparse
import importlib

from scratchgpt.commands.argtypes import help_text

BENCHMARKS = (
    "train",
    "sample",
    "tokenize",
    "seq2seq",
    "generate",
    "decode-step",
    "speculative",
    "recurrent",
    "finetune",
    "serve",
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="run a benchmark and print its figures",
                       description=help_text(__doc__.splitlines()[0]))
    names = p.add_subparsers(dest="bench", metavar="NAME", required=True)
    for name in BENCHMARKS:
        mod = importlib.import_module(f"scratchgpt.bench.{name.replace('-', '_')}")
        # the description as written (its lists and example commands one a line), as the
        # other commands' --help show theirs: reflowed, decode-step's two examples ran on as
        # one line
        bp = names.add_parser(name, help=help_text(mod.__doc__.strip().splitlines()[0]),
                              description=help_text(mod.__doc__),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(bp)
        bp.set_defaults(func=mod.run)
