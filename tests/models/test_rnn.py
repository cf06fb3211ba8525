"""The from-scratch recurrent cells agree with torch.nn.RNN/LSTM/GRU on the same weights."""

import pytest
import torch
from torch import nn

from scratchgpt.errors import ScratchGPTError
from scratchgpt.models.rnn import Recurrent, RecurrentConfig, RecurrentLM

TORCH = {"rnn": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}


def _close(a, b):
    if isinstance(a, tuple):
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
    else:
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cell", ["rnn", "lstm", "gru"])
@pytest.mark.parametrize("layers", [1, 3])
def test_scratch_matches_torch_with_copied_weights(cell, layers):
    torch.manual_seed(0)
    ref = TORCH[cell](5, 7, layers, batch_first=True)
    ours = Recurrent(cell, 5, 7, layers, fast=False)
    # The parameter names and shapes are torch's: the state dict copies over 1:1.
    ours.core.load_state_dict(ref.state_dict())
    x = torch.randn(4, 9, 5)
    h0 = torch.randn(layers, 4, 7)
    state = (h0, torch.randn(layers, 4, 7)) if cell == "lstm" else h0
    out_ref, st_ref = ref(x, state)
    out, st = ours(x, state)
    _close(out, out_ref)
    _close(st, st_ref)
    # And from a zero state.
    out_ref, st_ref = ref(x)
    out, st = ours(x)
    _close(out, out_ref)
    _close(st, st_ref)


@pytest.mark.parametrize("cell", ["rnn", "lstm", "gru"])
def test_fast_and_scratch_paths_share_weights_and_gradients(cell):
    torch.manual_seed(1)
    m = Recurrent(cell, 3, 6, 2)
    x = torch.randn(2, 5, 3)
    m.fast = True
    out_fast, _ = m(x)
    g_fast = torch.autograd.grad(out_fast.sum(), m.core.weight_hh_l0)[0]
    m.fast = False
    out_slow, _ = m(x)
    g_slow = torch.autograd.grad(out_slow.sum(), m.core.weight_hh_l0)[0]
    _close(out_slow, out_fast)
    _close(g_slow, g_fast)


@pytest.mark.parametrize("cell", ["rnn", "lstm", "gru"])
def test_state_carried_across_calls_equals_one_call(cell):
    torch.manual_seed(2)
    m = Recurrent(cell, 3, 4, 2, fast=False)
    x = torch.randn(2, 8, 3)
    whole, st_whole = m(x)
    a, st = m(x[:, :5])
    b, st = m(x[:, 5:], st)
    _close(torch.cat([a, b], dim=1), whole)
    _close(st, st_whole)


def test_dropout_between_layers_only_in_training():
    torch.manual_seed(3)
    m = Recurrent("lstm", 3, 16, 2, dropout=0.5, fast=False)
    x = torch.randn(2, 4, 3)
    m.train()
    a, _ = m(x)
    b, _ = m(x)
    assert not torch.allclose(a, b)
    m.eval()
    a, _ = m(x)
    b, _ = m(x)
    assert torch.equal(a, b)


@pytest.mark.parametrize("cell", ["rnn", "lstm", "gru"])
def test_recurrent_lm_state_feeds_forward(cell):
    torch.manual_seed(4)
    lm = RecurrentLM(RecurrentConfig(vocab_size=11, cell=cell, n_layer=2, hidden=8)).eval()
    idx = torch.randint(0, 11, (3, 7))
    full = lm(idx)
    assert full.shape == (3, 7, 11)
    state = lm.new_cache(3)
    first = lm(idx[:, :4], state)
    rest = [lm(idx[:, t : t + 1], state) for t in range(4, 7)]
    _close(torch.cat([first, *rest], dim=1), full)
    assert (state.c is not None) == (cell == "lstm")
    assert state.h.shape == (2, 3, 8)
    lm.train()
    lm(idx, state).sum().backward()
    assert state.h.grad_fn is not None
    state.detach()
    assert state.h.grad_fn is None and (state.c is None or state.c.grad_fn is None)


def test_recurrent_config_validation_and_params():
    with pytest.raises(ScratchGPTError):
        RecurrentConfig(vocab_size=10, cell="transformer")
    with pytest.raises(ScratchGPTError):
        RecurrentConfig(vocab_size=10, n_layer=0)
    with pytest.raises(ScratchGPTError):
        RecurrentConfig(vocab_size=10, dropout=1.0)
    with pytest.raises(ScratchGPTError):
        RecurrentConfig(vocab_size=0)
    with pytest.raises(ScratchGPTError):
        RecurrentConfig(vocab_size=10, block_size=0)
    with pytest.raises(ScratchGPTError):
        RecurrentConfig(vocab_size=10, cells="cuda")
    cfg = RecurrentConfig(vocab_size=10, cell="gru", n_layer=1, hidden=4)
    # embed 10*4 + GRU (3*4*4 + 3*4*4 + 2*3*4) + head 4*10 + 10
    assert RecurrentLM(cfg).num_params() == 40 + 48 + 48 + 24 + 50


def test_init_forget_bias_sets_only_the_forget_block():
    m = Recurrent("lstm", 3, 4, 2)
    m.init_forget_bias(1.0)
    for k in range(2):
        _, _, b_ih, b_hh = m.layer_weights(k)
        assert torch.all(b_ih[4:8] == 1.0) and torch.all(b_hh[4:8] == 0.0)
        assert not torch.all(b_ih[:4] == 1.0)
    with pytest.raises(ValueError):
        Recurrent("gru", 3, 4).init_forget_bias()


@pytest.mark.parametrize("cell", ["rnn", "lstm", "gru"])
def test_cells_setting_picks_the_path_and_keeps_the_weights(cell):
    """``cells="scratch"`` and ``cells="torch"`` are one model: the state dict of either loads
    into the other, and logits and gradients agree to float tolerance."""
    torch.manual_seed(5)
    fused = RecurrentLM(RecurrentConfig(vocab_size=11, cell=cell, n_layer=2, hidden=8))
    scratch = RecurrentLM(RecurrentConfig(vocab_size=11, cell=cell, n_layer=2, hidden=8,
                                          cells="scratch"))
    assert fused.rnn.fast and not scratch.rnn.fast
    scratch.load_state_dict(fused.state_dict())
    idx = torch.randint(0, 11, (3, 9))
    a, b = fused(idx), scratch(idx)
    _close(b, a)
    ga = torch.autograd.grad(a.square().sum(), fused.rnn.core.weight_ih_l0)[0]
    gb = torch.autograd.grad(b.square().sum(), scratch.rnn.core.weight_ih_l0)[0]
    _close(gb, ga)


@pytest.mark.parametrize("cell", ["rnn", "lstm", "gru"])
def test_a_recurrent_config_pickles(cell):
    """--nproc hands a run's config to its processes pickled: the class a cell's config is
    made of must be found by its name (it raised PicklingError for every recurrent model)."""
    import pickle

    from scratchgpt.models import model_config

    config = model_config(cell, vocab_size=5, hidden=8, n_layer=1)
    assert pickle.loads(pickle.dumps(config)) == config
