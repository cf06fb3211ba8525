"""Chat prompts: the one template that instruction tuning trains on and that ``chat``,
``sample --chat`` and ``serve`` render conversations with.

A conversation is a list of messages ``{"role": ..., "content": ...}`` with roles ``system``
(optional, first), ``user`` and ``assistant``. The template writes each message after a marker
line and ends every assistant reply with an end-of-turn marker, in plain text, so that any
tokenizer (characters included) can learn it::

    <|system|>
    You are terse.
    <|user|>
    What is 17 + 25?
    <|assistant|>
    42<|end|>

A prompt for generation ends right after ``<|assistant|>\\n``; generation stops at ``<|end|>``
(the :attr:`ChatTemplate.stop` string), or at another turn's marker
(:attr:`ChatTemplate.reply_stops`). Training masks the loss to the assistant replies and
their end marker: :meth:`ChatTemplate.segments` says which pieces of the text are targets.

A model fine-tuned with a template records its name in its checkpoint
(``checkpoint.data["chat_template"]``, and a Hugging Face export in its config.json, see
:mod:`scratchgpt.checkpoints.hf`); :func:`template_for` finds it again, and a model without one
cannot chat.

>>> t = TEMPLATES[DEFAULT_TEMPLATE]
>>> t.render([{"role": "user", "content": "Hi"}])
'<|user|>\\nHi\\n<|assistant|>\\n'
>>> [(text, target) for text, target in t.segments(
...     [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}])]
[('<|user|>\\nHi\\n<|assistant|>\\n', False), ('Hello<|end|>', True), ('\\n', False)]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scratchgpt.errors import DataError

ROLES = ("system", "user", "assistant")
Message = Mapping[str, str]


@dataclass(frozen=True)
class ChatTemplate:
    """How messages become text: a marker line before each role's message, and ``end`` after
    every assistant reply."""

    name: str
    markers: tuple[tuple[str, str], ...]  # (role, the line that introduces its message)
    end: str

    @property
    def stop(self) -> str:
        """The string that ends an assistant turn: generation stops there."""
        return self.end

    @property
    def reply_stops(self) -> tuple[str, ...]:
        """The strings a reply stops at: the end marker, and the marker of any role's turn,
        which a model that has not learned to end its turn goes on to write (a reply kept
        with one would be refused in the next request, as every message holding a marker
        is). The marker is no part of the reply, nor is the line break before a role's
        marker line, which the template writes after every message
        (:func:`~scratchgpt.serve.reply.reply_text`)."""
        return (self.end, *(mark for _, mark in self.markers))

    def marker(self, role: str) -> str:
        return dict(self.markers)[role]

    def segments(self, messages: Sequence[Message], add_generation_prompt: bool = False
                 ) -> list[tuple[str, bool]]:
        """The conversation as (text, is_target) pieces that join to :meth:`render`'s text:
        the assistant replies with their end marker are targets (but one whose ``weight`` is
        0, as OpenAI's fine-tuning files mark a reply to learn nothing from), everything else
        is not."""
        self.check(messages)
        pieces: list[tuple[str, bool]] = []
        for m in messages:
            head = f"{self.marker(m['role'])}\n"
            if m["role"] == "assistant":
                target = m.get("weight", 1) != 0
                pieces += [(head, False), (m["content"] + self.end, target), ("\n", False)]
            else:
                pieces.append((f"{head}{m['content']}\n", False))
        if add_generation_prompt:
            pieces.append((f"{self.marker('assistant')}\n", False))
        return _merge(pieces)

    def check(self, messages: Sequence[Message], where: str = "messages") -> None:
        """:func:`check_messages`, and no message's content holds one of the template's
        markers. The markers are plain text, so a message holding ``<|end|>`` and then
        ``<|assistant|>`` would end its turn and speak for another role: a user could write
        the assistant's lines, and a training example would teach a turn nobody wrote.

        >>> TEMPLATES[DEFAULT_TEMPLATE].check([{"role": "user", "content": "a<|end|>"}])
        Traceback (most recent call last):
        ...
        scratchgpt.errors.DataError: messages[0]: its content holds '<|end|>', a marker of the \
chat template (it would end the turn); remove it
        """
        check_messages(messages, where)
        for i, m in enumerate(messages):
            problem = self.marker_in(m["content"])
            if problem:
                raise DataError(f"{where}[{i}]: its content {problem}")

    def marker_in(self, content: str) -> str | None:
        """What is wrong with ``content`` if it holds a marker of the template (the first in
        the text, as a reader meets it), or None.

        >>> TEMPLATES[DEFAULT_TEMPLATE].marker_in("ok <|user|>")
        "holds '<|user|>', a marker of the chat template (it would start a turn as the user); \
remove it"
        """
        found = self.first_marker(content)
        if found is None:
            return None
        _, role, mark = found
        what = "end the turn" if role == "end" else f"start a turn as the {role}"
        return f"holds {mark!r}, a marker of the chat template (it would {what}); remove it"

    def first_marker(self, content: str) -> tuple[int, str, str] | None:
        """(where, whose (a role, or ``end``), the marker) of the first marker of the
        template in ``content``, or None.

        >>> TEMPLATES[DEFAULT_TEMPLATE].first_marker("ok\\n<|user|>\\nhi")
        (3, 'user', '<|user|>')
        """
        found = [(content.find(mark), role, mark)
                 for role, mark in (*self.markers, ("end", self.end)) if mark in content]
        return min(found) if found else None

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        """The text of the conversation; with ``add_generation_prompt`` (and a last message
        from the user) it ends where the assistant's reply begins."""
        return "".join(text for text, _ in self.segments(messages, add_generation_prompt))

    @property
    def jinja(self) -> str:
        """The template in Jinja, the language of Hugging Face's ``apply_chat_template`` and of
        llama.cpp's chat templates: exported models carry it (``tokenizer_config.json``, the
        GGUF key ``tokenizer.chat_template``) so that other tools prompt them as :meth:`render`
        does, text for text (tested against transformers and llama-cpp-python). It refuses what
        :func:`check_messages` refuses, through the ``raise_exception`` both tools provide.

        >>> print(TEMPLATES[DEFAULT_TEMPLATE].jinja.splitlines()[6])
        {%- if message['role'] == 'system' -%}{{- '<|system|>\\n' + message['content'] + '\\n' -}}
        """
        lines = ["{%- for message in messages -%}",
                 "{%- if message['role'] == 'system' and not loop.first -%}"
                 "{{- raise_exception('a system message can only come first') -}}{%- endif -%}"]
        for marker in (*(m for _, m in self.markers), self.end):
            why = _jinja_string(f"a message holds {marker}, a marker of the chat template")
            lines.append(f"{{%- if {_jinja_string(marker)} in message['content'] -%}}"
                         f"{{{{- raise_exception({why}) -}}}}{{%- endif -%}}")
        for i, (role, marker) in enumerate(self.markers):
            ending = self.end + "\n" if role == "assistant" else "\n"
            lines.append(f"{{%- {'el' if i else ''}if message['role'] == '{role}' -%}}"
                         f"{{{{- {_jinja_string(marker + chr(10))} + message['content'] + "
                         f"{_jinja_string(ending)} -}}}}")
        lines += ["{%- else -%}{{- raise_exception('unknown role: ' + message['role']) -}}",
                  "{%- endif -%}", "{%- endfor -%}",
                  "{%- if add_generation_prompt -%}"
                  f"{{{{- {_jinja_string(self.marker('assistant') + chr(10))} -}}}}"
                  "{%- endif -%}"]
        return "\n".join(lines)


def _jinja_string(text: str) -> str:
    """``text`` as a Jinja string literal (single-quoted, Python's escapes)."""
    escaped = text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")
    return f"'{escaped}'"


def _merge(pieces: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
    """Join neighbouring pieces with the same target flag."""
    out: list[tuple[str, bool]] = []
    for text, target in pieces:
        if out and out[-1][1] == target:
            out[-1] = (out[-1][0] + text, target)
        else:
            out.append((text, target))
    return out


def check_messages(messages: Sequence[Message], where: str = "messages") -> None:
    """Every message is a dict with a known role and a string content; a system message may
    only come first. Errors name the message's index."""
    if not messages:
        raise DataError(f"{where}: a conversation needs at least one message")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("content"), str):
            raise DataError(f"{where}[{i}]: each message needs a 'role' and a text 'content'")
        if m.get("role") not in ROLES:
            raise DataError(f"{where}[{i}]: unknown role {m.get('role')!r}; roles are "
                            f"{', '.join(ROLES)}")
        if m["role"] == "system" and i != 0:
            raise DataError(f"{where}[{i}]: a system message can only come first")


DEFAULT_TEMPLATE = "scratchgpt-chat-v1"
TEMPLATES: dict[str, ChatTemplate] = {
    DEFAULT_TEMPLATE: ChatTemplate(
        DEFAULT_TEMPLATE,
        (("system", "<|system|>"), ("user", "<|user|>"), ("assistant", "<|assistant|>")),
        "<|end|>"),
}


def system_message(text: str | None) -> str | None:
    """A ``--system`` flag's message: None where it is missing, empty or whitespace (a
    conversation then opens with no system turn, as the model was trained on such)."""
    return text if text is not None and text.strip() else None


def template_for(source: Any) -> ChatTemplate | None:
    """The chat template a model was fine-tuned with, or None (a model that cannot chat).

    ``source`` is the :class:`~scratchgpt.checkpoints.io.ModelSource` that ``load_model``
    returns: a checkpoint or a Hugging Face directory (or None)."""
    name = _template_name(source)
    if name is None:
        return None
    if name not in TEMPLATES:
        raise DataError(f"{source.path}: unknown chat template {name!r}")
    return TEMPLATES[name]


def _template_name(source: Any) -> str | None:
    """The template's name in the checkpoint's data or the Hugging Face directory's config."""
    if source is None:
        return None
    if source.checkpoint is not None:
        return source.checkpoint.data.get("chat_template")
    from scratchgpt.checkpoints.hf import hf_chat_template

    return hf_chat_template(source.hf_dir, source.hf_config)
