"""When a generated sequence ends: one rule for every decoding path.

A :class:`StopRule` says when a row is done: after ``max_new_tokens`` tokens, after the
end-of-text token, or as soon as its text contains a stop string. Stream, batched generation,
beam search and speculative decoding all ask the same object, so they stop alike::

    rule = StopRule(200, eos_id=tok.eot_id, stop_strings=("\\n\\n",), decode=tok.decode)
    rule.done(new_tokens)   # True: this row generates nothing more
    rule.text(new_tokens)   # what to show: no end-of-text token, cut before the stop string

The tokens a rule stops on are kept in the output (the end-of-text token, the token that
completes a stop string); :meth:`StopRule.text` removes them from the text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from scratchgpt.errors import GenerationError
from scratchgpt.validation import check_types

# The most new tokens a command generates unless told otherwise (sample's
# --max-new-tokens-limit): past it a typo, not a wish, is the likelier cause.
MAX_NEW_TOKENS = 100_000


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """Text up to the first stop string (exclusive), and whether one was found."""
    hits = [text.find(s) for s in stops if s and s in text]
    return (text[: min(hits)], True) if hits else (text, False)


@dataclass(frozen=True)
class StopRule:
    """A row stops after ``max_new_tokens``, after ``eos_id``, or once its new text contains
    one of ``stop_strings`` (which needs ``decode``: token ids -> text)."""

    max_new_tokens: int
    eos_id: int | None = None
    stop_strings: tuple[str, ...] = ()
    decode: Callable[[Sequence[int]], str] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        check_types(self)
        if isinstance(self.stop_strings, str):  # its characters would each be a stop string
            raise GenerationError(f"stop_strings is a tuple of strings, got the string "
                                  f"{self.stop_strings!r}: write ({self.stop_strings!r},)")
        if self.max_new_tokens < 0:
            raise GenerationError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        object.__setattr__(self, "stop_strings", tuple(s for s in self.stop_strings if s))
        if self.stop_strings and self.decode is None:
            raise GenerationError("stop strings need a decode function (token ids -> text)")
        # A stop string completed by the newest token lies within its last ``_tail`` tokens:
        # every token carries at least one byte of it (one more for safety).
        tail = max((len(s.encode("utf-8")) for s in self.stop_strings), default=0) + 1
        object.__setattr__(self, "_tail", tail)

    @classmethod
    def of(cls, stop: int | StopRule) -> StopRule:
        """``stop`` itself, or a rule that stops after ``stop`` new tokens."""
        return stop if isinstance(stop, StopRule) else cls(stop)

    @property
    def per_row(self) -> bool:
        """True when rows of one batch may stop at different steps (end-of-text, strings)."""
        return self.eos_id is not None or bool(self.stop_strings)

    def ends(self, new_tokens: Sequence[int]) -> bool:
        """True when the newest token ends the text: it is the end-of-text token, or it
        completes a stop string. Checked after every token, so only the tail is decoded."""
        if not new_tokens:
            return False
        if new_tokens[-1] == self.eos_id:
            return True
        if not self.stop_strings:
            return False
        tail = self.decode(new_tokens[-self._tail:])
        return any(s in tail for s in self.stop_strings)

    def done(self, new_tokens: Sequence[int]) -> bool:
        """True when a row with these new tokens generates nothing more."""
        return len(new_tokens) >= self.max_new_tokens or self.ends(new_tokens)

    def text(self, new_tokens: Sequence[int]) -> str:
        """The text these tokens stand for: without a final end-of-text token, and cut
        before the first stop string."""
        if self.decode is None:
            raise GenerationError("StopRule.text needs a decode function")
        ids = list(new_tokens)
        if ids and ids[-1] == self.eos_id:
            ids.pop()
        return cut_at_stop(self.decode(ids), self.stop_strings)[0]


class StreamText:
    """The text of a row's new tokens, handed out piece by piece as it becomes final.

    What could still turn into a stop string (the last ``len(longest stop) - 1`` characters),
    and a character whose UTF-8 bytes are not all there yet, are held back, so no piece ever
    needs taking back. Pieces end at token boundaries: each says how many tokens it completes,
    so per-token data (log-probabilities) can travel with its text. The pieces join to
    ``rule.text(tokens)``::

        st = StreamText(rule)
        for t in tokens:
            text, n = st.add(t)        # text that is final now, and the tokens it completes
        text, n = st.finish()          # the rest: cut before a stop string, no end-of-text
    """

    def __init__(self, rule: StopRule):
        if rule.decode is None:
            raise GenerationError("StreamText needs a rule with a decode function")
        self.rule, self.decode = rule, rule.decode
        self.ids: list[int] = []
        self.text = ""  # handed out so far
        self.released = 0  # tokens whose text is all in self.text
        self.hold = max((len(s) for s in rule.stop_strings), default=1) - 1
        self.finished = False

    def add(self, token: int) -> tuple[str, int]:
        """Take the next token; returns the text that became final and how many tokens it
        completes (possibly ``("", 0)``). A token that ends the text (end-of-text, or the end
        of a stop string) finishes it (see :meth:`finish`)."""
        self.ids.append(token)
        if self.rule.ends(self.ids):
            return self.finish()
        pending = self.ids[self.released:]
        # characters that are safe to hand out: not the last ``hold`` ones, and not counting
        # the replacement characters of a character whose bytes are still arriving
        limit = len(self.decode(pending).rstrip("\ufffd")) - self.hold
        for end in range(len(pending), 0, -1):  # the most tokens whose text fits the limit
            piece = self.decode(pending[:end])
            if len(piece) <= limit and not piece.endswith("\ufffd"):
                return self._release(piece, end)
        return "", 0

    def finish(self) -> tuple[str, int]:
        """The row has ended: the rest of its text (cut before the first stop string, without
        an end-of-text token) and the tokens it covers; tokens after the cut are left out.
        Later calls return ``("", 0)``."""
        if self.finished:
            return "", 0
        self.finished = True
        full = self.rule.text(self.ids)
        rest = full[len(self.text):]
        pending = self.ids[self.released:]
        if pending and pending[-1] == self.rule.eos_id:
            pending = pending[:-1]
        n = 0  # tokens that start before the end of the text
        while n < len(pending) and len(self.decode(pending[:n])) < len(rest):
            n += 1
        return self._release(rest, n)

    def _release(self, piece: str, n_tokens: int) -> tuple[str, int]:
        self.text += piece
        self.released += n_tokens
        return piece, n_tokens
