"""Where scratchgpt keeps what it caches: one directory for downloads, implicitly prepared
datasets and compiled kernels alike. A leaf: it imports nothing from scratchgpt, so every
layer (``data/`` and ``models/`` both) can ask it."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The per-user cache: ``$SCRATCHGPT_CACHE_DIR``, else ``$XDG_CACHE_HOME/scratchgpt``,
    else ``~/.cache/scratchgpt``. Empty variables count as unset."""
    own = os.environ.get("SCRATCHGPT_CACHE_DIR")
    if own:
        return Path(own)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "scratchgpt"
