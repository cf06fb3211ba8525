"""Printing generated text as it arrives, without ever taking anything back.

:class:`StreamPrinter` receives token ids one at a time and writes the text they stand for,
through :class:`~scratchgpt.generation.stopping.StreamText`: what could still turn into a stop
string (a chat template's ``<|end|>``, a ``--stop``) and an incomplete multi-byte character are
held back, so nothing printed needs to be erased. ``sample`` and ``chat`` stream through it;
``serve`` streams through the same ``StreamText``.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TextIO

from scratchgpt.generation.stopping import StopRule, StreamText


class StreamPrinter:
    """Writes a row's final text to ``out`` (stdout by default) as tokens arrive.

    The rule must carry a ``decode`` function (token ids -> text). ``text``: the
    :class:`StreamText` of ``rule`` to stream through, when not a plain one (a chat reply's
    :class:`~scratchgpt.serve.reply.ReplyText`)."""

    def __init__(self, rule: StopRule, out: TextIO | None = None,
                 text: StreamText | None = None):
        self.text, self.out = text or StreamText(rule), out or sys.stdout

    @property
    def ids(self) -> list[int]:
        """The tokens received so far."""
        return self.text.ids

    def add(self, token: int) -> None:
        self._emit(self.text.add(token)[0])

    def finish(self) -> str:
        """Writes what was held back (cut before a stop string) and returns the whole text."""
        self._emit(self.text.finish()[0])
        return self.text.text

    def _emit(self, piece: str) -> None:
        if piece:
            self.out.write(piece)
            self.out.flush()


@contextlib.contextmanager
def line_ended_if_stopped(printer: StreamPrinter | None = None) -> Iterator[None]:
    """Ctrl-C or SIGTERM in the middle of a text streamed to stdout ends its line before the
    command ends: its 'interrupted' was written on after the last token, and a file the text
    went to ended without its newline. The text ``printer`` held back first comes out (what
    could have begun a stop string: it did not, and the model generated it)."""
    try:
        yield
    except KeyboardInterrupt:
        if printer is not None:
            printer.finish()
        sys.stdout.write("\n")
        sys.stdout.flush()
        raise
