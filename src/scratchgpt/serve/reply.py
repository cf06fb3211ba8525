"""A chat reply's text as the chat template holds it: without the start of a marker of the
template it was cut short writing, nor the line break the template writes before a role's
marker.

``serve``'s chat replies and ``scratchgpt chat``'s stream through :class:`ReplyText`, and
``scratchgpt sample --chat`` prints its replies, streamed or whole (:func:`reply_text`), by the
same rule, as ``finetune --eval-generate`` reads its greedy replies, so that all of them show a
reply alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from scratchgpt.generation.stopping import StopRule, StreamText

if TYPE_CHECKING:
    from scratchgpt.chat import ChatTemplate


def marker_start(text: str, marker: str) -> int:
    """How many characters at the end of ``text`` begin ``marker`` (all of it but its last
    character at most): ``marker_start("ok<|e", "<|end|>") == 3``."""
    return next((k for k in range(len(marker) - 1, 0, -1) if text.endswith(marker[:k])), 0)


def marker_cut(text: str, markers: Sequence[str]) -> int:
    """How many characters at the end of a reply cut short (``text``) are left out: the
    longest start of one of ``markers`` (a template's :attr:`~scratchgpt.chat.ChatTemplate.
    reply_stops`) it was writing, but not a marker's first character alone (see
    :class:`ReplyText`).

    >>> stops = ("<|end|>", "<|user|>")
    >>> marker_cut("ok<|e", stops), marker_cut("ok<|us", stops), marker_cut("ok<", stops)
    (3, 4, 0)
    """
    started = max((marker_start(text, m) for m in markers), default=0)
    return started if started > 1 else 0


def left_out(rule: StopRule, template: ChatTemplate, ids: Sequence[int]) -> int:
    """How many characters at the end of ``rule.text(ids)`` a chat reply leaves out: the start
    of the template's marker it was writing where it was cut short (its length, Ctrl-C; a stop
    string or the end-of-text token that ended it is cut already), and the line break before
    a role's marker (:func:`line_break`)."""
    text, whole = rule.text(ids), rule.decode(ids)
    if rule.ends(ids) or text != whole:  # it ended (tokens after the end too)
        cut, after = 0, whole[len(text):]
    else:
        cut = marker_cut(text, template.reply_stops)
        after = text[len(text) - cut:]
    return cut + line_break(text[:len(text) - cut], after, template)


def line_break(text: str, after: str, template: ChatTemplate) -> int:
    """1 where a reply's ``text`` ends in a line break and what it left out ``after`` it is a
    role's marker (or the start of one, longer than its first character), else 0. The
    template writes a line break after every message, before the next one's marker line
    (``ok\\n<|user|>``): it is the template's, not the reply's, which the template holds as
    ``ok``. Before the end marker, which follows the reply directly, it is the reply's own
    (``ok\\n<|end|>`` holds ``ok\\n``); where what was cut short could begin either
    (``<|``), it goes with the role's marker line.

    >>> from scratchgpt.chat import DEFAULT_TEMPLATE, TEMPLATES
    >>> t = TEMPLATES[DEFAULT_TEMPLATE]
    >>> line_break("ok\\n", "<|user|>\\nhi", t), line_break("ok\\n", "<|end|>", t)
    (1, 0)
    """
    roles = [mark for _, mark in template.markers]
    turn = len(after) > 1 and any(after.startswith(m) or m.startswith(after) for m in roles)
    return int(turn and text.endswith("\n"))


def reply_text(rule: StopRule, template: ChatTemplate, ids: Sequence[int]) -> str:
    """The text of a chat reply's new tokens ``ids``, whole: what :class:`ReplyText`'s pieces
    join to. ``rule.text(ids)`` without what :func:`left_out` says. (Tokens after the end,
    which a stream never hands on, change nothing.)"""
    text = rule.text(ids)
    return text[:len(text) - left_out(rule, template, ids)]


class ReplyText(StreamText):
    """A chat reply's :class:`StreamText`. A reply cut short (its length, its time) while the
    model was writing one of the ``template``'s markers (:attr:`~scratchgpt.chat.
    ChatTemplate.reply_stops`: the end of its turn, or another role's marker line) was ending
    its turn: the start of the marker it wrote is left out, as the whole marker is from a
    reply that reached it (``ok<|e`` and ``ok<|us`` are ``ok``). A marker's first character
    alone is kept: ``a <`` or ``<`` ends text as often as it starts a marker, and it is what
    the model wrote (``ok<`` stays). The line break the template writes before a role's
    marker line is left out with it (:func:`line_break`: ``ok\\n<|user|>`` is ``ok``). The
    held-back text (at least the longest marker) always holds both. Other stop strings (a
    request's own) keep OpenAI's behaviour: a cut reply that ends in the start of one keeps
    it."""

    def __init__(self, rule: StopRule, template: ChatTemplate):
        super().__init__(rule)
        self.template = template
        # held back: all of a marker but its last character, and the line break before it
        self.hold = max(self.hold, *map(len, template.reply_stops))

    def finish(self) -> tuple[str, int]:
        if self.finished:
            return super().finish()
        piece, n = super().finish()
        cut = min(len(piece), left_out(self.rule, self.template, self.ids))
        if not cut:
            return piece, n
        piece, self.text = piece[:-cut], self.text[:-cut]
        first = self.released - n
        keep = 0  # the tokens that start before the end of the piece left
        while keep < n and len(self.decode(self.ids[first:first + keep])) < len(piece):
            keep += 1
        self.released = first + keep
        return piece, keep
