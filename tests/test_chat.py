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


def _cut_reply(text: str, max_new_tokens: int) -> tuple[str, list[tuple[str, int]]]:
    """A reply of one token a character, cut after ``max_new_tokens`` of ``text``'s: its
    :class:`~scratchgpt.serve.reply.ReplyText` text and the pieces it handed out on the way (text,
    tokens), the last by ``finish``."""
    from scratchgpt.generation.stopping import StopRule
    from scratchgpt.serve.reply import ReplyText

    rule = StopRule(max_new_tokens, None, T.reply_stops, lambda ids: "".join(map(chr, ids)))
    reply = ReplyText(rule, T)
    pieces = []
    for token in map(ord, text[:max_new_tokens]):
        pieces.append(reply.add(token))
        if rule.done(reply.ids):
            break
    pieces.append(reply.finish())
    return reply.text, pieces


CUT_REPLIES = [
    ("ok<|end|>", 9, "ok"),  # it reached the marker
    ("ok<|end|>", 4, "ok"),  # cut while writing it: "ok<|"
    ("ok<|end|>", 8, "ok"),  # "ok<|end|" is all of it but its last character
    ("a <b", 3, "a <"),  # cut after a '<' of the text: it was left out, as "a "
    ("<", 1, "<"),
    ("ok<|end|>", 3, "ok<"),  # the model's own '<', as the above: nothing tells them apart
    ("x<<|e", 5, "x<"),
    ("plain text", 10, "plain text"),
    ("ok<|e<|end|>" + "x" * 9, 21, "ok<|e"),  # it ended at the marker: nothing more is cut
    ("ok<|user|>", 6, "ok"),  # cut while writing another role's marker: "ok<|us"
    ("ok<|assistant|>", 14, "ok"),  # "ok<|assistant|", the longest marker but one character
    ("ok<|system|>", 12, "ok"),  # it reached the marker
    ("ok<|s", 5, "ok"),
    ("x<<|u", 5, "x<"),
    # the line break the template writes before a role's marker line goes with the marker
    ("ok\n<|user|>\nhi", 11, "ok"),  # it reached the marker
    ("ok\n<|assistant|>", 15, "ok"),  # "ok\n<|assistant|": the longest held back
    ("ok\n<|us", 6, "ok"),  # cut while writing it
    ("ok\n<|", 5, "ok"),  # (the start of every marker)
    ("ok\n<", 4, "ok\n<"),  # a '<' alone is the text's own, and so its line break
    ("ok\n<|end|>", 10, "ok\n"),  # the end marker follows the reply: "ok\n" is its own
    ("ok\n<|e", 6, "ok\n"),
    ("ok\n\n<|user|>", 11, "ok\n"),  # one line break is the template's
]


@pytest.mark.parametrize("text, n, shown", CUT_REPLIES)
def test_a_reply_cut_while_writing_a_marker_leaves_it_out_but_a_lone_lt(text, n, shown):
    """A reply cut short (its length) while writing the end marker, or another role's marker
    (at which it stops too), was ending its turn; a '<' alone, a marker's first character, is
    as often the text's own (``a <``, ``<b>``) and is kept. Streamed, the pieces join to the
    text, and count the tokens they show."""
    whole, pieces = _cut_reply(text, n)
    assert whole == shown
    assert "".join(p for p, _ in pieces) == shown
    assert sum(k for _, k in pieces) == len(shown)  # (a token a character)


@pytest.mark.parametrize("text, n, shown", CUT_REPLIES)
def test_a_replys_whole_text_is_what_its_streamed_pieces_join_to(text, n, shown):
    """``sample --chat`` prints a reply whole (``--no-stream``, ``--num-samples``, ``--beam``)
    through ``reply_text``: the text ``chat`` and ``serve`` stream for the same tokens."""
    from scratchgpt.generation.stopping import StopRule
    from scratchgpt.serve.reply import reply_text

    rule = StopRule(n, None, T.reply_stops, lambda ids: "".join(map(chr, ids)))
    ids = list(map(ord, text[:n]))
    assert reply_text(rule, T, ids) == _cut_reply(text, n)[0] == shown
