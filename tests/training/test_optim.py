import doctest
import math

import pytest
import torch

from scratchgpt.errors import ScratchGPTError
from scratchgpt.models import build_model, model_config
from scratchgpt.training import optim
from scratchgpt.training.muon import Muon, newton_schulz, orthogonalize
from scratchgpt.training.optim import (
    ChainedOptimizer,
    clip_grad_norm,
    hidden_matrices,
    load_state_keeping_settings,
    make_optimizer,
    set_lr,
)

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


def test_muon_and_adamw_together_own_every_parameter_once():
    model = build_model(model_config("gpt", **GPT))
    opt = make_optimizer(model, 1e-3, 0.1, (0.9, 0.99), "muon", muon_lr_scale=2.0)
    owned = [id(p) for g in opt.param_groups for p in g["params"]]
    assert sorted(owned) == sorted(id(p) for p in model.parameters())
    set_lr(opt, 0.5)
    assert {g["lr"] for g in opt.param_groups} <= {0.5, 1.0}
    assert isinstance(opt, ChainedOptimizer)  # Muon groups at 2x the AdamW rate
    assert opt.optimizers[1].param_groups[0]["lr"] == 1.0


@pytest.mark.parametrize("model_type", ["lstm", "bigram"])
def test_muon_with_no_hidden_matrices_is_refused_not_adamw_in_disguise(model_type):
    model = build_model(model_config(model_type, vocab_size=65))
    assert hidden_matrices(model) == []
    with pytest.raises(ScratchGPTError, match="use --optimizer adamw"):
        make_optimizer(model, 1e-3, 0.1, (0.9, 0.99), "muon")


@pytest.mark.parametrize("kind", ["adamw", "muon"])
def test_embedding_tables_take_their_own_rate(kind):
    model = build_model(model_config("gpt", **GPT, tie_weights=False, value_embeds=1))
    tables = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    opt = make_optimizer(model, 1e-3, 0.1, (0.9, 0.99), kind, embed_lr_scale=10.0)
    set_lr(opt, 0.01)
    rate = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    assert sorted(rate) == sorted(id(p) for p in model.parameters())  # each owned once
    assert len(tables) == 3 and all(rate[t] == pytest.approx(0.1) for t in tables)
    assert all(r == pytest.approx(0.01) for p, r in rate.items() if p not in tables)
    # at 1.0 the tables stay in the matrices' group: states saved before the option still load
    plain = make_optimizer(model, 1e-3, 0.1, (0.9, 0.99), kind)
    assert len(plain.param_groups) == len(opt.param_groups) - 1


def test_embedding_rate_moves_the_tables_further():
    """One AdamW step moves each weight by about its rate: 10x for the tables, the rest alike."""
    moves = []
    for scale in (1.0, 10.0):
        torch.manual_seed(0)
        model = build_model(model_config("gpt", **GPT))
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt = make_optimizer(model, 1e-3, 0.0, (0.9, 0.99), "adamw", embed_lr_scale=scale)
        x = torch.randint(0, 65, (2, 16))
        torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
        opt.step()
        moves.append({n: (p.detach() - before[n]).abs().max().item()
                      for n, p in model.named_parameters()})
    assert moves[1]["transformer.wte.weight"] == pytest.approx(
        10 * moves[0]["transformer.wte.weight"], rel=1e-3)
    assert moves[1]["transformer.h.0.attn.c_attn.weight"] == pytest.approx(
        moves[0]["transformer.h.0.attn.c_attn.weight"], rel=1e-3)


def test_muon_step_is_orthogonalized():
    """One Muon step from zero momentum moves a square matrix by ~an orthogonal matrix."""
    lin = torch.nn.Linear(64, 64, bias=False)
    opt = Muon([lin.weight], lr=1.0, weight_decay=0.0, nesterov=False, momentum=0.0)
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


def test_a_loaded_state_keeps_the_new_optimizers_settings():
    """Resuming with new betas, weight decay or rate scales: the moments come from the save,
    the settings from the run (load_state_dict alone would bring back the saved ones)."""
    model = build_model(model_config("gpt", **GPT))
    saved = make_optimizer(model, 1e-3, 0.1, (0.9, 0.99), "muon", embed_lr_scale=2.0)
    model(torch.randint(0, 65, (2, 8))).sum().backward()
    saved.step()
    new = make_optimizer(model, 1e-3, 0.3, (0.8, 0.95), "muon", muon_lr_scale=4.0,
                         embed_lr_scale=3.0)
    load_state_keeping_settings(new, saved.state_dict())
    adamw, muon = new.optimizers
    assert {g["betas"] for g in adamw.param_groups} == {(0.8, 0.95)}
    # AdamW's groups here: the embedding tables (the head tied to one), then the vectors
    assert [g["weight_decay"] for g in adamw.param_groups] == [0.3, 0.0]  # vectors: none
    assert [g["lr_scale"] for g in adamw.param_groups] == [3.0, 1.0]
    assert muon.param_groups[0]["lr_scale"] == 4.0 and muon.param_groups[0]["weight_decay"] == 0.3
    for old, now in zip(saved.optimizers, new.optimizers, strict=True):
        for p in old.state:
            assert all(torch.equal(old.state[p][k], now.state[p][k]) for k in old.state[p])
    assert new.optimizers[0].state  # (the moments did arrive)


def test_unknown_optimizer_is_a_user_error():
    with pytest.raises(ScratchGPTError):
        make_optimizer(build_model(model_config("gpt", **GPT)), 1e-3, 0.1, (0.9, 0.99), "sgd")


def _muon_steps(opt_cls, params, steps=3, **kw):
    """Run ``steps`` Muon updates with the same seeded gradients; returns the weights."""
    params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt = opt_cls(params, lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw", **kw)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
    return params


MATRICES = [torch.randn(96, 32) * 0.02, torch.randn(32, 80) * 0.02, torch.randn(40, 40) * 0.02]


def test_our_muon_in_bf16_is_torchs_bit_for_bit():
    ref = _muon_steps(torch.optim.Muon, MATRICES)
    ours = _muon_steps(Muon, MATRICES, ns_dtype=torch.bfloat16)
    assert all(torch.equal(a, b) for a, b in zip(ref, ours, strict=True))


# A GPT's blocks repeat shapes: these batch by three (two wide, one tall) and by two.
REPEATED = [torch.randn(32, 96) * 0.02, torch.randn(96, 32) * 0.02, torch.randn(32, 96) * 0.02,
            torch.randn(40, 40) * 0.02, torch.randn(40, 40) * 0.02, torch.randn(24, 56) * 0.02]


def test_our_batched_muon_is_torchs_bit_for_bit_when_shapes_repeat():
    ref = _muon_steps(torch.optim.Muon, REPEATED)
    ours = _muon_steps(Muon, REPEATED, ns_dtype=torch.bfloat16)
    assert all(torch.equal(a, b) for a, b in zip(ref, ours, strict=True))


def test_orthogonalize_batches_equal_one_matrix_at_a_time():
    coef = (3.4445, -4.7750, 2.0315)
    batched = orthogonalize(REPEATED, coef, 5, 1e-7, torch.float32)
    for g, x in zip(REPEATED, batched, strict=True):
        assert x.shape == g.shape
        assert torch.allclose(x, newton_schulz(g, coef, 5, 1e-7, torch.float32), atol=1e-6)


def test_our_muon_in_fp32_follows_torchs_up_to_bf16_rounding():
    start = [p.clone() for p in MATRICES]
    ref = _muon_steps(torch.optim.Muon, MATRICES)
    ours = _muon_steps(Muon, MATRICES, ns_dtype=torch.float32)
    for s, a, b in zip(start, ref, ours, strict=True):
        moved = (a - s).norm()
        assert (a - b).norm() < 0.02 * moved  # the same update, to bf16's ~3 digits
        assert not torch.equal(a, b)  # and really computed in another precision
        direction = torch.nn.functional.cosine_similarity((a - s).flatten(), (b - s).flatten(),
                                                          dim=0)
        assert direction > 0.999  # the weights move the same way


def test_newton_schulz_orthogonalizes_in_either_precision():
    g = torch.randn(48, 160)
    for dtype in (torch.float32, torch.bfloat16):
        s = torch.linalg.svdvals(newton_schulz(g, (3.4445, -4.7750, 2.0315), 5, 1e-7,
                                               dtype).float())
        assert s.min() > 0.3 and s.max() < 1.6  # near 1, as the quintic iteration leaves them
    tall = newton_schulz(g.T, (3.4445, -4.7750, 2.0315), 5, 1e-7, torch.float32)
    wide = newton_schulz(g, (3.4445, -4.7750, 2.0315), 5, 1e-7, torch.float32)
    assert torch.allclose(tall, wide.T, atol=1e-5)  # a tall matrix is done through its transpose


def test_muon_dtype_is_a_setting_and_auto_follows_the_hardware():
    from scratchgpt.training.config import TrainConfig
    from scratchgpt.training.precision import bf16_supported, resolve_muon_dtype

    cpu = torch.device("cpu")
    assert TrainConfig().muon_dtype == "bf16"  # torch's own Muon unless asked
    assert resolve_muon_dtype("auto", cpu) == ("bf16" if bf16_supported(cpu) else "fp32")
    assert resolve_muon_dtype("bf16", cpu) == "bf16"  # allowed everywhere (emulated where slow)
    with pytest.raises(ScratchGPTError):
        TrainConfig(muon_dtype="fp16")
    model = build_model(model_config("gpt", **GPT))
    opt = make_optimizer(model, 1e-3, 0.1, (0.9, 0.99), "muon", muon_dtype="fp32")
    assert opt.optimizers[1].ns_dtype == torch.float32


@pytest.mark.parametrize("norm", [0.01, 0.9999995, 1.0, 1.0000005, 30.0, math.inf, math.nan])
def test_clip_grad_norm_equals_torchs_bit_for_bit(norm):  # (max_norm 1)
    torch.manual_seed(0)
    model = build_model(model_config("gpt", **GPT))
    model(torch.randint(0, 65, (2, 16))).float().square().mean().backward()
    params = list(model.parameters())
    base = torch.nn.utils.get_total_norm([p.grad for p in params])
    with torch.no_grad():
        for p in params:
            p.grad *= (norm if math.isfinite(norm) else 1.0) / base
        if not math.isfinite(norm):  # one inf or NaN entry makes the norm so
            params[1].grad.view(-1)[0] = norm
    theirs = [p.grad.clone() for p in params]
    ours = [p.grad for p in params]
    for p, g in zip(params, theirs, strict=True):
        p.grad = g
    want = torch.nn.utils.clip_grad_norm_(params, 1.0)
    for p, g in zip(params, ours, strict=True):
        p.grad = g
    got = clip_grad_norm(params, 1.0)

    def same(a: torch.Tensor, b: torch.Tensor) -> bool:  # bit for bit, NaN matching NaN
        return torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))

    assert same(got, want)
    if math.isfinite(norm):
        assert abs(float(got) - norm) < 1e-5
    assert all(same(a, b) for a, b in zip(ours, theirs, strict=True))


def test_the_docstring_examples_run_and_show_what_they_return():
    result = doctest.testmod(optim)
    assert result.attempted > 0 and result.failed == 0
