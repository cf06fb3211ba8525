"""The chat template: rendering, target segments and message checks."""

import doctest

import pytest

import scratchgpt.chat as chat
from scratchgpt.errors import DataError

T = chat.TEMPLATES[chat.DEFAULT_TEMPLATE]
CONVERSATION = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "2 + 2?"},
                {"role": "assistant", "content": "4"},
                {"role": "user", "content": "and 3 + 3?"},
                {"role": "assistant", "content": "6"}]


def test_docstring_examples():
    assert doctest.testmod(chat).failed == 0


def test_segments_join_to_the_rendered_text_and_only_replies_are_targets():
    pieces = T.segments(CONVERSATION)
    assert "".join(t for t, _ in pieces) == T.render(CONVERSATION, add_generation_prompt=False)
    assert [t for t, target in pieces if target] == ["4" + T.end, "6" + T.end]


def test_generation_prompt_ends_where_the_reply_starts():
    text = T.render(CONVERSATION[:2])
    assert text.endswith("<|assistant|>\n") and text.count(T.stop) == 0


@pytest.mark.parametrize("bad,message", [
    ([], "at least one"),
    ([{"role": "robot", "content": "hi"}], "unknown role 'robot'"),
    ([{"role": "user"}], "text 'content'"),
    ([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}], r"\[1\]"),
])
def test_bad_messages_are_one_line_errors(bad, message):
    with pytest.raises(DataError, match=message):
        T.render(bad)
