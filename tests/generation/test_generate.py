"""Batched generation equals generating each prompt alone; overflow slides the window."""

from __future__ import annotations

import torch

from scratchgpt.generation.generate import generate, generate_batch
from scratchgpt.generation.sampling import SamplingConfig
from scratchgpt.generation.stopping import StopRule
from scratchgpt.models.bigram import BigramConfig, BigramLM
from scratchgpt.models.fast_decode import prepare_for_decode
from scratchgpt.models.gpt import GPT, GPTConfig, KVCache
from tests.tiny_gpt import sharp_gpt

GREEDY = SamplingConfig(temperature=0)


def tiny(block_size: int = 48) -> GPT:
    return sharp_gpt(vocab_size=37, block_size=block_size, n_head=4, n_embd=32)


def alone(model, prompt: list[int], n: int | StopRule) -> list[int]:
    return generate(model, torch.tensor([prompt]), n, GREEDY)[0, len(prompt):].tolist()


def test_batch_of_different_lengths_equals_each_prompt_alone():
    model = tiny()
    prompts = [[1, 2, 3], list(range(5, 16)), [7], [30, 31, 32, 33, 34, 35]]
    got = generate_batch(model, prompts, 20, GREEDY)
    assert got == [alone(model, p, 20) for p in prompts]


def test_rows_stop_on_eos_and_stop_strings_independently():
    model = tiny()
    prompts = [[1, 2, 3], list(range(5, 16)), [7]]
    full = generate_batch(model, prompts, 12, GREEDY)
    eos = full[0][4]
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJK"  # token i <-> letters[i]
    stop_text = letters[full[2][1]] + letters[full[2][2]]  # row 2's new tokens 2-3

    def decode(ids):
        return "".join(letters[i] for i in ids)

    rule = StopRule(12, eos_id=eos, stop_strings=(stop_text,), decode=decode)
    stopped = generate_batch(model, prompts, rule, GREEDY)
    for b, (f, s) in enumerate(zip(full, stopped, strict=True)):
        ends = [i + 1 for i in range(len(f)) if f[i] == eos or stop_text in decode(f[:i + 1])]
        cut = min(ends, default=len(f))
        assert s == f[:cut], b
    assert len(stopped[2]) <= 3  # the stop string ended row 2 at its third token at the latest
    assert stop_text not in rule.text(stopped[2]) and eos not in stopped[0][:-1]


def test_batch_overflow_slides_like_stream():
    model = tiny(block_size=16)
    prompt = list(range(1, 11))
    got = generate_batch(model, [prompt, prompt], 30, GREEDY)
    assert got[0] == got[1] == alone(model, prompt, 30)


def test_bigram_batches_too():
    torch.manual_seed(0)
    model = BigramLM(BigramConfig(vocab_size=20)).eval()
    got = generate_batch(model, [[1, 2], [3]], 5, GREEDY)
    assert got == [alone(model, [1, 2], 5), alone(model, [3], 5)]


def reads_its_context() -> GPT:
    """A GPT (context 16) whose weights are tripled: its greedy texts read the context and do
    not settle into one repeated token."""
    torch.manual_seed(1)
    model = GPT(GPTConfig(vocab_size=37, block_size=16, n_layer=2, n_head=4, n_embd=32))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3)
    return model.eval()


def test_a_batch_past_the_context_equals_each_prompt_alone():
    """Prompts of different lengths, generated past the context: each row slides its window
    when it would alone (its own length fills the context), not when the padded batch's
    does, so every row is its prompt's greedy text alone, token for token. A shorter row slid
    with the longest one, keeping 3/4 of a context counted with its padding: other tokens
    than alone from that step on. (A GPT whose weights are tripled reads its context: its
    greedy texts do not settle into one repeated token.)"""
    model = reads_its_context()
    prompts = [list(range(1, 15)), [7], [3, 4, 5, 6, 7, 8], list(range(20, 36)), [9, 9]]
    got = generate_batch(model, prompts, 40, GREEDY)
    assert got == [alone(model, p, 40) for p in prompts]
    assert all(len(set(g[16:])) > 3 for g in got)  # (past the context, varied texts)
    # rows that end leave between slides: an end-of-text token that ends some rows, one of
    # them past the context
    eos = next(t for t in range(37) if 1 < sum(t in g for g in got) < len(prompts)
               and any(t in g[16:] and t not in g[:16] for g in got))
    rule = StopRule(40, eos_id=eos)
    ended = generate_batch(model, prompts, rule, GREEDY)
    assert ended == [alone(model, p, rule) for p in prompts]
    assert 1 < sum(len(e) < 40 for e in ended) < len(prompts)


def test_rows_that_slide_together_and_apart_equal_each_prompt_alone_on_the_c_step():
    """The model as ``sample`` prepares it (its one-token steps in C where this CPU has the
    kernel): two rows of one length slide on the same step while the others go on, a prompt
    longer than the context and rows of one and two tokens on steps of their own; a row that
    slid is prefilled alone and put in place of its row of the cache."""
    model = prepare_for_decode(reads_its_context(), "fp32")
    prompts = [list(range(1, 13)), list(range(21, 33)), [7], list(range(2, 22)), [9, 9],
               [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]]
    got = generate_batch(model, prompts, 45, GREEDY)
    assert got == [alone(model, p, 45) for p in prompts]
    assert got[0] != got[1] and all(len(set(g[16:])) > 3 for g in got)


def noted(method, calls: list[str]):
    """``method`` that first appends its name to ``calls``."""
    def call(self, *args):
        calls.append(method.__name__)
        return method(self, *args)
    return call


def test_a_batch_past_the_context_copies_its_cache_once_a_quarter_context(monkeypatch):
    """Rows that slide on different steps are prefilled alone and written over their own rows
    of the cache; the padding they leave is dropped once every quarter context or so. Each
    slide copied the whole cache twice or three times (rows selected, the slid ones appended
    after them, the padding trimmed): 8 rows of a 16-token context slide every other step."""
    copies: list[str] = []
    for name in ("select_rows", "append_rows", "trim"):
        monkeypatch.setattr(KVCache, name, noted(getattr(KVCache, name), copies))
    model = reads_its_context()
    prompts = [list(range(3, 19 - i)) for i in range(8)]  # 16 .. 9 tokens
    got = generate_batch(model, prompts, 48, GREEDY)
    assert 2 <= len(copies) <= 48 // 4 + 1, copies
    assert set(copies) == {"trim"}
    assert got == [alone(model, p, 48) for p in prompts]
