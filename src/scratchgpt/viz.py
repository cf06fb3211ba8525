"""Figures for looking inside a model (attention heatmaps, next-token distributions) and at runs.

The functions here take plain numbers and strings (no models, no tokenizers beyond
:func:`token_labels`), draw with matplotlib's file-only ``Agg`` backend and return the figure;
:func:`save_figure` writes it (:func:`check_figure_path`, which it applies, lets a command
refuse a path it cannot write to before its work). Token labels are made readable first: a
space shows as ``␣``, a newline as ``↵``, a tab as ``⇥``, other control characters as escapes,
so that ``" the"`` and ``"the"`` look different on an axis.

* :func:`heatmap` draws one weight matrix on an axis, labels on both axes (usable for any
  query x key attention: a GPT head, an encoder-decoder's cross-attention).
* :func:`attention_figure` lays out many heads: a grid of layers x heads, or one head large.
* :func:`alignment_figure` draws an encoder-decoder's cross-attention, output x source.
* :func:`distribution_figure` shows how sampling settings reshape a next-token distribution.
* :func:`context_loss_figure` draws a model's loss against the context it had (``scratchgpt
  eval --plot``).
* :func:`confusion_figure` draws a classifier's confusion matrix (:func:`plot_confusion` saves
  it, written through a temporary file).
* :func:`time_curves_figure` draws several runs' loss against wall-clock seconds (the training
  speedrun's picture), :func:`running_mean` smooths a noisy curve for it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from scratchgpt.errors import ConfigError
from scratchgpt.validation import file_target_problem
from scratchgpt.wording import plural

VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥"}


def visible(text: str) -> str:
    """``text`` with whitespace and control characters shown: ``visible(" a\\n") == "␣a↵"``."""
    out = []
    for ch in text:
        if ch in VISIBLE:
            out.append(VISIBLE[ch])
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(ascii(ch)[1:-1])  # e.g. '\r', '\x00', '\u200b'
    return "".join(out) or "∅"


def token_labels(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """A readable label for each token id. A byte-level token that holds only part of a
    multi-byte character (it decodes to U+FFFD alone) is shown as its bytes, e.g. ``\\xe2\\x80``."""
    labels = []
    for i in ids:
        text = tokenizer.decode([i])
        if "\ufffd" in text and hasattr(tokenizer, "token_bytes"):
            text = tokenizer.token_bytes(i).decode("utf-8", errors="backslashreplace")
        labels.append(visible(text))
    return labels


def pyplot():
    """matplotlib's ``pyplot`` on the file-only ``Agg`` backend (no window, no display), or on
    the inline backend a Jupyter kernel selects, so that figures show in notebooks too."""
    import matplotlib

    if "inline" not in os.environ.get("MPLBACKEND", ""):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # matplotlib warns of a character its font lacks once per character and drawing, from
    # wherever the text is laid out: save_figure says it in one line instead.
    warnings.filterwarnings("ignore", message="Glyph .* missing from font", module="scratchgpt")
    return plt


@contextlib.contextmanager
def literal_text() -> Iterator[None]:
    """Text made inside (on a function: in its figure) is drawn as written. matplotlib reads
    text between two ``$`` as math: a token, class label or prompt such as ``$$`` or
    ``$\\frac$`` was a ParseException where the figure was laid out, and ``$x$`` lost its
    dollars. Each text keeps the setting it was made with, so the figure saves as it was
    drawn wherever it is saved (a notebook's other figures are left as they were)."""
    import matplotlib

    with matplotlib.rc_context({"text.parse_math": False}):
        yield


GENERIC = ("serif", "sans-serif", "cursive", "fantasy", "monospace")


def _fonts(prop: Any) -> list[Any]:
    """The fonts matplotlib draws text of ``prop`` with: each of its families that is
    installed (a generic one, such as sans-serif, expanded as the rc settings list it), in
    order, and what :func:`findfont` picks for ``prop`` (its default when none is)."""
    import matplotlib
    from matplotlib import font_manager

    paths = []
    for family in prop.get_family():
        generic = "sans-serif" if family == "sans" else family
        names = matplotlib.rcParams[f"font.{generic}"] if generic in GENERIC else [family]
        for name in names:
            one = prop.copy()
            one.set_family(name)
            with contextlib.suppress(ValueError):  # not installed
                paths.append(font_manager.findfont(one, fallback_to_default=False))
    paths.append(font_manager.findfont(prop))
    return [font_manager.get_font(path) for path in dict.fromkeys(paths)]


def missing_glyphs(fig: Any) -> list[str]:
    """The characters of ``fig``'s visible text that none of its fonts has (drawn as boxes),
    each once."""
    from matplotlib.text import Text

    missing: dict[str, None] = {}
    fonts: dict[Any, list[Any]] = {}
    for text in fig.findobj(Text):
        if not text.get_visible():
            continue
        prop = text.get_fontproperties()
        for ch in text.get_text():
            if ch in missing or not ch.isprintable() or ch.isspace() or ch.isascii():
                continue
            if prop not in fonts:
                fonts[prop] = _fonts(prop)
            if all(font.get_char_index(ord(ch)) == 0 for font in fonts[prop]):
                missing[ch] = None
    return list(missing)


def note_missing_glyphs(fig: Any, path: str | Path) -> None:
    """One line on stderr when some of ``fig``'s characters will show as boxes in the figure
    written to ``path`` (a command may write several)."""
    missing = missing_glyphs(fig)
    if missing:
        shown = " ".join(missing[:10]) + (" ..." if len(missing) > 10 else "")
        one = len(missing) == 1
        print(f"note: {plural(len(missing), 'character')} {'has' if one else 'have'} no glyph "
              f"in the font of {path} and {'shows' if one else 'show'} as boxes: {shown}",
              file=sys.stderr)


TICK_POINTS = (5.0, 10.0)  # the smallest and largest font size of a figure's tick labels


def _tick_size(n: int, inches: float) -> float:
    """Font size for ``n`` tick labels along an axis ``inches`` long: what the room each label
    has allows (a line of text and a little space: its points / 1.4), within
    :data:`TICK_POINTS`. (It was 160 / n points whatever the axis: a 51-character source was
    labelled in 5 pt across a figure 16 inches wide.)

    >>> _tick_size(52, 13.5), _tick_size(52, 4.0), _tick_size(3, 2.0)
    (10.0, 5.0, 10.0)
    """
    least, most = TICK_POINTS
    return max(least, min(most, inches * 72.0 / max(n, 1) / 1.4))


def _axes_inches(ax: Any) -> tuple[float, float]:
    """The width and height of ``ax`` in inches, as laid out when asked."""
    box, (width, height) = ax.get_position(), ax.get_figure().get_size_inches()
    return box.width * width, box.height * height


def heatmap(ax: Any, weights: Any, x_labels: Sequence[str], y_labels: Sequence[str], *,
            cmap: str = "viridis", vmax: float | None = 1.0, show_x: bool = True,
            show_y: bool = True, every: tuple[int, int] = (1, 1)) -> Any:
    """Draw ``weights`` (rows x columns, e.g. queries x keys) on ``ax`` with the labels as ticks
    (every ``every[0]``-th column's and ``every[1]``-th row's, from the first).

    Single characters stay upright; longer labels on the x axis turn vertical. ``vmax`` None
    scales the colours to the largest weight. Returns the image (for a colour bar)."""
    xs, ys = range(0, len(x_labels), every[0]), range(0, len(y_labels), every[1])  # labelled
    width, height = _axes_inches(ax)
    image = ax.imshow(weights, cmap=cmap, vmin=0.0, vmax=vmax, aspect="auto",
                      interpolation="nearest")
    ax.set_xticks(xs, [x_labels[i] for i in xs] if show_x else [""] * len(xs),
                  fontsize=_tick_size(len(xs), width))
    for label in ax.get_xticklabels():
        label.set_rotation(90 if len(label.get_text()) > 1 else 0)
    ax.set_yticks(ys, [y_labels[i] for i in ys] if show_y else [""] * len(ys),
                  fontsize=_tick_size(len(ys), height))
    ax.tick_params(length=0)
    return image


@literal_text()
def attention_figure(weights: Any, labels: Sequence[str], layers: Sequence[int],
                     heads: Sequence[int], title: str = "") -> Any:
    """Attention weights ``(len(layers), len(heads), T, T)`` (query rows, key columns) as a
    figure: one large heatmap with a colour bar when a single head is given, otherwise a grid
    with a row per layer and a column per head (see :func:`_attention_grid`)."""
    plt = pyplot()
    n_rows, n_cols, t = len(layers), len(heads), len(labels)
    if n_rows == n_cols == 1:
        side = min(14.0, max(4.0, 0.3 * t + 2.0))
        fig, ax = plt.subplots(figsize=(side + 1.0, side))
        image = heatmap(ax, weights[0][0], labels, labels)
        ax.set_xlabel("key: the token attended to")
        ax.set_ylabel("query: the token attending")
        ax.set_title(f"layer {layers[0]}, head {heads[0]}")
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="attention weight")
    else:
        fig = _attention_grid(plt, weights, labels, layers, heads)
    if title:
        fig.suptitle(title, fontsize=10)
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    return fig


def _attention_grid(plt: Any, weights: Any, labels: Sequence[str], layers: Sequence[int],
                    heads: Sequence[int]) -> Any:
    """:func:`attention_figure`'s grid of layers x heads: tick labels, and what the axes are,
    on the outer axes only, and one colour bar for all (every heatmap shares the scale 0..1).
    Laid out by matplotlib's constrained layout, which makes room for the shared bar."""
    n_rows, n_cols, t = len(layers), len(heads), len(labels)
    side = min(4.0, max(1.6, 0.16 * t + 0.6))
    fig, axes = plt.subplots(n_rows, n_cols, squeeze=False, layout="constrained",
                             figsize=(side * n_cols + 1.6, side * n_rows + 1.2))
    for r, layer in enumerate(layers):
        for c, head in enumerate(heads):
            ax = axes[r][c]
            image = heatmap(ax, weights[r][c], labels, labels, show_x=r == n_rows - 1,
                            show_y=c == 0)
            ax.set_title(f"layer {layer}, head {head}", fontsize=8)
            if r == n_rows - 1:
                ax.set_xlabel("key (attended to)", fontsize=8)
            if c == 0:
                ax.set_ylabel("query (attending)", fontsize=8)
    bar = fig.colorbar(image, ax=axes, shrink=0.9 if n_rows > 1 else 1.0,
                       aspect=max(20, 12 * n_rows), label="attention weight")
    bar.ax.tick_params(labelsize=8)
    return fig


@literal_text()
def alignment_figure(weights: Any, source: Sequence[str], output: Sequence[str],
                     title: str = "") -> Any:
    """An encoder-decoder's cross-attention ``(len(output), len(source))`` as a figure: a row
    per output token, its weights over the source tokens, with a colour bar, in the colours
    of :func:`attention_figure`. A long ``title`` (a translation) wraps to the figure's
    width. The figure grows with the tokens up to :data:`ALIGNMENT_MAX_INCHES`, and an axis
    with more tokens than can be read there labels every k-th (a source of 480 characters
    drew a 20,502 x 12,744 PNG in 1m45s, its labels as many as its tokens)."""
    import textwrap

    plt = pyplot()
    most_w, most_h = ALIGNMENT_MAX_INCHES
    width = min(most_w, max(4.0, 0.35 * len(source) + 2.5))
    height = min(most_h, max(3.0, 0.35 * len(output) + 1.2))
    fig, ax = plt.subplots(figsize=(width, height))
    every = (_label_step(len(source), width - 2.5), _label_step(len(output), height - 1.2))
    image = heatmap(ax, weights, source, output, every=every)
    ax.set_xlabel("source")
    ax.set_ylabel("output")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="attention weight")
    if title:  # about 12 characters of 9 pt text an inch
        ax.set_title("\n".join(textwrap.wrap(title, int(width * 12))), fontsize=9)
    fig.tight_layout()
    return fig


ALIGNMENT_MAX_INCHES = (16.0, 12.0)  # an alignment figure's largest (width, height)
LABELS_PER_INCH = 12  # tick labels an axis of an alignment figure shows at most (at 5 pt)


def _label_step(n: int, inches: float) -> int:
    """The k of every k-th of ``n`` tick labels an axis ``inches`` long shows: the smallest
    that leaves no more than :data:`LABELS_PER_INCH` an inch (1 where all of them fit).

    >>> _label_step(8, 0.5), _label_step(6, 0.5), _label_step(480, 13.5)
    (2, 1, 3)
    """
    return max(1, -(-n // max(1, int(inches * LABELS_PER_INCH))))


def _rest(probs: Sequence[float]) -> float:
    """The probability mass outside ``probs``; float round-off below 1e-6 counts as none."""
    rest = 1.0 - sum(float(p) for p in probs)
    return rest if rest > 1e-6 else 0.0


@literal_text()
def distribution_figure(labels: Sequence[str], panels: Sequence[tuple[str, Sequence[float]]],
                        notes: Sequence[str] = (), others: Sequence[float] | None = None) -> Any:
    """Bar charts of one next-token distribution under several settings, one panel each.

    ``labels`` names the N tokens shown (in the order of the first panel's probabilities) and
    each panel is ``(title, probs)`` with N probabilities; the mass of all other tokens is drawn
    as a last grey bar, "other": ``others[i]`` where the caller summed it over the whole
    distribution (then it is 0 only where the setting cut every other token), else what the N
    leave of 1. Bars carry their probability; a token a setting cuts (probability 0) is marked
    with ×. Every panel has the same vertical scale, with room above the tallest bar for its
    label. ``notes[i]``, if given, is printed under panel i's title (e.g. kept tokens,
    entropy)."""
    plt = pyplot()
    n = len(labels)
    rests = [_rest(probs) for _, probs in panels] if others is None else list(others)
    heights = [[*map(float, probs), float(rest)]
               for (_, probs), rest in zip(panels, rests, strict=True)]  # then "other"
    # one scale for every panel; above 1 where a bar reaches it, so that its label stays
    # inside the panel rather than over the title
    top = 1.15 * max(max(h) for h in heights) or 1.0
    fig, axes = plt.subplots(len(panels), 1, sharex=True, squeeze=False,
                             figsize=(max(7.0, 0.5 * n + 2.5), 1.9 * len(panels) + 0.8))
    xs = list(range(n + 1))
    for i, (title, _) in enumerate(panels):
        ax = axes[i][0]
        bars = ax.bar(xs, heights[i], color=["tab:blue"] * n + ["tab:gray"])
        ax.bar_label(bars, [f"{p:.2f}" if p > 0 else "×" for p in heights[i]], fontsize=7,
                     padding=1)
        ax.set_ylim(0, top)
        ax.set_yticks([t for t in ax.get_yticks() if 0 <= t <= 1.0])  # no p above 1
        ax.set_ylabel("p", rotation=0, labelpad=8)
        note = f"  ·  {notes[i]}" if i < len(notes) and notes[i] else ""
        ax.set_title(f"{title}{note}", fontsize=9, loc="left")
    bottom = axes[-1][0]
    bottom.set_xticks(xs, [*labels, "other"],
                     fontsize=_tick_size(n + 1, _axes_inches(bottom)[0]))
    for label in bottom.get_xticklabels():
        label.set_rotation(90 if len(label.get_text()) > 1 else 0)
    fig.tight_layout()
    return fig


def context_ranges(block_size: int) -> list[tuple[int, int]]:
    """Context lengths 1..block_size in doubling ranges, both ends included:
    ``context_ranges(10) == [(1, 1), (2, 2), (3, 4), (5, 8), (9, 10)]``."""
    ranges, lo = [], 1
    while lo <= block_size:
        hi = min(block_size, 1 if lo == 1 else 2 * (lo - 1))
        ranges.append((lo, hi))
        lo = hi + 1
    return ranges


def by_context_range(curve: Sequence[float]) -> list[tuple[tuple[int, int], float]]:
    """``curve[t]`` (the mean loss with t + 1 tokens of context) averaged over each of
    :func:`context_ranges`: ``[((first, last), mean), ...]``."""
    return [((lo, hi), sum(curve[lo - 1:hi]) / (hi - lo + 1))
            for lo, hi in context_ranges(len(curve))]


@literal_text()
def context_loss_figure(curves: dict[str, Sequence[float]], title: str = "") -> Any:
    """Loss against context length, one colour per split: ``curves[split][t]`` is the mean loss
    of the predictions made with t + 1 tokens of context, drawn thin (each position averages
    only one prediction per window, so it is noisy), with its means over
    :func:`context_ranges` drawn over it. The x axis is logarithmic (the first few tokens of
    context matter most); a dashed line marks each curve's mean, the loss a whole-window
    evaluation reports."""
    from matplotlib.ticker import LogFormatter

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for split, curve in curves.items():
        line, = ax.plot(range(1, len(curve) + 1), curve, lw=0.7, alpha=0.35)
        ranges = by_context_range(curve)
        centres = [(lo * hi) ** 0.5 for (lo, hi), _ in ranges]
        ax.plot(centres, [m for _, m in ranges], "o-", ms=4, color=line.get_color(),
                label=split)
        mean = sum(curve) / len(curve)
        ax.axhline(mean, ls="--", lw=0.8, color=line.get_color(),
                   label=f"{split} mean {mean:.4f}")
    ax.set_xscale("log", base=2)
    # 1, 2, 4, ... 64 as such: the default labels are math (2^6), which literal text drew as
    # the raw "$\\mathdefault{2^{6}}$"
    ax.xaxis.set_major_formatter(LogFormatter(base=2))
    ax.set_xlabel("context: tokens the prediction could see")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    return fig


def running_mean(values: Sequence[float], window: int) -> list[float]:
    """The mean of each value and up to ``window - 1`` before it (as many as there are), so
    a noisy curve keeps its length and its start:
    ``running_mean([1, 3, 5, 7], 2) == [1.0, 2.0, 4.0, 6.0]``."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


@literal_text()
def time_curves_figure(curves: dict[str, tuple[Sequence[float], Sequence[float]]],
                       finals: dict[str, tuple[float, float]], ylabel: str,
                       title: str = "") -> Any:
    """Several runs' loss against wall-clock seconds, one colour per run, for comparing
    recipes by what they reach in a given time. ``curves[run]`` is (seconds, losses), drawn as
    a line; ``finals[run]`` is (seconds, loss), drawn as a dot of the run's colour with the
    value in the legend (say the exact validation loss at the end). A run may have either."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=110)
    for i, run in enumerate(dict.fromkeys([*curves, *finals])):
        color = f"C{i % 10}"  # matplotlib's colour cycle: the same colour for line and dot
        if run in curves:
            ax.plot(*curves[run], lw=1.0, alpha=0.8, color=color,
                    label=None if run in finals else run)
        if run in finals:
            x, y = finals[run]
            ax.plot([x], [y], "o", ms=6, color=color, label=f"{run}: {y:.4f}")
    ax.set_xlabel("wall-clock seconds of training")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def save_figure(fig: Any, path: str | Path, dpi: int = 110) -> Path:
    """Write ``fig`` to ``path`` (its suffix picks the format: .png, .svg, .pdf ...) and close
    it. A missing parent directory is created; an unknown suffix is a :class:`ConfigError`."""
    plt = pyplot()
    try:
        path = check_figure_path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        note_missing_glyphs(fig, path)
        fig.savefig(path, dpi=dpi)
    except OSError as e:
        raise ConfigError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        plt.close(fig)
    return path


def check_figure_path(path: str | Path, overwrite: bool = True) -> Path:
    """``path`` if a figure can be written there: a :class:`ConfigError` naming it when it is
    a directory or its suffix is no image format, or, unless ``overwrite``, when a file is
    there already (for a command to check before its work: ``--overwrite`` replaces it)."""
    from matplotlib.backend_bases import FigureCanvasBase

    path = Path(path)
    problem = file_target_problem(path)
    if problem is not None:
        hint = f"; give a file name in it, such as {path / 'figure.png'}" if path.is_dir() else ""
        raise ConfigError(f"cannot write {path}: {problem}{hint}")
    formats = sorted(FigureCanvasBase.get_supported_filetypes())
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in formats:
        what = f"{path.suffix!r} is not an image format" if fmt else "it has no suffix"
        raise ConfigError(f"cannot write {path}: {what}; a figure's file name ends in one of "
                          + ", ".join(f".{f}" for f in formats))
    if not overwrite and path.exists():
        raise ConfigError(f"{path} already exists; pass --overwrite to replace it")
    return path


@literal_text()
def confusion_figure(confusion: Sequence[Sequence[int]], labels: Sequence[str],
                     title: str = "") -> Any:
    """A confusion matrix: true class down, predicted class across, each cell its count,
    shaded by the share of its row (so a rare class reads as clearly as a common one)."""
    plt = pyplot()
    n = len(labels)
    fig, ax = plt.subplots(figsize=(1.6 + 0.9 * n, 1.2 + 0.9 * n))
    shares = [[c / max(sum(row), 1) for c in row] for row in confusion]
    ax.imshow(shares, cmap="Blues", vmin=0.0, vmax=1.0)
    for t in range(n):
        for p in range(n):
            ax.text(p, t, str(confusion[t][p]), ha="center", va="center",
                    color="white" if shares[t][p] > 0.5 else "black")
    width, height = _axes_inches(ax)
    ax.set_xticks(range(n), labels, fontsize=_tick_size(n, width))
    ax.set_yticks(range(n), labels, fontsize=_tick_size(n, height))
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    if title:
        ax.set_title(title, fontsize=9)
    _upright_crowded_ticks(fig, ax)
    fig.tight_layout()
    return fig


def _upright_crowded_ticks(fig: Any, ax: Any) -> None:
    """Turn the x tick labels upright when, level, any two overlap (class names wider than their
    column were written over each other, unreadable)."""
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.get_xticklabels()]
    if any(a.x1 > b.x0 for a, b in zip(boxes, boxes[1:], strict=False)):
        for tick in ax.get_xticklabels():
            tick.set(rotation=90)


def plot_confusion(confusion: Sequence[Sequence[int]], labels: Sequence[str],
                   path: str | Path, title: str = "") -> Path:
    """:func:`confusion_figure` written to ``path`` via a temporary file, so a reader never
    sees half a picture; an error names ``path``, not the temporary file."""
    path = check_figure_path(path)
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    try:
        save_figure(confusion_figure(confusion, labels, title), tmp).replace(path)
    except OSError as e:  # the rename
        raise ConfigError(f"cannot write {path}: {e.strerror or e}") from None
    except ConfigError as e:  # save_figure's, which names the temporary file
        raise ConfigError(str(e).replace(str(tmp), str(path))) from None
    finally:
        with contextlib.suppress(OSError):  # gone once renamed; a failed write's leftover
            tmp.unlink(missing_ok=True)
    return path
