"""StreamText hands out a row's text as it becomes final: the pieces must join to
``StopRule.text`` of the same tokens, end at token boundaries, never show part of a stop
string or half a UTF-8 character, and never need taking back."""

from __future__ import annotations

import random

import pytest

from scratchgpt.generation.stopping import StopRule, StreamText

ALPHABET = "ab c\né€"  # 1-, 2- and 3-byte characters


def random_tokens(rng: random.Random, vocab: list[bytes], n_chars: int) -> list[int]:
    """A random text cut into tokens of 1-3 bytes (so tokens split characters), as ids into
    ``vocab`` (which grows as needed)."""
    data = "".join(rng.choice(ALPHABET) for _ in range(n_chars)).encode()
    ids, i = [], 0
    while i < len(data):
        size = rng.randint(1, 3)
        piece = data[i:i + size]
        if piece not in vocab:
            vocab.append(piece)
        ids.append(vocab.index(piece))
        i += size
    return ids


def run_stream(rule: StopRule, tokens: list[int]) -> tuple[list[tuple[str, int]], list[int],
                                                             list[str]]:
    """Feed tokens as a server does until the rule ends the row or max_new_tokens is reached;
    the pieces handed out, the tokens fed, and the pieces handed out while the row ran on."""
    st, pieces, fed, running = StreamText(rule), [], [], []
    for t in tokens:
        fed.append(t)
        pieces.append(st.add(t))
        if not st.finished:
            running.append(pieces[-1][0])
        assert st.text == rule.decode(fed[:st.released]) or st.finished  # token boundaries
        if st.finished or len(fed) >= rule.max_new_tokens:
            break
    pieces.append(st.finish())
    assert st.finish() == ("", 0)
    return pieces, fed, running


@pytest.mark.parametrize("seed", range(40))
def test_pieces_join_to_the_rules_text(seed):
    rng = random.Random(seed)
    vocab = [b"<eot>"]  # id 0: end of text

    def decode(ids):
        return b"".join(vocab[i] for i in ids).decode("utf-8", errors="replace")

    tokens = random_tokens(rng, vocab, 60)
    if seed % 3 == 0:
        tokens.insert(rng.randrange(len(tokens)), 0)
    stops = tuple(rng.sample(["c", "é€", "b a", "\n\n", "€€€"], rng.randint(0, 2)))
    rule = StopRule(rng.randint(5, 80), eos_id=0, stop_strings=stops, decode=decode)
    pieces, fed, running = run_stream(rule, tokens)
    text = "".join(p for p, _ in pieces)
    assert text == rule.text(fed)
    assert sum(n for _, n in pieces) <= len(fed)
    # the tokens spell valid UTF-8 (only the end of the row may cut a character): no piece
    # handed out while the row runs shows half a character
    assert not any("\ufffd" in p for p in running)
    shown = ""
    for piece, _ in pieces:  # nothing handed out is ever part of a stop string later
        shown += piece
        assert not any(s in shown for s in stops)


def test_a_stop_string_split_over_tokens_is_held_back_then_cut():
    vocab = ["he", "llo", " wo", "r", "ld", "!"]
    rule = StopRule(20, stop_strings=("world",), decode=lambda ids: "".join(vocab[i] for i in ids))
    st = StreamText(rule)
    out = [st.add(i) for i in range(5)]
    # " wo" might begin "world": held back until "ld" completes it, then cut
    assert "".join(p for p, _ in out) == "hello " and st.finished
    assert "".join(p for p, _ in out) == rule.text(list(range(5)))
