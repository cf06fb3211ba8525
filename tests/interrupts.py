"""A stop signal sent in the middle of training, as a user's Ctrl-C (or a SIGTERM) comes."""

from __future__ import annotations

import os

from scratchgpt.data.dataset import TokenDataset


def interrupt_at(monkeypatch, call: int, signum: int) -> None:
    """Send ``signum`` to this process while the training loop draws its ``call``-th batch."""
    real = TokenDataset.get_batch
    calls = {"n": 0, "gen": None}

    def interrupting(self, split, batch_size, block_size, generator, *args, **kw):
        calls["gen"] = calls["gen"] or generator  # the first caller is the training loop
        calls["n"] += generator is calls["gen"]
        if calls["n"] == call:
            os.kill(os.getpid(), signum)
        return real(self, split, batch_size, block_size, generator, *args, **kw)

    monkeypatch.setattr(TokenDataset, "get_batch", interrupting)
