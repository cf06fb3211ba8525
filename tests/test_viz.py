"""The figures of ``scratchgpt.viz`` read as they should once drawn."""

from __future__ import annotations

import numpy as np

from scratchgpt.viz import (
    ALIGNMENT_MAX_INCHES,
    TICK_POINTS,
    _tick_size,
    alignment_figure,
    attention_figure,
    context_loss_figure,
    pyplot,
)


def test_the_context_axis_reads_as_plain_token_counts() -> None:
    """``eval --by-position --plot``'s log axis of context lengths: its labels were matplotlib's
    math (``$\\mathdefault{2^{4}}$``), which the figure's literal text drew as written."""
    fig = context_loss_figure({"val": [3.0 - 0.01 * t for t in range(64)]}, "run")
    fig.canvas.draw()
    ax = fig.axes[0]
    low, high = ax.get_xlim()
    shown = [t.get_text() for t in ax.get_xticklabels() if low <= t.get_position()[0] <= high]
    assert shown == ["1", "2", "4", "8", "16", "32", "64"], shown


def _causal_weights(layers: int, heads: int, t: int) -> np.ndarray:
    """Attention-like weights ``(layers, heads, t, t)``: each row a distribution over the keys
    up to its query."""
    rng = np.random.default_rng(0)
    weights = rng.random((layers, heads, t, t)) * np.tril(np.ones((t, t)))
    return weights / weights.sum(-1, keepdims=True)


def test_an_attention_grid_has_one_colour_scale_and_names_its_axes() -> None:
    """A grid of layers x heads had neither a colour bar nor axis labels, where the figure of
    one head has both: how much attention a colour meant, and which axis was the query, could
    not be read off it."""
    labels = list("ROMEO:␣I")
    fig = attention_figure(_causal_weights(2, 3, 8), labels, [0, 1], [0, 1, 2], "gpt")
    try:
        fig.canvas.draw()
        heat = [ax for ax in fig.axes if ax.get_images()]
        bars = [ax for ax in fig.axes if ax not in heat]
        assert len(heat) == 6 and len(bars) == 1, fig.axes
        assert bars[0].get_ylabel() == "attention weight"
        assert all(ax.get_images()[0].get_clim() == (0.0, 1.0) for ax in heat)
        bar_ticks = [float(t) for t in bars[0].get_yticks()]
        assert min(bar_ticks) == 0.0 and max(bar_ticks) == 1.0, bar_ticks
        rows = [heat[:3], heat[3:]]
        assert [ax.get_xlabel() for ax in rows[1]] == ["key (attended to)"] * 3
        assert [ax.get_xlabel() for ax in rows[0]] == [""] * 3
        assert [ax.get_ylabel() for ax in (rows[0][0], rows[1][0])] == ["query (attending)"] * 2
        assert all(ax.get_ylabel() == "" for row in rows for ax in row[1:])
        assert [t.get_text() for t in rows[1][0].get_xticklabels()] == labels
        assert [t.get_text() for t in rows[0][0].get_yticklabels()] == labels
        frame = fig.bbox  # the labels and the bar are inside the figure, clear of the heatmaps
        for text in (rows[1][0].xaxis.label, rows[0][0].yaxis.label, bars[0].yaxis.label):
            box = text.get_window_extent()
            assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0, box
        right = max(ax.get_window_extent().x1 for ax in heat)
        assert bars[0].get_window_extent().x0 > right
    finally:
        pyplot().close(fig)


def test_a_long_sources_labels_are_as_large_as_their_room_allows() -> None:
    """A 51-character source was labelled in 5 pt across a figure 16 inches wide (1,920 pixels
    as `seq2seq attention` writes it): the size went by the number of labels alone (160 / n
    points), not by the room each had. Now it is what the room allows, within TICK_POINTS, and
    the labels still do not overlap."""
    source = [*"the 3rd of march 1999 and then some more text here", "<eos>"]
    output = [*"1999-", "<eos>"]
    fig = alignment_figure(np.full((len(output), len(source)), 1 / len(source)), source, output)
    try:
        assert tuple(fig.get_size_inches()) == (ALIGNMENT_MAX_INCHES[0], 3.3)
        heat = fig.axes[0]
        sizes = [t.get_fontsize() for t in heat.get_xticklabels()]
        assert len(set(sizes)) == 1 and 8.0 <= sizes[0] <= TICK_POINTS[1], sizes
        fig.canvas.draw()
        boxes = [t.get_window_extent() for t in heat.get_xticklabels()]
        assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:], strict=False))
    finally:
        pyplot().close(fig)


def test_tick_labels_shrink_as_they_crowd_but_stay_readable() -> None:
    """The size follows the room per label: smaller for more labels on the same axis, never
    below TICK_POINTS[0] nor above TICK_POINTS[1]."""
    least, most = TICK_POINTS
    assert _tick_size(2, 10.0) == most
    assert _tick_size(500, 10.0) == least
    assert least < _tick_size(100, 12.0) < _tick_size(80, 12.0) < most
