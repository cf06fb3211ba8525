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
