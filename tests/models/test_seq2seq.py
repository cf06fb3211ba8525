"""Encoder-decoder models: decoding consistency, padding invariance, causality, learning."""

import pytest
import torch

from scratchgpt.data.translation import DataSpec
from scratchgpt.errors import ScratchGPTError
from scratchgpt.models.seq2seq import (
    ARCHS,
    FIRST_SLOTS,
    Seq2SeqConfig,
    TransformerSeq2Seq,
    build_seq2seq,
    padding_mask,
)
from scratchgpt.tokenizers.seq2seq import EOS_ID, PAD_ID, Seq2SeqTokenizer
from scratchgpt.training.config import TrainConfig
from scratchgpt.training.seq2seq import Seq2SeqTask, collate
from scratchgpt.training.trainer import Trainer

SRC_V, TGT_V = 13, 11


def _model(arch, seed=0):
    torch.manual_seed(seed)
    cfg = Seq2SeqConfig(arch, SRC_V, TGT_V, d_model=16, n_layer=2, n_head=2, d_ff=32,
                        dropout=0.0)
    m = build_seq2seq(cfg).eval()
    # Random weights decode near-uniform junk; sharpen the output layer so that the argmax is
    # decisive and EOS sometimes wins (exercises early stopping).
    with torch.no_grad():
        m.head.weight.mul_(8.0)
    return m


def _batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([6, 3, 5, 1])
    src = torch.randint(4, SRC_V, (4, 6), generator=g)
    src[padding_mask(lengths, 6)] = PAD_ID
    return src, lengths


@pytest.mark.parametrize("arch", ARCHS)
def test_beam_of_one_is_greedy(arch):
    m = _model(arch)
    src, lengths = _batch()
    g_tok, g_att = m.greedy_decode(src, lengths, max_len=7)
    b_tok, b_att = m.beam_decode(src, lengths, beam=1, max_len=7)
    assert g_tok == b_tok
    for a, b in zip(g_att, b_att, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("beam", [1, 3])
def test_batched_decode_equals_one_by_one(arch, beam):
    m = _model(arch)
    src, lengths = _batch()
    batched, att = m.beam_decode(src, lengths, beam=beam, max_len=7)
    for i in range(4):
        n = int(lengths[i])
        single, s_att = m.beam_decode(src[i : i + 1, :n], lengths[i : i + 1], beam, 7)
        assert single[0] == batched[i]
        assert att[i].shape == (len(batched[i]), n)
        torch.testing.assert_close(s_att[0], att[i], atol=1e-5, rtol=1e-4)


def test_beam_search_finds_higher_likelihood_than_greedy():
    m = _model("lstm-attention", seed=3)
    src, lengths = _batch(seed=4)

    def logprob(i, ids):
        tgt_in = torch.tensor([[1] + ids[:-1]])
        logp = m(src[i : i + 1], lengths[i : i + 1], tgt_in).log_softmax(-1)
        return float(logp[0, torch.arange(len(ids)), torch.tensor(ids)].sum())

    g, _ = m.greedy_decode(src, lengths, max_len=6)
    b, _ = m.beam_decode(src, lengths, beam=4, max_len=6, length_penalty=0.0)
    for i in range(4):
        if g[i][-1] == EOS_ID and b[i][-1] == EOS_ID:  # both complete hypotheses
            assert logprob(i, b[i]) >= logprob(i, g[i]) - 1e-4


def test_eval_decodes_with_the_length_penalty_it_is_given():
    """evaluate() scores what translate() writes, length penalty included (a penalty that
    changes the translations must change what is scored)."""
    from scratchgpt.training.seq2seq import evaluate, translate

    m = _model("lstm-attention")
    src_tok, tgt_tok = Seq2SeqTokenizer(list("abcdefghi")), Seq2SeqTokenizer(list("0123456"))
    sources = ["abc", "hgfedcba", "ii", "abcabcab", "defg", "a", "ghi", "bbbbbb"]
    pairs = [(s, "0") for s in sources]
    by_penalty = {}
    for penalty in (0.0, 1.0):
        texts, _, _ = translate(m, sources, src_tok, tgt_tok, 3, 8, length_penalty=penalty)
        ev = evaluate(m, pairs, src_tok, tgt_tok, beam=3, max_len=8, length_penalty=penalty)
        assert ev.predictions == texts
        by_penalty[penalty] = texts
    assert by_penalty[0.0] != by_penalty[1.0]


def test_translate_refuses_a_length_penalty_that_ranks_nothing():
    from scratchgpt.training.seq2seq import translate

    tok = Seq2SeqTokenizer(list("abcdefghi"))
    with pytest.raises(ScratchGPTError, match="finite"):
        translate(_model("lstm"), ["abc"], tok, tok, 2, 5, length_penalty=float("nan"))


@pytest.mark.parametrize("arch", ARCHS)
def test_padding_does_not_change_real_positions(arch):
    m = _model(arch)
    src, lengths = _batch()
    padded = torch.cat([src, torch.full((4, 3), PAD_ID)], dim=1)
    tgt_in = torch.randint(4, TGT_V, (4, 5))
    torch.testing.assert_close(m(padded, lengths, tgt_in), m(src, lengths, tgt_in))
    if arch == "transformer":
        mem, _ = m.encode(src, lengths)
        mem_p, _ = m.encode(padded, lengths)
        for i, n in enumerate(lengths.tolist()):
            torch.testing.assert_close(mem_p[i, :n], mem[i, :n])
    else:
        st, st_p = m.start(src, lengths), m.start(padded, lengths)
        for i, n in enumerate(lengths.tolist()):
            torch.testing.assert_close(st_p["enc"][i, :n], st["enc"][i, :n])
        torch.testing.assert_close(st_p["h"], st["h"])
    # And garbage (not pad) in padded slots changes nothing either: the mask, not the token, rules.
    noisy = padded.clone()
    noisy[padding_mask(lengths, 9)] = 5
    torch.testing.assert_close(m(noisy, lengths, tgt_in), m(src, lengths, tgt_in))


def test_transformer_decoder_is_causal():
    m = _model("transformer")
    src, lengths = _batch()
    tgt = torch.randint(4, TGT_V, (4, 6))
    changed = tgt.clone()
    changed[:, 4:] = (changed[:, 4:] + 1 - 4) % (TGT_V - 4) + 4
    a, b = m(src, lengths, tgt), m(src, lengths, changed)
    torch.testing.assert_close(a[:, :4], b[:, :4])
    assert not torch.allclose(a[:, 4:], b[:, 4:])


def test_transformer_attention_selection():
    m = _model("transformer")
    assert isinstance(m, TransformerSeq2Seq)
    src, lengths = _batch()
    _, avg = m.greedy_decode(src, lengths, 4)
    m.attn_head = 0
    _, head0 = m.greedy_decode(src, lengths, 4)
    for a in avg:
        torch.testing.assert_close(a.sum(-1), torch.ones(a.size(0)))
    assert not all(torch.allclose(a, b) for a, b in zip(avg, head0, strict=True))


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_training_lowers_loss(arch):
    # Reverse 3-letter strings: learnable in a few dozen steps.
    g = torch.Generator().manual_seed(0)
    words = ["".join("abcd"[int(i)] for i in torch.randint(4, (3,), generator=g))
             for _ in range(256)]
    pairs = [(w, w[::-1]) for w in words]
    src, tgt = Seq2SeqTokenizer.train(words), Seq2SeqTokenizer.train(words)
    task = Seq2SeqTask(DataSpec(task="reverse"), src, tgt, pairs, pairs[:64])
    cfg = TrainConfig(batch_size=32, learning_rate=3e-3, max_iters=60, warmup_iters=5,
                      eval_interval=1000, eval_iters=2, dtype="fp32", seed=0)
    trainer = Trainer(cfg, task.model_config(arch, d_model=32, d_ff=64), task, progress=False)
    before = task.estimate(trainer.model, "val", 2, trainer.setting)
    res = trainer.fit()
    assert res.step == 60
    assert res.val_loss < 0.6 * before


def test_collate_shapes_and_shift():
    src, lengths, tgt_in, tgt_out = collate([([5, 6, 2], [7, 8]), ([9, 2], [7])])
    assert src.tolist() == [[5, 6, 2], [9, 2, 0]]
    assert lengths.tolist() == [3, 2]
    assert tgt_in.tolist() == [[1, 7, 8], [1, 7, 0]]
    assert tgt_out.tolist() == [[7, 8, 2], [7, 2, 0]]


def test_config_validation():
    with pytest.raises(ScratchGPTError):
        Seq2SeqConfig("gpt", 5, 5)
    with pytest.raises(ScratchGPTError):
        Seq2SeqConfig("transformer", 5, 5, d_model=10, n_head=4)
    with pytest.raises(ScratchGPTError):
        Seq2SeqConfig("lstm", 5, 5, dropout=1.5)


@pytest.mark.parametrize("arch", ARCHS)
def test_searches_never_emit_the_ids_no_target_holds(arch):
    """<pad>, <bos> and <unk> are never training targets; a model that ranks them first (one
    early in training, here one whose output layer favours them) still decodes text without
    them, in greedy and beam search alike."""
    from scratchgpt.tokenizers.seq2seq import BOS_ID, UNK_ID

    m = _model(arch)
    with torch.no_grad():
        m.head.bias[[PAD_ID, BOS_ID, UNK_ID]] += 100.0  # first everywhere, without the mask
        logp, _ = m.step(m.start(*_batch()), torch.full((4,), BOS_ID))
    assert set(logp.argmax(-1).tolist()) <= {PAD_ID, BOS_ID, UNK_ID}
    src, lengths = _batch()
    for out in (m.greedy_decode(src, lengths, 6)[0], m.beam_decode(src, lengths, 3, 6)[0]):
        assert all(len(ids) > 0 for ids in out)
        assert not {PAD_ID, BOS_ID, UNK_ID} & {t for ids in out for t in ids}


def _cached_and_uncached(decode):
    """``decode(model)`` through the Transformer's KV cache, then re-running the whole prefix."""
    m = _model("transformer")
    assert isinstance(m, TransformerSeq2Seq)
    cached = decode(m)
    m.kv_cache = False
    return cached, decode(m)


@pytest.mark.parametrize("beam", [None, 3])
def test_kv_cache_decodes_what_the_whole_prefix_does(beam):
    """Greedy and beam search give the same tokens, and the same attention maps to within
    1e-6 (absolute; float32 sums of at most 12 terms), through the cache as without it, for
    a batch whose rows end at different steps (and one that runs out of steps)."""
    src, lengths = _batch()

    def decode(m):
        if beam is None:
            return m.greedy_decode(src, lengths, max_len=12)
        return m.beam_decode(src, lengths, beam=beam, max_len=12)

    (tok, att), (tok_ref, att_ref) = _cached_and_uncached(decode)
    assert len({len(ids) for ids in tok}) > 1  # rows end at different steps
    assert tok == tok_ref
    for a, b in zip(att, att_ref, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0.0)


def test_kv_cache_steps_give_the_same_distributions():
    """Step by step, with beam-style row reselection between steps, the cached decode's
    log-probabilities and attention equal the whole-prefix decode's to within 1e-5."""
    src, lengths = _batch()
    rows = torch.tensor([3, 0, 0, 2])  # drop row 1, duplicate row 0

    def decode(m):
        state, prev, out = m.start(src, lengths), torch.full((4,), 4), []
        for t in range(6):
            logp, attn = m.step(state, prev)
            out.append((logp, attn))
            if t == 2:
                m.reorder(state, rows)
                logp = logp[rows]
            prev = logp.argmax(-1)
        return out

    cached, ref = _cached_and_uncached(decode)
    for (logp, attn), (logp_ref, attn_ref) in zip(cached, ref, strict=True):
        torch.testing.assert_close(logp, logp_ref, atol=1e-5, rtol=0.0)
        torch.testing.assert_close(attn, attn_ref, atol=1e-6, rtol=0.0)


@pytest.mark.parametrize("beam", [None, 3])
def test_kv_cache_long_decode_decodes_what_the_whole_prefix_does(beam):
    """A decode three times the usual length (36 tokens a row, <eos> ruled out), through two
    doublings of the cache's self-attention slots, gives the whole-prefix decode's tokens and
    attention maps (to within 1e-6), greedy and beam alike."""
    src, lengths = _batch()
    steps = 2 * FIRST_SLOTS + 4

    def decode(m):
        with torch.no_grad():
            m.head.bias[EOS_ID] = float("-inf")
        if beam is None:
            return m.greedy_decode(src, lengths, max_len=steps)
        return m.beam_decode(src, lengths, beam=beam, max_len=steps)

    (tok, att), (tok_ref, att_ref) = _cached_and_uncached(decode)
    assert [len(ids) for ids in tok] == [steps] * 4
    assert tok == tok_ref
    for a, b in zip(att, att_ref, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0.0)


def test_kv_cache_slots_double_when_full_and_decode_the_same():
    """The self-attention slots start at FIRST_SLOTS and double each time they are full; step
    by step across two doublings, with beam-style row reselection on the step before the
    first, the log-probabilities and attention equal the whole-prefix decode's."""
    src, lengths = _batch()
    steps, rows = 2 * FIRST_SLOTS + 4, torch.tensor([3, 0, 0, 2])
    slots = []

    def decode(m):
        state, prev, out = m.start(src, lengths), torch.full((4,), 4), []
        for t in range(steps):
            logp, attn = m.step(state, prev)
            out.append((logp, attn))
            if "self_k.1" in state:  # the cached decode
                slots.append((state["self_k.1"].size(2), state["self_v.0"].size(2)))
            if t == FIRST_SLOTS - 2:
                m.reorder(state, rows)
                logp = logp[rows]
            prev = logp.argmax(-1)
        return out

    cached, ref = _cached_and_uncached(decode)
    grown = [FIRST_SLOTS] * FIRST_SLOTS + [2 * FIRST_SLOTS] * FIRST_SLOTS + [4 * FIRST_SLOTS] * 4
    assert slots == [(n, n) for n in grown]
    for (logp, attn), (logp_ref, attn_ref) in zip(cached, ref, strict=True):
        torch.testing.assert_close(logp, logp_ref, atol=1e-5, rtol=0.0)
        torch.testing.assert_close(attn, attn_ref, atol=1e-6, rtol=0.0)


def test_kv_cache_decodes_a_batch_of_no_sources_to_nothing():
    m = _model("transformer")
    src, lengths = torch.zeros(0, 6, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    assert m.greedy_decode(src, lengths, max_len=4) == ([], [])
    assert m.beam_decode(src, lengths, beam=2, max_len=4) == ([], [])


def test_kv_cache_feeds_the_decoder_one_position_a_step():
    """Through the cache, each decoder step processes the newest position alone: the decoder
    work of a decode grows with its length, not with its square."""
    m = _model("transformer")
    widths = []
    m.dec_layers[0].ffn.register_forward_hook(lambda _m, inp, _o: widths.append(inp[0].size(1)))
    tok, _ = m.greedy_decode(*_batch(), max_len=12)
    assert widths == [1] * max(len(ids) for ids in tok)


def test_kv_cache_decode_past_max_positions_is_refused():
    m = _model("transformer")
    with torch.no_grad():
        m.head.bias[EOS_ID] -= 100.0  # never ends: runs into the last position
    with pytest.raises(ScratchGPTError, match="exceeds max_positions"):
        m.greedy_decode(*_batch(), max_len=m.config.max_positions + 1)
