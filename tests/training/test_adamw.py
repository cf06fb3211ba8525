"""Our AdamW and Muon against torch.optim's: the same updates, the same saved state, and none
of torch.optim's start-up cost (its optimizers import torch._dynamo)."""

import copy
import subprocess
import sys

import pytest
import torch

from scratchgpt.training import adamw as adamw_module
from scratchgpt.training.adamw import AdamW
from scratchgpt.training.muon import Muon


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(8, 5), (5,), (3, 4, 2), (7,)]
    return [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]


def _groups(params: list[torch.nn.Parameter]) -> list[dict]:
    # two groups with their own decay and rate, as make_optimizer builds them
    return [{"params": params[:2], "weight_decay": 0.1},
            {"params": params[2:], "weight_decay": 0.0, "lr": 3e-2}]


def _run(opt, params, steps: int, seed: int = 1) -> None:
    gen = torch.Generator().manual_seed(seed)
    for step in range(steps):
        for i, p in enumerate(params):
            # the last parameter skips every other step (no gradient: no update, no state)
            skip = i == len(params) - 1 and step % 2 == 1
            p.grad = None if skip else torch.randn(p.shape, generator=gen)
        opt.step()
        for g in opt.param_groups:
            g["lr"] *= 0.9  # a schedule moves the rate between steps


def test_adamw_is_torchs_fused_adamw_bit_for_bit():
    ours, ref = _params(), _params()
    _run(AdamW(_groups(ours), lr=1e-2, betas=(0.9, 0.95)), ours, 5)
    _run(torch.optim.AdamW(_groups(ref), lr=1e-2, betas=(0.9, 0.95), fused=True), ref, 5)
    assert all(torch.equal(a, b) for a, b in zip(ours, ref, strict=True))


def test_adamw_written_out_follows_torchs_foreach_adamw(monkeypatch):
    """Where PyTorch has no fused kernel for the device, the update is written out, and the
    missing kernel is asked for once, not at every step."""
    calls = []

    def no_fused(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("no fused kernel for this device")

    monkeypatch.setattr(adamw_module.torch, "_fused_adamw_", no_fused)
    monkeypatch.setattr(adamw_module, "_NO_FUSED_KERNEL", set())
    ours, ref = _params(), _params()
    start = [p.detach().clone() for p in ours]
    _run(AdamW(_groups(ours), lr=1e-2, betas=(0.9, 0.95)), ours, 5)
    monkeypatch.undo()
    _run(torch.optim.AdamW(_groups(ref), lr=1e-2, betas=(0.9, 0.95), foreach=True), ref, 5)
    assert calls == [1]  # asked once; the written-out form ran all 5 steps
    for s, a, b in zip(start, ours, ref, strict=True):
        assert not torch.equal(a, s)
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_adamw_state_moves_between_ours_and_torchs():
    """A checkpoint's optimizer state from torch.optim.AdamW resumes in ours exactly, and
    ours in torch's: runs written before either change keep resuming."""
    ref = _params()
    torch_opt = torch.optim.AdamW(_groups(ref), lr=1e-2, fused=True)
    _run(torch_opt, ref, 3)
    ours = [torch.nn.Parameter(p.detach().clone()) for p in ref]
    our_opt = AdamW(_groups(ours), lr=1e-2)
    our_opt.load_state_dict(torch_opt.state_dict())
    assert our_opt.param_groups[1]["lr"] == torch_opt.param_groups[1]["lr"]
    _run(our_opt, ours, 3, seed=2)
    _run(torch_opt, ref, 3, seed=2)
    assert all(torch.equal(a, b) for a, b in zip(ours, ref, strict=True))

    # (torch's loaded groups lack its "fused" setting, so it continues unfused: the same
    # update up to rounding)
    back = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    torch_again = torch.optim.AdamW(_groups(back), lr=1e-2, fused=True)
    torch_again.load_state_dict(copy.deepcopy(our_opt.state_dict()))  # torch's keeps no copy
    _run(torch_again, back, 2, seed=3)
    _run(our_opt, ours, 2, seed=3)
    for a, b in zip(ours, back, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_loaded_state_is_a_copy_and_other_groups_are_refused():
    params = _params()
    opt = AdamW(_groups(params), lr=1e-2)
    _run(opt, params, 1)
    saved = opt.state_dict()
    again = AdamW(_groups(params), lr=1e-2)
    again.load_state_dict(saved)
    _run(again, params, 1)
    assert saved["state"][0]["step"].item() == 1  # the loaded-from dict did not move
    with pytest.raises(ValueError, match="other parameter groups"):
        AdamW(params, lr=1e-2).load_state_dict(saved)  # one group, not two


def test_printing_an_optimizer_shows_its_groups():
    text = repr(AdamW(_groups(_params()), lr=1e-2))
    assert text.startswith("AdamW(") and "45 weights in 2 tensors" in text
    assert "weight_decay=0.1" in text and "lr=0.03" in text  # each group its own settings


def test_a_parameter_in_two_groups_is_refused():
    p = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match="more than one"):
        AdamW([{"params": [p]}, {"params": [p]}])
    with pytest.raises(ValueError, match="matrices only"):
        Muon([p])


def test_muon_state_from_torchs_muon_resumes_exactly():
    gen = torch.Generator().manual_seed(0)
    ref = [torch.nn.Parameter(torch.randn(s, generator=gen) * 0.02) for s in ((16, 24), (24, 8))]
    kw = dict(lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    torch_opt = torch.optim.Muon(ref, **kw)
    _run(torch_opt, ref, 2)
    ours = [torch.nn.Parameter(p.detach().clone()) for p in ref]
    our_opt = Muon(ours, ns_dtype=torch.bfloat16, **kw)
    our_opt.load_state_dict(torch_opt.state_dict())
    _run(our_opt, ours, 2, seed=5)
    _run(torch_opt, ref, 2, seed=5)
    assert all(torch.equal(a, b) for a, b in zip(ours, ref, strict=True))


def test_training_imports_no_compiler():
    """Building and stepping the optimizers does not import torch._dynamo (1-2 s of start-up
    for every training run, which torch.optim's optimizers pay)."""
    code = """
import sys, torch
from scratchgpt.models import build_model, model_config
from scratchgpt.training.optim import make_optimizer
model = build_model(model_config("gpt", vocab_size=11, n_layer=2, n_head=2, n_embd=16,
                                 block_size=8))
for kind in ("adamw", "muon"):
    opt = make_optimizer(model, 1e-3, 0.1, (0.9, 0.99), kind)
    model(torch.randint(0, 11, (2, 8))).sum().backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()
    opt.load_state_dict(opt.state_dict())
print("torch._dynamo" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"
