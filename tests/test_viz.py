"""The figures of ``scratchgpt.viz`` read as they should once drawn."""

from __future__ import annotations

import numpy as np

from scratchgpt.viz import (
    ALIGNMENT_MAX_INCHES,
    TICK_POINTS,
    _tick_size,
    alignment_figure,
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
