"""The GPT's beam search reorders its KV cache in place, copying only the rows whose beam
changes, and finds exactly what copying every row into a new cache found."""

from __future__ import annotations

import pytest
import torch

from scratchgpt.generation.beam import beam_search
from scratchgpt.generation.stopping import StopRule
from scratchgpt.models.gpt import GPT, GPTConfig, KVCache


def _gpt(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    gpt = GPT(GPTConfig(vocab_size=19, block_size=16, n_layer=2, n_head=2, n_embd=16))
    with torch.no_grad():
        gpt.lm_head.weight.mul_(6)  # peaked, so beams change parents and end at different steps
    return gpt.eval()


def _filled_cache(batch: int = 5, pos: int = 6, max_len: int = 10) -> KVCache:
    cache = _gpt().new_cache(batch, max_len)
    g = torch.Generator().manual_seed(3)
    cache.k.copy_(torch.randn(cache.k.shape, generator=g))
    cache.v.copy_(torch.randn(cache.v.shape, generator=g))
    cache.pos = pos
    return cache


def _copy_every_row(cache: KVCache, rows: torch.Tensor) -> None:
    """How beam search reordered before: a new cache, every row's filled slots copied."""
    KVCache.select_rows(cache, rows)


@pytest.mark.parametrize("rows", [[0, 1, 2, 3, 4], [0, 0, 1, 2, 3], [4, 3, 2, 1, 0],
                                  [2, 2, 2, 0, 0], [1, 0, 2, 3, 3]])
def test_reorder_beams_holds_what_select_rows_holds_in_the_same_buffers(rows):
    """The filled slots equal those select_rows leaves (repeats and swaps included: the rows
    taken are read before any is written); the buffers are the same objects; an unmoved row is
    untouched, and a moved row's slots past ``pos`` are its own (only filled slots copy)."""
    ours, ref = _filled_cache(), _filled_cache()
    before_k, before_v = ours.k.clone(), ours.v.clone()
    k_id, v_id = ours.k.data_ptr(), ours.v.data_ptr()
    rows_t = torch.tensor(rows)
    ours.reorder_beams(rows_t)
    _copy_every_row(ref, rows_t)
    assert ours.k.data_ptr() == k_id and ours.v.data_ptr() == v_id
    assert ours.k_layers[0].data_ptr() == k_id  # the per-layer views still see the buffers
    assert torch.equal(ours.k[:, :, :, :ours.pos], ref.k[:, :, :, :ref.pos])
    assert torch.equal(ours.v[:, :, :, :ours.pos], ref.v[:, :, :, :ref.pos])
    assert torch.equal(ours.k[:, :, :, ours.pos:], before_k[:, :, :, ours.pos:])
    assert torch.equal(ours.v[:, :, :, ours.pos:], before_v[:, :, :, ours.pos:])
    for i, r in enumerate(rows):
        if i == r:
            assert torch.equal(ours.k[:, i], before_k[:, i])


def test_reorder_beams_carries_the_padding_of_the_rows_it_takes():
    """Left-padded rows (a window slid mid-search) keep their padding with their keys."""
    ours, ref = _filled_cache(), _filled_cache()
    for c in (ours, ref):
        c.left_pad(torch.tensor([0, 2, 1, 0, 3]))
    rows = torch.tensor([1, 1, 4, 0, 2])
    ours.reorder_beams(rows)
    _copy_every_row(ref, rows)
    assert torch.equal(ours.pos_offset, ref.pos_offset)
    assert torch.equal(ours.key_mask, ref.key_mask)


def test_a_batch_that_changes_size_goes_through_select_rows():
    cache = _filled_cache()
    cache.reorder_beams(torch.tensor([3, 1]))
    assert cache.batch_size == 2 and cache.k.shape[1] == 2


def _search(model, prompt, beam, n, eos, penalty):
    return beam_search(model, torch.tensor([prompt]), beam, StopRule(n, eos_id=eos),
                       length_penalty=penalty)


# prompt lengths: short (no slide), reaching the context of 16 mid-search, longer than it
@pytest.mark.parametrize("prompt_len", [3, 10, 23])
@pytest.mark.parametrize(("beam", "penalty", "end"), [(2, 1.0, False), (4, 0.6, True),
                                                      (5, 2.0, True), (3, -0.5, True)])
def test_beam_search_is_bit_identical_to_copying_every_row(monkeypatch, prompt_len, beam,
                                                           penalty, end):
    """Hypotheses and scores equal exactly those of the search that copied every row of the
    cache into a new one at each step, across window slides and (``end``: the end token is
    one the best free search takes early) hypotheses that end."""
    model = _gpt()
    g = torch.Generator().manual_seed(prompt_len + beam)
    prompt = torch.randint(0, 19, (prompt_len,), generator=g).tolist()
    eos = _search(model, prompt, beam, 20, None, penalty)[0][0][3] if end else None
    ours = _search(model, prompt, beam, 20, eos, penalty)
    assert not end or any(tokens[-1] == eos for tokens, _ in ours)
    monkeypatch.setattr(KVCache, "reorder_beams", _copy_every_row)
    ref = _search(model, prompt, beam, 20, eos, penalty)
    assert ours == ref


def test_beam_search_reorders_the_gpt_cache_in_place(monkeypatch):
    """Its cache never goes through select_rows (a new cache each step) and is reordered at
    least once with a beam taking another's row."""
    moves = []
    real = KVCache.reorder_beams

    def spy(cache, rows):
        moves.append(bool((rows != torch.arange(len(rows))).any()))
        real(cache, rows)

    def refuse(cache, rows):
        raise AssertionError("beam search copied the whole cache")

    monkeypatch.setattr(KVCache, "select_rows", refuse)
    monkeypatch.setattr(KVCache, "reorder_beams", spy)
    hyps = _search(_gpt(), [1, 2, 3], 4, 10, None, 1.0)
    assert len(hyps) == 4 and any(moves)
