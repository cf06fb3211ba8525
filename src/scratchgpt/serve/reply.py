"""A chat reply's text: without the start of the end-of-turn marker it was cut short writing.

``serve``'s chat replies and ``scratchgpt chat``'s stream through :class:`ReplyText`, so that
the two show a reply cut at its length alike.
"""

from __future__ import annotations

from scratchgpt.generation.stopping import StopRule, StreamText


def marker_start(text: str, marker: str) -> int:
    """How many characters at the end of ``text`` begin ``marker`` (all of it but its last
    character at most): ``marker_start("ok<|e", "<|end|>") == 3``."""
    return next((k for k in range(len(marker) - 1, 0, -1) if text.endswith(marker[:k])), 0)


class ReplyText(StreamText):
    """A chat reply's :class:`StreamText`. A reply cut short (its length, its time) while the
    model was writing the template's end-of-turn ``marker`` was ending its turn: the start of
    the marker it wrote is left out, as the whole marker is from a reply that reached it
    (``ok<|e`` is ``ok``). The marker's first character alone is kept: ``a <`` or ``<`` ends
    text as often as it starts the marker, and it is what the model wrote (``ok<`` stays). The
    held-back text (the longest stop string but one character) always holds that start. Other
    stop strings (a request's own) keep OpenAI's behaviour: a cut reply that ends in the start
    of one keeps it."""

    def __init__(self, rule: StopRule, marker: str):
        super().__init__(rule)
        self.marker = marker

    def finish(self) -> tuple[str, int]:
        if self.finished or self.rule.ends(self.ids):  # (the marker, if any, is cut already)
            return super().finish()
        piece, n = super().finish()
        started = marker_start(self.text, self.marker)
        cut = min(len(piece), started if started > 1 else 0)
        if not cut:
            return piece, n
        piece, self.text = piece[:-cut], self.text[:-cut]
        first = self.released - n
        keep = 0  # the tokens that start before the end of the piece left
        while keep < n and len(self.decode(self.ids[first:first + keep])) < len(piece):
            keep += 1
        self.released = first + keep
        return piece, keep
