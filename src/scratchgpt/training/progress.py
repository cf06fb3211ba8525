"""The progress bar of a training run: by steps, or by seconds under a time budget."""

from __future__ import annotations

from typing import Any


class Progress:
    """A tqdm bar showing step, loss, tokens/s and time left; ``enabled=False`` shows none."""

    def __init__(self, enabled: bool, total_steps: int, step: int, budget_s: float | None,
                 elapsed_s: float):
        self.bar: Any = None
        self.budget = budget_s
        if not enabled:
            return
        from tqdm.auto import tqdm

        if budget_s:
            self.bar = tqdm(total=round(budget_s), initial=min(round(elapsed_s), round(budget_s)),
                            unit="s", dynamic_ncols=True,
                            bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f}s "
                                       "[{remaining} left{postfix}]")
        else:
            self.bar = tqdm(total=total_steps, initial=step, unit="step", dynamic_ncols=True)

    def update(self, step: int, loss: float, tokens_per_s: float, elapsed_s: float) -> None:
        if self.bar is None:
            return
        self.bar.set_postfix(step=step, loss=f"{loss:.3f}", tok_s=f"{tokens_per_s:,.0f}",
                             refresh=False)
        if self.budget:
            self.bar.n = min(elapsed_s, self.budget)
            self.bar.refresh()
        else:
            self.bar.update(1)

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
