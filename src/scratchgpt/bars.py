"""Progress bars for the long passes outside training (BPE learning, preparing a dataset,
evaluating a split, generating replies): tqdm on stderr, drawn only once a pass has run for
:data:`PROGRESS_DELAY_S`, so a small job prints none. A leaf: no scratchgpt imports.
(A training run's own bar, by steps or seconds, is ``training/progress.py``.)

>>> with progress_bar(3, enabled=False, desc="replies", unit="reply") as bar:
...     bar.update(3)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

# A bar is drawn once its pass has run this long: a small text's BPE training shows none.
PROGRESS_DELAY_S = 1.0


def tqdm_class() -> Any:
    """tqdm's bar class: Jupyter's widget where a notebook can draw one (``tqdm.auto``), else
    the text bar. In a notebook without ipywidgets, ``tqdm.auto`` put the warning "IProgress
    not found. Please update jupyter and ipywidgets" into the reader's output, and then drew
    the text bar anyway."""
    import importlib.util

    if importlib.util.find_spec("ipywidgets") is None:
        from tqdm import tqdm
    else:
        from tqdm.auto import tqdm
    return tqdm


def progress_bar(total: int, enabled: bool, desc: str, unit: str) -> Any:
    """A tqdm bar on stderr of ``total`` steps, drawn once it has run for
    :data:`PROGRESS_DELAY_S` (none when not ``enabled``); counts of characters or tokens are
    shown scaled (1.2M)."""
    return tqdm_class()(total=total, desc=desc, unit=unit,
                        unit_scale=unit in ("char", "token"), delay=PROGRESS_DELAY_S,
                        disable=not enabled, dynamic_ncols=True)


def named_bar(total: int, name: str | None, unit: str) -> Any:
    """:func:`progress_bar` for a pass whose caller names its bar, or gives None for none
    (a final evaluation's, shown on a terminal only).

    >>> with named_bar(3, None, "pair") as bar:
    ...     bar.update(3)
    """
    return progress_bar(total, name is not None, name or "", unit)


def progress_over(items: Sequence[T], enabled: bool, desc: str, unit: str) -> Iterable[T]:
    """``items``, with a bar on stderr as they are gone through (as :func:`progress_bar`);
    ``items`` themselves when not ``enabled``."""
    if not enabled:
        return items
    return tqdm_class()(items, desc=desc, unit=unit, dynamic_ncols=True, delay=PROGRESS_DELAY_S)
