"""Stopping a run cleanly: Ctrl-C (SIGINT) and SIGTERM become a request honoured between steps.

A signal that interrupted Python mid-step could leave the optimizer half-way through its update
or the batch stream one batch ahead of the saved step, and the saved checkpoint would not
resume exactly. So the first signal only sets a flag; the loop finishes its step, saves
``last.pt`` and ends (exit code 130 after SIGINT, 143 after SIGTERM, as shells expect). A second
signal raises ``KeyboardInterrupt`` at once, for a run that must end now (nothing more is saved;
the previous checkpoints stay good). The same signal again within a second is the same request
delivered twice (a scheduler signalling every process of a job while ``--nproc``'s launcher
relays it too), not a second one.

In a data-parallel group every process checks the flag of every other through one all-reduce
per step (:meth:`StopFlag.agree`), so all stop after the same step.

A run without a run directory (an experiment's or a benchmark's model) saves nothing: its
flag (``saves=False``) says only that the run stops after the step.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Any

import torch

from scratchgpt.training.distributed import DistInfo

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
REPEAT_WINDOW_S = 1.0


class StopFlag:
    """Use as a context manager around the training loop."""

    def __init__(self, info: DistInfo, announce: bool = True, saves: bool = True):
        self.info = info
        self.signum: int | None = None
        self.announce = announce
        self.saves = saves  # whether the run saves last.pt when it stops
        self._previous: dict[int, Any] = {}
        self._at = 0.0  # when the first signal came
        self.stop_at_once = False  # set while no step is left to finish: the first signal
        # then interrupts the work (KeyboardInterrupt) after recording the request

    def __enter__(self) -> StopFlag:
        if threading.current_thread() is threading.main_thread():
            for sig in EXIT_CODES:
                self._previous[sig] = signal.signal(sig, self._request)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)

    def _request(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            if signum == self.signum and time.monotonic() - self._at < REPEAT_WINDOW_S:
                return  # the same request, delivered twice
            raise KeyboardInterrupt  # the second signal: stop now
        self.signum, self._at = signum, time.monotonic()
        if self.stop_at_once:
            raise KeyboardInterrupt  # the caller saves last.pt
        if self.announce and self.info.is_main:
            saving = " and saving last.pt" if self.saves else ""
            print(f"\n{signal.Signals(signum).name}: stopping after this step{saving} (send it "
                  "again to stop at once)", file=sys.stderr, flush=True)

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def agree(self, elapsed: float, device: torch.device) -> tuple[float, bool]:
        """One all-reduce per step: rank 0's clock (so every process follows one schedule and
        budget) and whether any process was asked to stop. Outside a group: local values."""
        if not self.info.enabled:
            return elapsed, self.requested
        import torch.distributed as dist

        t = torch.tensor([elapsed if self.info.is_main else 0.0, float(self.signum or 0)],
                         dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if t[1] and self.signum is None:
            self.signum = int(t[1])
        return float(t[0]), bool(t[1])

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.signum, 130) if self.signum is not None else 0
