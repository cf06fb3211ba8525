"""A chat reply's text: without the start of the end-of-turn marker it was cut short writing.

``serve``'s chat replies and ``scratchgpt chat``'s stream through :class:`ReplyText`, and
``scratchgpt sample --chat`` prints its replies, streamed or whole (:func:`reply_text`), by the
same rule, so that all of them show a reply cut at its length alike.
"""

from __future__ import annotations

from collections.abc import Sequence

from scratchgpt.generation.stopping import StopRule, StreamText


def marker_start(text: str, marker: str) -> int:
    """How many characters at the end of ``text`` begin ``marker`` (all of it but its last
    character at most): ``marker_start("ok<|e", "<|end|>") == 3``."""
    return next((k for k in range(len(marker) - 1, 0, -1) if text.endswith(marker[:k])), 0)


def marker_cut(text: str, marker: str) -> int:
    """How many characters at the end of a reply cut short (``text``) are left out: the start
    of ``marker`` it was writing, but not the marker's first character alone (see
    :class:`ReplyText`): ``marker_cut("ok<|e", "<|end|>") == 3``, ``marker_cut("ok<", "<|end|>")
    == 0``."""
    started = marker_start(text, marker)
    return started if started > 1 else 0


def reply_text(rule: StopRule, marker: str, ids: Sequence[int]) -> str:
    """The text of a chat reply's new tokens ``ids``, whole: what :class:`ReplyText`'s pieces
    join to. ``rule.text(ids)``, and, when neither the end-of-text token nor a stop string
    ended the reply (its length, Ctrl-C cut it short), without the start of ``marker`` it was
    writing. (Tokens after the end, which a stream never hands on, change nothing.)"""
    text = rule.text(ids)
    if rule.ends(ids) or text != rule.decode(ids):  # it ended: the marker is cut already
        return text
    return text[:len(text) - marker_cut(text, marker)]


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
        cut = min(len(piece), marker_cut(self.text, self.marker))
        if not cut:
            return piece, n
        piece, self.text = piece[:-cut], self.text[:-cut]
        first = self.released - n
        keep = 0  # the tokens that start before the end of the piece left
        while keep < n and len(self.decode(self.ids[first:first + keep])) < len(piece):
            keep += 1
        self.released = first + keep
        return piece, keep
