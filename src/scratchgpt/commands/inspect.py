"""``scratchgpt inspect``: what does the model predict next, and what do the sampling knobs do?

Prints the most likely next tokens after --prompt with their probabilities under the model
itself (temperature 1, nothing cut) and under each --setting: temperature divides the logits
(below 1 sharpens the distribution, above 1 flattens it), top-k keeps the k most likely tokens,
top-p keeps the most likely tokens until their mass reaches p; whatever is kept is
renormalised. These are exactly the distributions 'scratchgpt sample' draws from. --out also
draws them, one panel per setting. Works for every language model type (GPT, bigram, RNN).

Examples:
  scratchgpt inspect --checkpoint runs/shakespeare --prompt "ROMEO:" --out next.png
  scratchgpt inspect --checkpoint runs/shakespeare --prompt "To be" --setting T=0.7,p=0.9 \\
      --setting k=5 --top 15
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from scratchgpt.commands.argtypes import (
    add_unknown_flag,
    add_which_flag,
    encode,
    figure_file,
    help_text,
    positive_int,
)
from scratchgpt.commands.prompts import note_long_prompts
from scratchgpt.wording import plural

DEFAULT_SETTINGS = ("T=0.5", "T=1.5", "k=10", "p=0.9")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="the most likely next tokens, and how temperature, "
                                       "top-k and top-p reshape them",
                       description=help_text(__doc__),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True,
                   help="run directory, .pt file, Hugging Face GPT-2 directory, or hf:ID "
                        "for a hub model (hf:gpt2)")
    add_which_flag(p)
    p.add_argument("--prompt", required=True,
                   help="the text before the predicted token (a GPT reads only its last "
                        "context-length tokens; a notice says so); empty: the first token "
                        "'sample' draws without a prompt, after the end-of-text token (a "
                        "newline for character models)")
    add_unknown_flag(p, "prompt")
    p.add_argument("--top", type=positive_int, default=10, metavar="N",
                   help="how many of the most likely tokens to list (default 10)")
    p.add_argument("--setting", action="append", default=None, metavar="SPEC",
                   help="a sampling setting to compare, e.g. T=0.7, k=40, p=0.9, "
                        "T=0.8,k=40,p=0.95 or greedy; repeat for several (default: "
                        f"{' '.join(DEFAULT_SETTINGS)})")
    p.add_argument("--out", default=None, metavar="FILE.png",
                   help="also draw the distributions, one panel per setting (.png, .svg ...)")
    p.add_argument("--overwrite", action="store_true", help="replace the --out file if it exists")
    p.add_argument("--json", action="store_true", help="print the figures as JSON instead")
    p.set_defaults(func=run)


def report(tok: Any, logits: Any, settings: list[Any], top: int) -> dict[str, Any]:
    """Every figure of the table: the top tokens and, per setting, their probabilities, how
    many tokens can still be drawn and the entropy."""
    from scratchgpt.generation.next_token import distributions, entropy, setting_label
    from scratchgpt.generation.sampling import SamplingConfig
    from scratchgpt.viz import token_labels

    names = ["model"] + [setting_label(cfg) for cfg in settings]
    probs = distributions(logits, [SamplingConfig(), *settings])  # (1 + S, vocab)
    order = probs[0].argsort(descending=True, stable=True)[:top].tolist()
    rest = probs.clone()
    rest[:, order] = 0  # the tokens not listed: 0 where a setting cut every one of them
    labels = token_labels(tok, order)
    rows = [{"rank": r + 1, "id": i, "token": tok.decode([i]), "label": labels[r],
             "probs": {n: float(probs[s, i]) for s, n in enumerate(names)}}
            for r, i in enumerate(order)]
    return {"settings": names, "vocab_size": int(probs.size(1)), "top": rows,
            "others": {n: float(rest[s].sum()) for s, n in enumerate(names)},
            "kept": {n: int((probs[s] > 0).sum()) for s, n in enumerate(names)},
            "entropy": {n: entropy(probs[s]) for s, n in enumerate(names)}}


def print_table(rep: dict[str, Any]) -> None:
    names = rep["settings"]
    widths = [max(7, len(n)) for n in names]
    tok_w = max(12, *(len(r["label"]) for r in rep["top"]))

    def line(rank: str, label: str, cells: list[str]) -> None:
        print(f"{rank:>4}  {label:<{tok_w}}"
              + "".join(f"  {c:>{w}}" for c, w in zip(cells, widths, strict=True)))

    line("rank", "token", names)
    for r in rep["top"]:
        line(str(r["rank"]), r["label"], [f"{r['probs'][n]:.4f}" for n in names])
    if len(rep["top"]) < rep["vocab_size"]:  # (--top of the whole vocabulary leaves none)
        line("", "(all others)", [f"{rep['others'][n]:.4f}" for n in names])
    line("", f"kept of {rep['vocab_size']}", [str(rep["kept"][n]) for n in names])
    line("", "entropy", [f"{rep['entropy'][n]:.3f}" for n in names])


def draw(rep: dict[str, Any], out: str) -> None:
    import math

    from scratchgpt.viz import distribution_figure, save_figure

    names = rep["settings"]
    panels = [(n, [r["probs"][n] for r in rep["top"]]) for n in names]
    notes = [f"{rep['kept'][n]} of {rep['vocab_size']} tokens kept, entropy "
             f"{rep['entropy'][n]:.2f} nats (like {math.exp(rep['entropy'][n]):.1f} "
             "equally likely)" for n in names]
    save_figure(distribution_figure([r["label"] for r in rep["top"]], panels, notes,
                                    [rep["others"][n] for n in names]), out)


def run(args: argparse.Namespace) -> int:
    from scratchgpt.checkpoints import checkpoint_tokenizer
    from scratchgpt.checkpoints.io import load_for_generation
    from scratchgpt.generation.next_token import next_token_logits, parse_setting, setting_label
    from scratchgpt.generation.prompt import start_of_text

    figure_file(args.out, args.overwrite, "--out")  # refused before any work
    settings = [parse_setting(s) for s in (args.setting or DEFAULT_SETTINGS)]
    # one column each: T=0 and greedy are one setting, as are k=0 and T=1, and their names,
    # the table's columns and the report's keys, would collide
    firsts: dict[str, Any] = {}
    for cfg in settings:
        firsts.setdefault(setting_label(cfg), cfg)
    settings = list(firsts.values())
    model, source = load_for_generation(args.checkpoint, args.which, "inspect")
    tok = checkpoint_tokenizer(source)
    ids, shown = encode(tok, args.prompt, args.unknown), args.prompt
    if not ids:  # where sample starts without a prompt
        ids = start_of_text(tok)[0]
        shown = tok.decode(ids)
    logits, used = next_token_logits(model, ids)
    note_long_prompts(model, [len(ids)])
    rep = report(tok, logits, settings, args.top)
    rep.update(prompt=args.prompt, model_type=source.model_type, tokens_read=used)
    if args.out:
        draw(rep, args.out)
    if args.json:
        print(json.dumps(rep, ensure_ascii=False))
        return 0
    print(f"next token after {shown[-40:]!r} ({source.model_type}, {plural(used, 'token')} read)")
    print_table(rep)
    if args.out:
        print(f"wrote {args.out}")
    return 0
