"""The progress bar of a training run: by steps, or by seconds under a time budget."""

from __future__ import annotations

import sys
from typing import Any


class Progress:
    """A tqdm bar showing step, loss, tokens/s and time left; ``enabled=False`` shows none,
    nor does a run with nothing left to train (a finished run resumed: a full bar would say
    nothing the note about it does not)."""

    def __init__(self, enabled: bool, total_steps: int, step: int, budget_s: float | None,
                 elapsed_s: float):
        self.bar: Any = None
        self.budget = budget_s
        if not enabled or step >= total_steps or (budget_s and elapsed_s >= budget_s):
            return
        from scratchgpt.bars import tqdm_class

        tqdm = tqdm_class()
        # Redrawn ten times a second on a terminal; into a log file or a pipe, where every
        # redraw stays as text, every ten seconds.
        every = 0.1 if sys.stderr.isatty() else 10.0
        if budget_s:
            self.bar = tqdm(total=round(budget_s), initial=min(round(elapsed_s), round(budget_s)),
                            unit="s", dynamic_ncols=True, mininterval=every,
                            bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f}s "
                                       "[{remaining} left{postfix}]")
        else:
            self.bar = tqdm(total=total_steps, initial=step, unit="step", dynamic_ncols=True,
                            mininterval=every)

    def update(self, step: int, loss: float, tokens_per_s: float, elapsed_s: float) -> None:
        if self.bar is None:
            return
        self.bar.set_postfix(step=step, loss=f"{loss:.3f}", tok_s=f"{tokens_per_s:,.0f}",
                             refresh=False)
        if self.budget:  # the bar counts seconds: advanced by those since the last step
            self.bar.update(min(elapsed_s, self.budget) - self.bar.n)
        else:
            self.bar.update(1)

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
