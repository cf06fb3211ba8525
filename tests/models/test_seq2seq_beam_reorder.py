"""Beam search's reorder copies only what beams do not share, and decodes what copying the
whole state did."""

import pytest
import torch

from scratchgpt.models.seq2seq import (
    ARCHS,
    FIRST_SLOTS,
    Seq2Seq,
    Seq2SeqConfig,
    build_seq2seq,
    padding_mask,
)
from scratchgpt.tokenizers.seq2seq import EOS_ID, PAD_ID

# (arch, through the Transformer's KV cache?)
WAYS = [(arch, True) for arch in ARCHS] + [("transformer", False)]


def _model(arch, cached, eos=True):
    torch.manual_seed(0)
    cfg = Seq2SeqConfig(arch, 13, 11, d_model=16, n_layer=2, n_head=2, d_ff=32, dropout=0.0)
    m = build_seq2seq(cfg).eval()
    if arch == "transformer":
        m.kv_cache = cached
    with torch.no_grad():
        m.head.weight.mul_(8.0)  # decisive, so that <eos> wins at different steps
        if not eos:
            m.head.bias[EOS_ID] = float("-inf")
    return m


def _batch():
    g = torch.Generator().manual_seed(1)
    lengths = torch.tensor([6, 3, 5, 1, 4])
    src = torch.randint(4, 13, (5, 6), generator=g)
    src[padding_mask(lengths, 6)] = PAD_ID
    return src, lengths


def _whole_state_reorder(state, rows):
    """The reorder beam search made before: every entry, every row, copied."""
    Seq2Seq.reorder(state, rows)


@pytest.mark.parametrize(("arch", "cached"), WAYS)
@pytest.mark.parametrize(("beam", "eos"), [(2, True), (3, True), (3, False)])
def test_beam_decode_is_what_reordering_the_whole_state_decodes(arch, cached, beam, eos):
    """Tokens and attention maps equal (exactly) those of the search that copied every row of
    every entry at each step, with hypotheses ending at different steps (the Transformer's),
    and (``<eos>`` ruled out) across two doublings of the Transformer's self-attention slots;
    and greedy is beam 1."""
    src, lengths = _batch()
    steps = 12 if eos else 2 * FIRST_SLOTS + 4
    m = _model(arch, cached, eos)
    tok, att = m.beam_decode(src, lengths, beam, steps, length_penalty=0.5)
    m.reorder_beams = _whole_state_reorder  # the instance's, over the class's
    ref_tok, ref_att = m.beam_decode(src, lengths, beam, steps, length_penalty=0.5)
    assert tok == ref_tok
    if eos and arch == "transformer":
        assert len({len(ids) for ids in tok}) > 1
    for a, b in zip(att, ref_att, strict=True):
        assert torch.equal(a, b)
    greedy, beam_one = m.greedy_decode(src, lengths, steps), m.beam_decode(src, lengths, 1, steps)
    assert greedy[0] == beam_one[0]


@pytest.mark.parametrize(("arch", "cached"), WAYS)
def test_beam_decode_leaves_the_source_entries_where_start_put_them(arch, cached):
    """Every step of a beam search reads the source entries (encoder output, cross-attention
    keys and values, padding) that the search set up, not a copy made per step; beams did
    move (some step's reorder took another row)."""
    m = _model(arch, cached)
    seen: dict[str, set[int]] = {}
    step, reorder = m.step, m.reorder_beams
    moves = []

    def spy_step(state, prev):
        for k, v in state.items():
            if isinstance(v, torch.Tensor):
                seen.setdefault(k, set()).add(v.data_ptr())
        return step(state, prev)

    def spy_reorder(state, rows):
        moves.append(bool((rows != torch.arange(rows.numel())).any()))
        reorder(state, rows)

    m.step, m.reorder_beams = spy_step, spy_reorder
    src, lengths = _batch()
    m.beam_decode(src, lengths, beam=3, max_len=12)
    assert any(moves)
    sources = [k for k in seen if m.is_source(k)]
    assert sources and all(len(seen[k]) == 1 for k in sources), seen
    assert any(not m.is_source(k) for k in seen)  # and the decoder's state is not


def test_reorder_beams_copies_the_moved_rows_only_and_leaves_free_slots():
    """One reorder on a Transformer's cache after 3 steps: each row holds in its filled slots
    what ``reorder`` gives it; a row that stays keeps its memory; the free slots are not
    touched; the cross-attention's entries are the same tensors."""
    m = _model("transformer", True)
    src, lengths = _batch()
    state = m.start(src[:2], lengths[:2])
    m.reorder(state, torch.tensor([0, 0, 0, 1, 1, 1]))  # 2 examples x 3 beams
    for prev in (4, 5, 6):
        m.step(state, torch.full((6,), prev) + torch.arange(6) % 3)
    for k, v in state.items():
        if k.startswith(("self_k.", "self_v.")):
            v.narrow(2, 3, v.size(2) - 3).fill_(7.0)  # the free slots: marked
    ref = dict(state)
    Seq2Seq.reorder(ref, torch.tensor([2, 2, 0, 3, 5, 4]))
    before = dict(state)
    m.reorder_beams(state, torch.tensor([2, 2, 0, 3, 5, 4]))
    for k, v in state.items():
        if not isinstance(v, torch.Tensor):
            continue
        assert v is before[k]  # in place
        if k.startswith(("self_k.", "self_v.")):
            assert torch.equal(v[:, :, :3], ref[k][:, :, :3])
            assert bool((v[:, :, 3:] == 7.0).all())
        else:
            assert m.is_source(k) and torch.equal(v, ref[k])  # the same in each of a source's beams
