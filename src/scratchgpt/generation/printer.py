"""Printing generated text as it arrives, without ever taking anything back.

:class:`StreamPrinter` receives token ids one at a time and writes the text they stand for. It
holds back what could still turn into a stop string (a chat template's ``<|end|>``, a
``--stop``), and an incomplete multi-byte character, so nothing printed needs to be erased;
``sample`` and ``chat`` stream through it.
"""

from __future__ import annotations

import sys


class StreamPrinter:
    """Prints decoded text as tokens arrive. It holds back what could still become a stop
    string, or an incomplete multi-byte character, so nothing printed needs taking back."""

    def __init__(self, tokenizer, rule, out=None):
        self.tok, self.rule, self.out = tokenizer, rule, out or sys.stdout
        self.ids: list[int] = []
        self.printed = 0
        self.hold = max((len(s) for s in rule.stop_strings), default=1) - 1

    def add(self, token: int) -> None:
        self.ids.append(token)
        text = self.rule.text(self.ids)  # no end-of-text token, cut before a stop string
        safe = len(text) - self.hold
        while safe > self.printed and text[safe - 1] == "\ufffd":
            safe -= 1  # an incomplete UTF-8 sequence decodes to U+FFFD: wait for more bytes
        if safe > self.printed:
            self._emit(text[:safe])

    def finish(self) -> str:
        text = self.rule.text(self.ids)
        self._emit(text)
        return text

    def _emit(self, text: str) -> None:
        self.out.write(text[self.printed:])
        self.out.flush()
        self.printed = len(text)
