"""Ctrl-C and SIGTERM on the command line: one line and exit code 130 / 143, never a hang.

Three pieces, each for a way a signal goes wrong in a Python process that imports torch:

* :func:`sigterm_stops`: SIGTERM's default action kills the process on the spot; inside the
  block it raises :class:`~scratchgpt.errors.Terminated` (a ``KeyboardInterrupt``), so the same
  clean-up as Ctrl-C's runs.
* :func:`signals_held`: a ``KeyboardInterrupt`` raised while a module imports can be swallowed
  by the import machinery (torch's and numpy's sometimes do), leaving a half-imported module and
  a command that runs on as if never interrupted. Around imports (the command modules, and the
  parts of torch a training run imports lazily while it is set up) signals are recorded and
  raised once the block is over.
* :func:`forget_interrupts_caught_in_exec`: CPython marks a ``KeyboardInterrupt`` that escapes
  code run by ``exec`` of a string (dataclasses and namedtuples are made that way while a module
  imports) as unhandled, even when a caller catches it, and at exit kills itself with SIGINT
  instead of exiting with the code the command returned.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from scratchgpt.errors import Terminated


def _terminate(signum: int, frame: object) -> None:
    raise Terminated


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()  # only it can set handlers


@contextlib.contextmanager
def sigterm_stops() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` for the duration of the block (where it would
    otherwise kill the process on the spot: the main thread, default handler)."""
    if not _in_main_thread() or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM are recorded, not raised, for the duration of the block, then raised
    once it is over (the first one: ``KeyboardInterrupt`` or :class:`Terminated`)."""
    if not _in_main_thread():
        yield
        return
    pending: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: pending.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)
                if signal.getsignal(sig) not in (signal.SIG_IGN, None)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if pending:
        raise Terminated if pending[0] == signal.SIGTERM else KeyboardInterrupt


def forget_interrupts_caught_in_exec() -> None:
    """Let the exit code a command returns stand after a Ctrl-C that was caught: running code
    through ``exec`` clears CPython's mark of an unhandled ``KeyboardInterrupt`` (see the
    module's docstring)."""
    exec("")
