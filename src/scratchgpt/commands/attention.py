"""``scratchgpt attention``: see where a GPT looks: its attention weights over a text, as heatmaps.

Each heatmap is one head of one layer: row i is the query of token i, column j the key of token
j, and the colour how much of token i's attention goes to token j (each row sums to 1; everything
above the diagonal is 0, because a GPT cannot look ahead). By default every layer x head appears
in one grid; --layer and/or --head narrow it (both: one large heatmap with the tokens written on
its axes).

Examples:
  scratchgpt attention --checkpoint runs/shakespeare --text "ROMEO: I" --out attn.png
  scratchgpt attention --checkpoint runs/gpt2 --text "The cat sat" --layer 5 --head 1 --out h.png
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scratchgpt.commands.argtypes import (
    add_unknown_flag,
    add_which_flag,
    encode,
    help_text,
    pick_index,
    thread_count,
)
from scratchgpt.errors import CheckpointError, ConfigError
from scratchgpt.wording import a_kind, plural


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("attention", help="plot a GPT's attention weights over a text",
                       description=help_text(__doc__),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True,
                   help="a GPT run directory, .pt file, Hugging Face GPT-2 directory, or "
                        "hf:ID for a hub model (hf:gpt2)")
    add_which_flag(p)
    p.add_argument("--text", required=True,
                   help="the text to read; only the first context-length tokens are plotted "
                        "if it is longer (a notice says so)")
    add_unknown_flag(p, "text")
    p.add_argument("--out", required=True, metavar="FILE.png",
                   help="figure to write (.png, .svg, .pdf ...)")
    p.add_argument("--overwrite", action="store_true", help="replace the --out file if it exists")
    p.add_argument("--layer", type=int, default=None,
                   help="only this layer (0 = first; negative counts from the last)")
    p.add_argument("--head", type=int, default=None,
                   help="only this head (0 = first; negative counts from the last)")
    p.add_argument("--threads", type=thread_count, default=0,
                   help="CPU threads for torch (0 = torch's default)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from scratchgpt.checkpoints import checkpoint_tokenizer, load_model
    from scratchgpt.models.gpt import GPT
    from scratchgpt.validation import FLAGS
    from scratchgpt.viz import attention_figure, check_figure_path, save_figure, token_labels

    check_figure_path(args.out, args.overwrite)  # refused before any work
    if not args.text:
        raise ConfigError("--text is empty; give the text whose attention to plot")
    if args.threads:
        torch.set_num_threads(args.threads)
    model, source = load_model(args.checkpoint, args.which, FLAGS)
    if not isinstance(model, GPT):
        raise CheckpointError(f"{args.checkpoint} holds {a_kind(source.model_type)} model; "
                              "attention plots need a GPT checkpoint")
    cfg = model.config
    layers = pick_index(args.layer, cfg.n_layer, "--layer")
    heads = pick_index(args.head, cfg.n_head, "--head")
    tok = checkpoint_tokenizer(source)
    ids = encode(tok, args.text, args.unknown)  # (a text has a token at least)
    cut = len(ids) > cfg.block_size
    if cut:
        print(f"note: the text has {len(ids)} tokens, the model's context {cfg.block_size}: "
              f"plotting the first {cfg.block_size}", file=sys.stderr)
        ids = ids[: cfg.block_size]
    with torch.inference_mode():
        _, per_layer = model.forward_with_attention(torch.tensor([ids]))  # L x (1, H, T, T)
    weights = torch.stack(per_layer)[:, 0].float()  # (L, H, T, T)
    weights = weights[layers][:, heads].numpy()  # (layers, heads, T, T)
    title = f"{Path(args.checkpoint).name}: {quoted(tok.decode(ids) if cut else args.text)}"
    fig = attention_figure(weights, token_labels(tok, ids), layers, heads, title)
    out = save_figure(fig, args.out)
    print(f"wrote {out}: {plural(len(layers), 'layer')} x {plural(len(heads), 'head')} over "
          f"{plural(len(ids), 'token')}")
    return 0


TITLE_CHARS = 60  # the characters of the text a figure's title shows; '...' marks the rest


def quoted(text: str) -> str:
    """The text plotted, quoted for the figure's title: the first TITLE_CHARS characters, and
    '...' where there are more (the title read as the whole text). Where the context cut the
    text, the caller passes the decoded tokens kept: the title showed the whole text over a
    figure of its first tokens alone."""
    return repr(text[:TITLE_CHARS]) + ("..." if len(text) > TITLE_CHARS else "")
