"""``scratchgpt sample --chat`` shows a reply cut short as ``scratchgpt chat`` and ``serve`` do.

The tiny chat model of ``tests/serve/models.py`` answers ``ok<|end|>``: cut by
``--max-new-tokens`` (or Ctrl-C) while it writes the end marker, every way ``sample`` prints a
reply (streamed, ``--no-stream``, ``--num-samples``, ``--beam``, ``--draft``) must show the
text :class:`~scratchgpt.serve.reply.ReplyText` gives for the same tokens (``ok<|e`` is
``ok``, ``ok<`` stays).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.commands.test_cli import _stopped_after
from tests.commands.test_sample_beam import _interrupted_after
from tests.finetune.conftest import run_cli
from tests.serve.models import REPLY, TEMPLATE, save_run, train_chat_gpt

MESSAGES = [{"role": "user", "content": "the king"}]
CUTS = (3, 4, 5, 6, 8)  # "ok<", "ok<|", "ok<|e", "ok<|en", "ok<|end|": all but the first ended
SEP = "\n---------------\n"


@pytest.fixture(scope="module")
def chat(tmp_path_factory) -> tuple[Path, torch.nn.Module, object]:
    """(run directory, model, tokenizer) of the tiny chat model."""
    model, tok = train_chat_gpt()
    return save_run(model, tok, tmp_path_factory.mktemp("runs") / "chatty"), model, tok


def _rule(tok, max_new_tokens: int):
    from scratchgpt.generation.stopping import StopRule

    return StopRule(max_new_tokens, tok.eot_id, TEMPLATE.reply_stops, tok.decode)


def _prompt(tok) -> torch.Tensor:
    from scratchgpt.finetune.instruct import encode_conversation

    (ids, _), _ = encode_conversation(tok, TEMPLATE, MESSAGES, add_generation_prompt=True)
    return torch.tensor([ids], dtype=torch.long)


def _as_chat_shows(rule, ids: list[int]) -> str:
    """The text ``scratchgpt chat`` streams for these reply tokens under ``rule``."""
    from scratchgpt.serve.reply import ReplyText

    reply = ReplyText(rule, TEMPLATE)
    pieces = [reply.add(t)[0] for t in ids]
    return "".join(pieces) + reply.finish()[0]


def _greedy_reply(model, tok) -> list[int]:
    """The model's greedy reply tokens: ``ok`` then the end marker (checked)."""
    from scratchgpt.generation.generate import stream
    from scratchgpt.generation.sampling import SamplingConfig

    rule = _rule(tok, 30)
    ids = [int(t[0]) for t in stream(model, _prompt(tok), rule, SamplingConfig(0.0))]
    assert rule.ends(ids) and rule.text(ids) == REPLY  # what the cuts below rely on
    return ids


def _sample(run: Path, capsys, *flags) -> tuple[int, str, str]:
    return run_cli(["sample", "--checkpoint", run, "--chat", "--prompt", MESSAGES[0]["content"],
                    *flags], capsys)


@pytest.mark.parametrize("flags, rows", [
    ([], 1), (["--no-stream"], 1), (["--num-samples", "2"], 2),
    (["--draft", "ngram"], 1), (["--draft", "ngram", "--no-stream"], 1)])
def test_a_reply_cut_while_ending_its_turn_prints_as_chat_shows_it(chat, capsys, flags, rows):
    """Streamed, printed at the end, several samples, speculative: "ok<|e" printed as such
    where chat and serve show "ok"."""
    run, model, tok = chat
    reply, prompt = _greedy_reply(model, tok), TEMPLATE.render(MESSAGES)
    cut_apart = 0
    for n in CUTS:
        code, out, err = _sample(run, capsys, "--temperature", "0", "--max-new-tokens", n,
                                 *flags)
        shown = _as_chat_shows(_rule(tok, n), reply[:n])
        assert code == 0, err
        assert out == SEP.join([prompt + shown + "\n"] * rows), n
        cut_apart += shown != tok.decode(reply[:n])
    assert cut_apart == len(CUTS) - 1  # every cut but "ok<" left the marker's start out


def test_beam_hypotheses_cut_while_ending_their_turn_print_as_chat_shows_them(chat, capsys):
    """Each of --beam's hypotheses is a reply: cut by the token limit, the start of the end
    marker it was writing is left out, as chat would show the same tokens."""
    from scratchgpt.generation.beam import beam_search

    run, model, tok = chat
    prompt = TEMPLATE.render(MESSAGES)
    cut_apart = 0
    for n in CUTS:
        code, out, err = _sample(run, capsys, "--beam", "2", "--num-samples", "2",
                                 "--max-new-tokens", n)
        rule = _rule(tok, n)
        hyps = beam_search(model, _prompt(tok), 2, rule)
        assert code == 0 and len(hyps) == 2, err
        shown = [_as_chat_shows(rule, ids) for ids, _ in hyps]
        assert out == SEP.join(prompt + s + "\n" for s in shown), n
        cut_apart += shown[0] != rule.text(hyps[0][0])
    assert cut_apart >= len(CUTS) - 1


@pytest.mark.parametrize("flags, rows", [
    ([], 1), (["--no-stream"], 1), (["--num-samples", "2"], 2),
    (["--draft", "ngram"], 1), (["--draft", "ngram", "--no-stream"], 1)])
def test_ctrl_c_while_the_reply_writes_its_end_marker_prints_it_as_chat_shows_it(
        chat, capsys, monkeypatch, flags, rows):
    """Ctrl-C after "ok<|e" (or "ok<|us", the start of another turn's marker, at which a
    reply stops too): the reply was ending its turn; every sampling path prints "ok" (a '<'
    alone stays: "ok<"), as chat does when a piped chat is stopped there."""
    run, _, tok = chat
    prompt = TEMPLATE.render(MESSAGES)
    for written, shown in (("ok<|e", "ok"), ("ok<|end|", "ok"), ("ok<", "ok<"),
                           ("ok<|us", "ok"), ("ok<|assistant|", "ok"), ("ok\n<|us", "ok"),
                           ("ok\n<|e", "ok\n")):
        with monkeypatch.context() as patch:
            _stopped_after(patch, tok.encode(written), rows=rows)
            code, out, err = _sample(run, capsys, *flags)
        assert code == 130 and err.endswith("scratchgpt sample: interrupted\n"), err
        assert shown == _as_chat_shows(_rule(tok, 500), tok.encode(written))
        assert out == SEP.join([prompt + shown + "\n"] * rows), written


def test_ctrl_c_mid_beam_search_prints_its_hypotheses_as_chat_shows_them(chat, capsys,
                                                                         monkeypatch):
    """Stopped after k steps, --beam prints the hypotheses it had (ended ones first) as
    replies: the start of the end marker a live one was writing is left out."""
    from scratchgpt.generation.beam import beam_search

    run, model, tok = chat
    prompt = TEMPLATE.render(MESSAGES)
    cut_apart = 0
    for k in CUTS:
        with monkeypatch.context() as patch:
            _interrupted_after(patch, k)
            code, out, err = _sample(run, capsys, "--beam", "2", "--num-samples", "2")
        rule = _rule(tok, k)
        hyps = beam_search(model, _prompt(tok), 2, rule)
        hyps = [h for h in hyps if rule.ends(h[0])] + [h for h in hyps if not rule.ends(h[0])]
        assert code == 130, err
        shown = [_as_chat_shows(rule, ids) for ids, _ in hyps]
        assert out == SEP.join(prompt + s + "\n" for s in shown), k
        cut_apart += shown != [rule.text(ids) for ids, _ in hyps]
    assert cut_apart >= len(CUTS) - 1


@pytest.mark.parametrize("written, reply", [("ok\n<|user|>\nthe king", "ok"),
                                             ("ok\n<|end|>", "ok\n"),
                                             ("ok<|assistant|>\nok", "ok")])
def test_a_reply_stops_where_the_model_writes_another_turn(chat, written, reply):
    """sample --chat stopped at the end marker alone: a reply that went on to write the next
    turn's marker was printed with it and the turn after, where chat and serve end it there.
    The line break before a role's marker line is the template's, as it holds the reply
    (before the end marker, the reply's own)."""
    import argparse

    from scratchgpt.checkpoints.io import load_for_generation
    from scratchgpt.commands.sample import chat_prompt
    from scratchgpt.generation.stopping import StopRule
    from scratchgpt.serve.reply import reply_text

    run, _, tok = chat
    _, source = load_for_generation(run, None, "sample")
    args = argparse.Namespace(checkpoint=run, system=None, unknown="error")
    _, _, rule, template = chat_prompt(args, source, tok, MESSAGES[0]["content"],
                                       StopRule(40, tok.eot_id, (), tok.decode))
    ids = tok.encode(written)
    n = next((n for n in range(1, len(ids) + 1) if rule.ends(ids[:n])), None)
    assert n is not None and reply_text(rule, template, ids[:n]) == reply
