import pytest
import torch

from scratchgpt.errors import ScratchGPTError
from scratchgpt.models import build_model, model_config
from scratchgpt.training.optim import ChainedOptimizer, hidden_matrices, make_optimizer, set_lr

GPT = dict(vocab_size=65, n_layer=2, n_head=2, n_embd=32, block_size=16)


def test_hidden_matrices_are_the_block_linears_only():
    model = build_model(model_config("gpt", **GPT))
    names = {id(p): n for n, p in model.named_parameters()}
    got = sorted(names[id(p)] for p in hidden_matrices(model))
    want = sorted(f"transformer.h.{i}.{m}.weight" for i in range(2)
                  for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"))
    assert got == want  # not wte (tied to lm_head), not wpe, no biases or LayerNorms


def test_untied_head_stays_with_adamw():
    model = build_model(model_config("gpt", **GPT, tie_weights=False))
    assert all(p is not model.lm_head.weight for p in hidden_matrices(model))


@pytest.mark.parametrize("model_type,cfg", [("gpt", GPT), ("lstm", dict(vocab_size=65))])
def test_muon_and_adamw_together_own_every_parameter_once(model_type, cfg):
    model = build_model(model_config(model_type, **cfg))
    opt = make_optimizer(model, 1e-3, 0.1, (0.9, 0.99), "muon", muon_lr_scale=2.0)
    owned = [id(p) for g in opt.param_groups for p in g["params"]]
    assert sorted(owned) == sorted(id(p) for p in model.parameters())
    set_lr(opt, 0.5)
    assert {g["lr"] for g in opt.param_groups} <= {0.5, 1.0}
    if isinstance(opt, ChainedOptimizer):  # GPT: Muon groups at 2x the AdamW rate
        assert opt.optimizers[1].param_groups[0]["lr"] == 1.0


def test_muon_step_is_orthogonalized():
    """One Muon step from zero momentum moves a square matrix by ~an orthogonal matrix."""
    lin = torch.nn.Linear(64, 64, bias=False)
    opt = torch.optim.Muon([lin.weight], lr=1.0, weight_decay=0.0, nesterov=False, momentum=0.0)
    before = lin.weight.detach().clone()
    lin.weight.grad = torch.randn(64, 64)
    opt.step()
    delta = before - lin.weight.detach()
    s = torch.linalg.svdvals(delta)
    # Muon's quintic iteration leaves singular values in roughly [0.5, 1.5], never near 0 or 3.
    assert s.min() > 0.3 and s.max() < 1.6


def test_muon_state_round_trips():
    model = build_model(model_config("gpt", **GPT))
    opt = make_optimizer(model, 1e-3, 0.1, (0.9, 0.99), "muon")
    model(torch.randint(0, 65, (2, 8))).sum().backward()
    opt.step()
    state = opt.state_dict()
    again = make_optimizer(model, 1e-3, 0.1, (0.9, 0.99), "muon")
    again.load_state_dict(state)
    with pytest.raises(ScratchGPTError):
        make_optimizer(model, 1e-3, 0.1, (0.9, 0.99), "muon").load_state_dict({"state": {}})


def test_unknown_optimizer_is_a_user_error():
    with pytest.raises(ScratchGPTError):
        make_optimizer(build_model(model_config("gpt", **GPT)), 1e-3, 0.1, (0.9, 0.99), "sgd")
