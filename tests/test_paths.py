"""Everything scratchgpt caches goes to one directory: downloads and prepared datasets
(``data/``) and compiled kernels (``models/c_kernels.py``) alike. The data cache followed
``$SCRATCHGPT_CACHE_DIR`` alone and the kernels ``$XDG_CACHE_HOME`` alone, so a user who set
either found part of the cache still in ``~/.cache``."""

from __future__ import annotations

import pytest

from scratchgpt.data.resolve import resolve_dataset
from scratchgpt.models import c_kernels
from scratchgpt.paths import cache_dir
from tests.corpus import play_text
from tests.named_datasets import fake_named_dataset

# (SCRATCHGPT_CACHE_DIR, XDG_CACHE_HOME) -> the cache, below tmp_path (HOME is tmp_path/home)
SETTINGS = [(("own", "xdg"), "own"), ((None, "xdg"), "xdg/scratchgpt"),
            (("", "xdg"), "xdg/scratchgpt"), ((None, None), "home/.cache/scratchgpt"),
            (("", ""), "home/.cache/scratchgpt")]


@pytest.mark.parametrize("env,expected", SETTINGS)
def test_data_and_kernels_share_the_cache_either_variable_names(env, expected, tmp_path,
                                                                monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for var, value in zip(("SCRATCHGPT_CACHE_DIR", "XDG_CACHE_HOME"), env, strict=True):
        if value is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, str(tmp_path / value) if value else "")
    root = tmp_path / expected
    assert cache_dir() == root
    assert c_kernels.cache_dir() == root / "kernels"
    fake_named_dataset(monkeypatch, tmp_path / "data", "tiny-cached", play_text(5_000))
    data, _ = resolve_dataset("tiny-cached", log=None)
    assert data.directory == root / "datasets" / "tiny-cached-char"
    others = {"own", "xdg/scratchgpt", "home/.cache/scratchgpt"} - {expected}
    assert not [o for o in others if (tmp_path / o).exists()]  # nothing cached elsewhere
