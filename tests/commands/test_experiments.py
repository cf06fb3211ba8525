"""``scratchgpt experiment memory`` and ``count``: what their result files and figures say."""

from __future__ import annotations

import csv

from scratchgpt.cli import main
from scratchgpt.experiments import memory


def test_memory_plots_the_sequence_lengths_it_trained_on_and_says_how_far_back_that_is(
        tmp_path, monkeypatch):
    """The x-axis said 'sequence length (steps between the symbol and the answer)': a sequence
    of T symbols puts the first T - 1 steps before the answer, not T."""
    seen: list[int] = []
    real_batch = memory.FirstSymbolTask.train_batch

    def spy(self, *args, **kwargs):
        x, y = real_batch(self, *args, **kwargs)
        assert (y == x[:, 0]).all()  # the answer is the first symbol read...
        seen.append(x.shape[1])  # ...of T, the last read T - 1 steps after it
        return x, y

    figures = []
    real_figure = memory.figure

    def keep(*args, **kwargs):
        figures.append(real_figure(*args, **kwargs))
        return figures[-1]

    monkeypatch.setattr(memory.FirstSymbolTask, "train_batch", spy)
    monkeypatch.setattr(memory, "figure", keep)
    assert main(["experiment", "memory", "--quick", "--cells", "rnn", "--min-len", "3",
                 "--max-len", "5", "--hidden", "4", "--out", str(tmp_path)]) == 0
    lengths = [int(row["length"]) for row in csv.DictReader((tmp_path / "memory.csv").open())]
    assert lengths == sorted(set(seen)) == [3, 4, 5]
    ax = figures[0].axes[0]
    assert list(ax.lines[0].get_xdata()) == lengths
    label = ax.get_xlabel()
    assert label.startswith("sequence length T") and "T - 1 steps before the answer" in label
