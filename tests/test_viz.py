"""The figures of ``scratchgpt.viz`` read as they should once drawn."""

from __future__ import annotations

from scratchgpt.viz import context_loss_figure


def test_the_context_axis_reads_as_plain_token_counts() -> None:
    """``eval --by-position --plot``'s log axis of context lengths: its labels were matplotlib's
    math (``$\\mathdefault{2^{4}}$``), which the figure's literal text drew as written."""
    fig = context_loss_figure({"val": [3.0 - 0.01 * t for t in range(64)]}, "run")
    fig.canvas.draw()
    ax = fig.axes[0]
    low, high = ax.get_xlim()
    shown = [t.get_text() for t in ax.get_xticklabels() if low <= t.get_position()[0] <= high]
    assert shown == ["1", "2", "4", "8", "16", "32", "64"], shown
