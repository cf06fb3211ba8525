"""The one decode loop, the cache interface every model implements, the slide rule and the
stop rule."""

from __future__ import annotations

import pytest
import torch

from scratchgpt.errors import ScratchGPTError
from scratchgpt.generation.beam import beam_search
from scratchgpt.generation.decode import (
    decode_n_tokens,
    prefill,
    prefill_rows,
    slide_keep,
    window_start,
)
from scratchgpt.generation.generate import generate, generate_batch, stream
from scratchgpt.generation.sampling import SamplingConfig
from scratchgpt.generation.stopping import StopRule
from scratchgpt.models import build_model, model_config
from scratchgpt.models.cache import DecodeCache
from scratchgpt.models.gpt import GPT, GPTConfig

GREEDY = SamplingConfig(temperature=0)


def sharp(model):
    """Scale the weights up so an untrained model has peaked, prompt-dependent predictions
    (greedy choices far from ties)."""
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    return model.eval()


def models() -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=17, block_size=24, n_layer=2, n_head=2, n_embd=16))
    with torch.no_grad():
        gpt.lm_head.weight.mul_(20)
    out = {"gpt": gpt.eval(), "bigram": sharp(build_model(model_config("bigram", vocab_size=17)))}
    for cell in ("rnn", "lstm", "gru"):
        out[cell] = sharp(build_model(model_config(cell, vocab_size=17, hidden=12, n_layer=2)))
    return out


MODELS = models()


def alone(model, prompt: list[int], n: int) -> list[int]:
    return generate(model, torch.tensor([prompt]), n, GREEDY)[0, len(prompt):].tolist()


@pytest.mark.parametrize("name", list(MODELS))
def test_every_cache_implements_the_interface(name):
    cache = MODELS[name].new_cache(3)
    assert isinstance(cache, DecodeCache) and cache.batch_size == 3 and cache.pos == 0
    assert cache.rewinds == (name not in ("rnn", "lstm", "gru"))


@pytest.mark.parametrize("name", list(MODELS))
def test_left_padded_batch_equals_each_prompt_alone(name):
    """Recurrent states too: padding positions leave a row's state untouched."""
    model = MODELS[name]
    prompts = [[1, 2, 3], list(range(4, 13)), [7], [14, 15, 16, 0, 5]]
    got = generate_batch(model, prompts, 10, GREEDY)
    assert got == [alone(model, p, 10) for p in prompts]


@pytest.mark.parametrize("name", list(MODELS))
def test_select_rows_copies_and_drops_rows(name):
    """Row i continues from old row rows[i]: continuing rows [2, 2, 0] gives the logits that
    rows 2, 2 and 0 would give on their own."""
    model = MODELS[name]
    prompts = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    with torch.no_grad():
        cache = model.new_cache(3)
        model(prompts, cache=cache)
        cache.select_rows(torch.tensor([2, 2, 0]))
        assert cache.batch_size == 3
        nxt = torch.tensor([[10], [11], [12]])
        got = model(nxt, cache=cache)[:, -1]
        ref = model(torch.cat([prompts[[2, 2, 0]], nxt], 1))[:, -1]
    assert torch.allclose(got, ref, atol=1e-5)


def test_replace_rows_puts_rows_prefilled_apart_in_place_and_reserve_keeps_the_rest():
    """Rows 0 and 2 of a 3-row cache become the rows of a cache prefilled apart (two prompts
    of different lengths, left-padded there), aligned at their ends; row 1 is untouched, and a
    cache that reserved more slots than the context computes as before. The next token of
    each row then gives the logits of a full forward over what that row now holds."""
    model = MODELS["gpt"]
    ctx = model.config.block_size
    prompts = torch.tensor([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12], [13, 14, 15, 16, 0, 1]])
    with torch.no_grad():
        cache = model.new_cache(3)
        model(prompts, cache=cache)
        cache.reserve(ctx + 6)
        cache.reserve(ctx)  # (less than it holds: nothing changes)
        assert cache.max_len == ctx + 6 and cache.pos == 6
        fresh = model.new_cache(2)
        prefill_rows(model, fresh, [[9, 10, 11], [5]])
        cache.replace_rows(torch.tensor([0, 2]), fresh)
        assert cache.pad_counts().tolist() == [3, 0, 5]
        got = model(torch.tensor([[12], [13], [14]]), cache=cache)[:, -1]
        rows = [[9, 10, 11, 12], [7, 8, 9, 10, 11, 12, 13], [5, 14]]
        ref = [model(torch.tensor([r]))[0, -1] for r in rows]
    assert torch.allclose(got, torch.stack(ref), atol=1e-5)
    with pytest.raises(ValueError, match=r"cannot put 2 rows of 3 slots in place of rows \[1\]"):
        cache.replace_rows(torch.tensor([1]), fresh)


def test_slide_rule():
    assert slide_keep(128) == 96 and slide_keep(8) == 6 and slide_keep(3) == 3
    assert window_start(0, 24, 24) == 0  # fits exactly
    assert window_start(0, 25, 24) == 25 - 18  # slid: the newest 3/4 of the context stay
    assert window_start(7, 31, 24) == 7 and window_start(7, 32, 24) == 32 - 18
    assert window_start(0, 10**6, None) == 0  # no context limit


def test_long_generation_slides_like_a_recompute_of_the_window():
    """Past the context, each token is the argmax of a full forward over the window the rule
    keeps."""
    model = MODELS["gpt"]
    ctx = model.config.block_size
    prompt = [1, 2, 3, 4, 5]
    out = alone(model, prompt, 50)
    seq, start = list(prompt), 0
    with torch.no_grad():
        for _ in range(50):
            start = window_start(start, len(seq), ctx)
            seq.append(int(model(torch.tensor([seq[start:]]))[0, -1].argmax()))
    assert out == seq[len(prompt):]


def test_stream_stops_with_the_rule_and_refuses_per_row_stops_in_a_batch():
    model = MODELS["gpt"]
    full = alone(model, [3, 1], 20)
    eos = full[5]
    got = [int(t) for t in stream(model, torch.tensor([[3, 1]]), StopRule(20, eos_id=eos),
                                  GREEDY)]
    assert got == full[: full.index(eos) + 1]
    with pytest.raises(ScratchGPTError, match="generate_batch"):
        next(stream(model, torch.tensor([[3, 1], [2, 2]]), StopRule(5, eos_id=eos), GREEDY))


def test_decode_n_tokens_is_the_loop_and_returns_the_sampling_distributions():
    model = MODELS["gpt"]
    prompt = torch.tensor([[5, 6, 7]])
    cfg = SamplingConfig(temperature=0.9, top_k=5)
    with torch.no_grad():
        cache = model.new_cache(1)
        tokens, probs = decode_n_tokens(model, cache, prompt, 6, cfg,
                                        torch.Generator().manual_seed(3))
    assert tokens.shape == (1, 6) and probs.shape == (1, 6, 17)
    assert cache.pos == 3 + 5  # every token but the last was fed
    assert torch.equal(tokens[0], torch.cat(list(stream(model, prompt, 6, cfg,
                                                        torch.Generator().manual_seed(3)))))
    assert torch.all((probs > 0).sum(-1) <= 5)  # top-k applied
    seq = torch.cat([prompt, tokens], 1)
    with torch.no_grad():
        ref = torch.softmax(model(seq)[0, 2:-1] / 0.9, -1)
    kept = probs[0] > 0
    assert torch.allclose(probs[0][kept], (ref * kept / (ref * kept).sum(-1, keepdim=True))[kept],
                          atol=1e-5)
    with torch.no_grad():
        greedy, none = decode_n_tokens(model, model.new_cache(1), prompt, 6, GREEDY)
    assert none is None and greedy[0].tolist() == alone(model, [5, 6, 7], 6)


def test_scoring_many_positions_equals_a_full_forward():
    """The KV cache's mask for several new positions (the speculative scoring call)."""
    model = MODELS["gpt"]
    seq = torch.randint(0, 17, (1, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        cache = model.new_cache(1)
        prefill(model, cache, seq[:, :12])
        part = model(seq[:, 12:], cache=cache)
        full = model(seq)
    assert torch.allclose(part, full[:, 12:], atol=1e-5)


# ---- the stop rule ----

WORDS = ["<eot>", "ab", "c", "d", "cd", "é", "xyz"]


def decode_words(ids):
    return "".join(WORDS[i] for i in ids)


def test_stop_rule_finds_strings_spanning_tokens_and_cuts_the_text():
    rule = StopRule(50, eos_id=0, stop_strings=("bcd",), decode=decode_words)
    assert not rule.done([1]) and not rule.done([1, 2])
    assert rule.done([1, 2, 3])  # "ab" "c" "d" -> "abcd" holds "bcd"
    assert rule.done([6, 6, 6, 6, 6, 1, 4])  # only the tail is decoded, and that suffices
    assert rule.text([6, 1, 4]) == "xyza"
    assert rule.done([6, 0]) and rule.text([6, 0]) == "xyz"  # end-of-text is not text
    assert rule.done([6] * 50) and not rule.done([6] * 49)  # max_new_tokens
    assert StopRule.of(7) == StopRule(7) and not StopRule(7).per_row
    with pytest.raises(ScratchGPTError, match="decode"):
        StopRule(5, stop_strings=("x",))


def _speculative(model, prompt):
    from scratchgpt.generation.speculative import speculative_generate

    return speculative_generate(model, model, prompt, 2, GREEDY, 4)


GENERATORS = {
    "generate": lambda model, prompt: generate(model, prompt, 4, GREEDY),
    "beam_search": lambda model, prompt: beam_search(model, prompt, 2, 4),
    "speculative": _speculative,
}
BAD_PROMPTS = {  # what the prompt is -> what the error says
    "one row of shape (T,)": (torch.tensor([1, 2]), r"\(batch, length\) tensor .* shape \(2,\)"),
    "a list": ([[1, 2]], r"\(batch, length\) tensor .* got list"),
    "float ids": (torch.tensor([[1.0, 2.0]]), "token ids are integers, got a torch.float32"),
    "an id past the vocabulary": (torch.tensor([[1, 17]]), r"token id 17, outside .* 17 ids"),
    "a negative id": (torch.tensor([[-1, 2]]), "token id -1, outside the model's vocabulary"),
}


@pytest.mark.parametrize("what", BAD_PROMPTS)
@pytest.mark.parametrize("how", GENERATORS)
def test_a_prompt_that_is_not_token_ids_of_the_model_is_refused_by_what_it_is(how, what):
    """A (T,) prompt was told it 'must contain at least one token'; a list, float ids and ids
    outside the vocabulary failed inside Python or torch's embedding."""
    prompt, message = BAD_PROMPTS[what]
    with pytest.raises(ScratchGPTError, match=message):
        GENERATORS[how](MODELS["gpt"], prompt)


def test_generate_batch_checks_ids_and_takes_a_tensor_of_rows():
    with pytest.raises(ScratchGPTError, match="token id 40, outside"):
        generate_batch(MODELS["gpt"], [[1, 2], [40]], 3, GREEDY)
    rows = torch.tensor([[1, 2], [3, 4]])
    assert generate_batch(MODELS["gpt"], rows, 3, GREEDY) == \
        generate_batch(MODELS["gpt"], rows.tolist(), 3, GREEDY)


def test_stop_rule_refuses_one_string_given_as_its_stop_strings():
    """A string is a sequence of strings too: "\n\n" stopped at the first newline."""
    with pytest.raises(ScratchGPTError, match=r"stop_strings .* write \('\\n\\n',\)"):
        StopRule(50, stop_strings="\n\n", decode=decode_words)


@pytest.mark.parametrize("n", [2.5, "5", True])
def test_a_number_of_new_tokens_that_is_not_an_int_is_refused_by_name(n):
    """2.5 failed inside torch, sizing the cache; "5" in a comparison; True made 1."""
    with pytest.raises(ScratchGPTError, match=f"max_new_tokens must be int, got {n!r}"):
        generate(MODELS["gpt"], torch.tensor([[1, 2]]), n, GREEDY)


def test_beam_search_ends_hypotheses_with_the_rule():
    model = MODELS["gpt"]
    prompt = torch.tensor([[4, 5]])
    free = beam_search(model, prompt, 3, 6)
    eos = free[0][0][2]
    hyps = beam_search(model, prompt, 3, StopRule(6, eos_id=eos))
    for tokens, _ in hyps:
        assert eos not in tokens[:-1] and (tokens[-1] == eos or len(tokens) == 6)
    assert any(tokens[-1] == eos for tokens, _ in hyps)


@pytest.mark.parametrize("n", [1, 2])
def test_a_beam_wider_than_the_vocabulary_ranks_every_continuation_once(n):
    """Beams beyond the vocabulary (the first step has only V continuations to keep; the
    rest start dead and never win): over n new tokens the search returns every one of the
    V ** n continuations once, ranked as scoring each of them in full ranks them (Hugging
    Face's search repeats hypotheses when it has fewer than its beams)."""
    import itertools

    model, prompt, vocab = MODELS["gpt"], [4, 5], 17
    hyps = beam_search(model, torch.tensor([prompt]), vocab ** n + 20, n)
    with torch.no_grad():
        def logprob(cont):
            logits = model(torch.tensor([prompt + list(cont)]))[0, len(prompt) - 1:-1]
            return float(torch.log_softmax(logits, -1)[range(n), list(cont)].sum()) / n
        truth = sorted(itertools.product(range(vocab), repeat=n), key=logprob, reverse=True)
    assert len(hyps) == vocab ** n
    assert [tuple(tokens) for tokens, _ in hyps[:20]] == truth[:20]
    assert {tuple(tokens) for tokens, _ in hyps} == set(truth)
    assert [s for _, s in hyps[:20]] == pytest.approx([logprob(c) for c in truth[:20]],
                                                      abs=1e-4)


@pytest.mark.parametrize("penalty", [1.0, 2.0])
def test_beam_search_finds_the_hypotheses_transformers_finds(tmp_path, penalty):
    """The same GPT-2 weights, the same end-of-text: our beam search returns the texts and
    scores of transformers' generate(num_beams) (its default stopping rule), search after
    search, including those where endings ranked below the best ``beam`` extensions come up
    (they are not hypotheses), where the last beams end on the last step (the live ones still
    compete), and where a live beam goes on to beat what had ended once ``beam`` had (a
    search stopped there returned a worse best text in about a third of these)."""
    transformers = pytest.importorskip("transformers")
    from scratchgpt.checkpoints.hf import save_hf
    from tests.tiny_gpt import sharp_gpt

    model = sharp_gpt(scale=1.5, block_size=32)  # flat enough for endings to compete
    hf = transformers.GPT2LMHeadModel.from_pretrained(save_hf(model, tmp_path / "hf")).eval()
    beam, n, ended = 3, 10, 0
    for seed in range(120):
        prompt = torch.randint(0, 29, (1, 4), generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            eos = int(model(prompt)[0, -1].topk(4).indices[seed % 4])
        ours = beam_search(model, prompt, beam, StopRule(n, eos_id=eos),
                           length_penalty=penalty)[:beam]
        out = hf.generate(prompt, num_beams=beam, num_return_sequences=beam, max_new_tokens=n,
                          eos_token_id=eos, pad_token_id=eos, do_sample=False,
                          length_penalty=penalty, return_dict_in_generate=True,
                          output_scores=True)
        theirs = [t[4:].tolist() for t in out.sequences]
        theirs = [t[:t.index(eos) + 1] if eos in t else t for t in theirs]
        assert [tokens for tokens, _ in ours] == theirs, seed
        assert [score for _, score in ours] == pytest.approx(out.sequences_scores.tolist(),
                                                              abs=1e-4)
        ended += sum(t[-1] == eos for t in theirs)
    assert ended > 25  # endings took part


@pytest.mark.parametrize("kind", ["gpt", "bigram", "lstm", "numpy"])
def test_prefill_runs_the_head_on_the_last_position_only(kind):
    """``last_only`` gives the last row of the full logits, and the cache advances as far."""
    from scratchgpt.generation.decode import prefill
    from scratchgpt.generation.numpy_engine import NumpyGPT
    from scratchgpt.models import build_model, model_config

    torch.manual_seed(0)
    sizes = {"gpt": dict(n_layer=2, n_head=2, n_embd=16, block_size=32),
             "bigram": {}, "lstm": dict(n_layer=1, hidden=16), "numpy": dict(
                 n_layer=1, n_head=2, n_embd=16, block_size=32)}[kind]
    model = build_model(model_config("gpt" if kind == "numpy" else kind, vocab_size=23,
                                     **sizes)).eval()
    if kind == "numpy":
        model = NumpyGPT(model)
    idx = torch.randint(0, 23, (2, 7))
    with torch.no_grad():
        full_cache, last_cache = model.new_cache(2), model.new_cache(2)
        full = model(idx, cache=full_cache)  # (2, 7, V)
        last = prefill(model, last_cache, idx)  # (2, V)
        assert last.shape == (2, 23)
        assert torch.allclose(last, full[:, -1], atol=1e-6)
        assert last_cache.pos == full_cache.pos == 7
        nxt = torch.randint(0, 23, (2, 1))  # the caches hold the same state
        assert torch.allclose(model(nxt, cache=last_cache), model(nxt, cache=full_cache),
                              atol=1e-6)


@pytest.mark.parametrize("cfg", [None, {"temperature": 0.8}])
def test_sampling_settings_that_are_not_a_sampling_config_are_refused_by_name(cfg):
    """generate(..., None) failed at the first step with "'NoneType' object has no attribute
    'greedy'"; a dict of settings the same way."""
    with pytest.raises(ScratchGPTError, match=r"cfg is a SamplingConfig .* got "
                                              f"{type(cfg).__name__}"):
        generate(MODELS["gpt"], torch.tensor([[1, 2]]), 3, cfg)
    with pytest.raises(ScratchGPTError, match="cfg is a SamplingConfig"):
        generate_batch(MODELS["gpt"], [[1, 2]], 3, cfg)


def test_stream_text_is_the_rules_text_of_streams_tokens_and_refuses_what_it_cannot_stream():
    """stream_text's pieces join to StopRule.text of the tokens stream yields: no end-of-text
    token, cut before a stop string; it needs a decode function and one prompt."""
    from scratchgpt.generation.generate import stream_text

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=17, block_size=24, n_layer=1, n_head=2, n_embd=16)).eval()
    prompt, cfg = torch.tensor([[3, 1]]), SamplingConfig(1.0)  # a flat model: varied tokens
    letters = [chr(ord("a") + i) * (1 + i % 3) for i in range(17)]  # tokens of 1-3 letters

    def spell(ids):
        return "".join(letters[i] for i in ids)

    def seeded():
        return torch.Generator().manual_seed(0)

    full = [int(t) for t in stream(model, prompt, 20, cfg, seeded())]
    eos, stop = full[12], spell(full[6:8])
    texts = []
    for rule in (StopRule(20, decode=spell), StopRule(20, eos_id=eos, decode=spell),
                 StopRule(20, stop_strings=(stop,), decode=spell)):
        tokens = [int(t) for t in stream(model, prompt, rule, cfg, seeded())]
        pieces = list(stream_text(model, prompt, rule, cfg, seeded()))
        assert "".join(pieces) == rule.text(tokens) and all(pieces)
        assert len(pieces) > 1
        texts.append("".join(pieces))
    assert texts[0] == spell(full) and len(texts[1]) < len(texts[0]) > len(texts[2])
    assert stop not in texts[2] and texts[0].startswith(texts[2])
    assert "".join(stream_text(model, prompt, 20, cfg, seeded(), decode=spell)) == spell(full)
    with pytest.raises(ScratchGPTError, match="decode=tok.decode"):
        next(stream_text(model, prompt, 20, cfg))
    with pytest.raises(ScratchGPTError, match="one prompt"):
        next(stream_text(model, torch.tensor([[3, 1], [2, 2]]), 5, cfg, decode=spell))
