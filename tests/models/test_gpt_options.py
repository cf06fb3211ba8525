"""Architecture options of the GPT: what each one computes, and that every one trains, saves,
loads, decodes fast and speculates exactly. (KV-cache, left-padding and NumPy-spec exactness of
every option: test_gpt.py and test_gpt_numpy.py.)"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from scratchgpt.checkpoints.io import Checkpoint, load_model, save_checkpoint
from scratchgpt.errors import ConfigError
from scratchgpt.generation.generate import generate
from scratchgpt.generation.sampling import SamplingConfig
from scratchgpt.generation.speculative import speculative_generate
from scratchgpt.models.fast_decode import optimize_for_decode
from scratchgpt.models.gpt import GPT, GPTConfig, gpt2_incompatibility
from scratchgpt.models.layers import apply_rope, rope_tables, value_embed_table
from scratchgpt.training.optim import hidden_matrices
from tests.models.test_gpt import OPTIONS, option_model, tiny

GREEDY = SamplingConfig(temperature=0)


def test_rope_scores_depend_only_on_relative_position():
    cos, sin = rope_tables(64, 8)
    q, k = torch.randn(8), torch.randn(8)

    def score(i: int, j: int) -> float:
        return float(apply_rope(q, cos[i], sin[i]) @ apply_rope(k, cos[j], sin[j]))

    assert score(40, 33) == pytest.approx(score(7, 0), abs=1e-5)
    assert score(40, 33) != pytest.approx(score(40, 30), abs=1e-3)
    assert torch.equal(apply_rope(q, cos[0], sin[0]), q)  # position 0 is not turned
    turned = apply_rope(q, cos[13], sin[13])
    assert torch.linalg.norm(turned) == pytest.approx(float(torch.linalg.norm(q)))  # a rotation


def test_rope_equals_transformers_llama_rotary():
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    B, H, T, D = 2, 3, 10, 16
    q, k = torch.randn(B, H, T, D), torch.randn(B, H, T, D)
    pos = torch.arange(T)
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, D, 2, dtype=torch.float64) / D)  # (D/2,)
    angles = torch.cat([pos[:, None] * inv_freq[None]] * 2, dim=-1)  # (T, D): HF's layout
    theirs = llama.apply_rotary_pos_emb(q, k, angles.cos().float()[None],
                                        angles.sin().float()[None])
    cos, sin = rope_tables(T, D)
    assert torch.allclose(apply_rope(q, cos, sin), theirs[0], atol=1e-6)
    assert torch.allclose(apply_rope(k, cos, sin), theirs[1], atol=1e-6)


def test_value_embedding_tables_repeat_in_the_last_layers():
    assert [value_embed_table(i, 6, 3) for i in range(6)] == [0, 1, 2, 0, 1, 2]
    assert [value_embed_table(i, 5, 2) for i in range(5)] == [0, 1, None, 0, 1]
    assert [value_embed_table(i, 3, 2) for i in range(3)] == [0, 1, 1]
    assert [value_embed_table(i, 4, 0) for i in range(4)] == [None] * 4
    model = tiny(n_layer=5, value_embeds=2)
    has = [b.attn.ve_lambda is not None for b in model.transformer.h]
    assert has == [True, True, False, True, True] and len(model.transformer.ve) == 2


def test_zero_init_projections_start_every_block_as_the_identity():
    model = tiny(zero_init_proj=True, n_layer=3)
    projections = [p for n, p in model.named_parameters() if n.endswith("c_proj.weight")]
    assert len(projections) == 6 and all(bool((p == 0).all()) for p in projections)
    x = torch.randint(0, 37, (2, 12))
    t = model.transformer
    # biases start at zero too, so attention and MLP add nothing: logits = head(ln_f(embedding))
    expected = model.lm_head(t.ln_f(t.wte(x) + t.wpe(torch.arange(12))))
    with torch.no_grad():
        assert torch.allclose(model(x), expected, atol=1e-6)
    # the other weights are drawn exactly as without the option
    plain = tiny(n_layer=3)
    assert torch.equal(plain.transformer.h[2].mlp.c_fc.weight, t.h[2].mlp.c_fc.weight)


def test_logit_softcap_bounds_the_logits():
    plain = option_model("gpt2")
    capped = tiny(logit_softcap=2.0)
    capped.load_state_dict(plain.state_dict())
    with torch.no_grad():
        plain.lm_head.weight.mul_(50)  # logits far past the cap (tied: embeddings grow too)
        capped.lm_head.weight.mul_(50)
        x = torch.randint(0, 37, (2, 16))
        raw, soft = plain(x), capped(x)
    assert raw.abs().max() > 10 and soft.abs().max() <= 2.0
    assert torch.allclose(soft, 2.0 * torch.tanh(raw / 2.0), atol=1e-5)


def test_lecture_switches_remove_their_parts():
    no_mlp = tiny(mlp=False)
    assert all(b.mlp is None and b.ln_2 is None for b in no_mlp.transformer.h)
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in tiny(layernorm=False).modules())
    one_head = tiny(**OPTIONS["one_head"])
    # a bigram-like core plus one head: embeddings, q/k/v/out projections, a tied head
    C = 32
    expected = 37 * C + 24 * C + (3 * C * C + 3 * C) + (C * C + C)
    assert one_head.num_params(non_embedding=False) == expected


def test_torch_weight_init_keeps_what_each_torch_module_draws():
    model = tiny(weight_init="torch", tie_weights=False)
    torch.manual_seed(0)  # tiny() seeds 0 too; the token table is the first module built
    assert torch.equal(model.transformer.wte.weight, torch.nn.Embedding(37, 32).weight)
    std = {name: float(p.detach().std()) for name, p in model.named_parameters()}
    assert std["transformer.wpe.weight"] == pytest.approx(1.0, rel=0.15)  # N(0, 1)
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):  # U(-1/sqrt(fan_in), 1/sqrt(fan_in)), projections too
            bound = 1 / math.sqrt(m.in_features)
            assert float(m.weight.detach().abs().max()) <= bound, name
            assert std[f"{name}.weight"] == pytest.approx(bound / math.sqrt(3), rel=0.15), name
    gpt2 = tiny(tie_weights=False)  # the default: N(0, 0.02), residual projections smaller
    std = {name: float(p.detach().std()) for name, p in gpt2.named_parameters()}
    assert std["transformer.h.0.mlp.c_fc.weight"] == pytest.approx(0.02, rel=0.1)
    assert std["transformer.h.0.mlp.c_proj.weight"] == pytest.approx(0.01, rel=0.1)
    with pytest.raises(ConfigError, match="weight_init must be one of"):
        GPTConfig(weight_init="xavier")


def test_option_refusals_name_the_config_fields():
    """From Python they name the fields; the CLI names its flags through the same words
    (tests/commands/test_cli.py)."""
    with pytest.raises(ConfigError) as e:
        GPTConfig(n_embd=30, n_head=6, pos_encoding="rope")
    assert str(e.value) == ("pos_encoding (rope) needs an even head width, as it rotates pairs "
                            "of features: n_embd / n_head = 5")
    with pytest.raises(ConfigError) as e:
        GPTConfig(n_layer=1, unet_skips=True)
    assert str(e.value).startswith("unet_skips needs n_layer >= 2 ")


def test_parameter_count_leaves_out_every_lookup_table_but_the_head():
    model = tiny(value_embeds=2, pos_encoding="rope", qk_norm=True, unet_skips=True)
    total = sum(p.numel() for p in model.parameters())
    assert model.num_params(non_embedding=False) == total
    assert model.num_params() == total - 2 * 37 * 32  # the two value tables
    assert model.skip_weights.shape == (1,) and "wpe" not in model.transformer


def test_muon_takes_the_linear_weights_of_every_option_and_no_lookup_table():
    model = tiny(**OPTIONS["speedrun"])
    muon = {id(p) for p in hidden_matrices(model)}
    linears = [m.weight for m in model.modules()
               if isinstance(m, torch.nn.Linear) and m is not model.lm_head]
    assert muon == {id(w) for w in linears}
    assert all(id(t.weight) not in muon for t in model.transformer.ve)


@pytest.mark.parametrize("option", OPTIONS)
def test_every_option_trains(option):
    """A few AdamW steps on a learnable sequence (each token fixes the next) lower the loss
    (from ln 37 = 3.6; the slowest, without residuals, ends near 2.8)."""
    torch.manual_seed(0)
    model = tiny(**OPTIONS[option]).train()
    start = torch.randint(0, 37, (8, 1))
    seq = (start * 7 ** torch.arange(25)[None] + 3) % 37  # x[t+1] is a function of x[t]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    losses = []
    for _ in range(40):
        logits = model(seq[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 37), seq[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5, (losses[0], losses[-1])


@pytest.mark.parametrize("option", ["speedrun", "one_head", "unet_skips", "value_embeds"])
def test_a_bf16_autocast_step_keeps_dtypes_consistent(option):
    model = tiny(**OPTIONS[option]).train()
    x = torch.randint(0, 37, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(x).float().logsumexp(-1).mean()
    loss.backward()
    assert all(p.grad is not None and p.grad.isfinite().all()
               for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("option", OPTIONS)
def test_every_option_saves_loads_and_samples(option, tmp_path):
    model = option_model(option)
    path = tmp_path / "best.pt"
    save_checkpoint(path, Checkpoint("gpt", model.config, model.state_dict()))
    loaded, _ = load_model(path)
    x = torch.randint(0, 37, (2, 20))
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    # cached greedy generation equals recomputing everything for every new token
    out = generate(loaded, x[:1, :4], 16, GREEDY)
    ids = x[:1, :4]
    with torch.no_grad():
        for _ in range(16):
            ids = torch.cat([ids, model(ids)[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(out, ids)


@pytest.mark.parametrize("pack_min_bytes", [0, None])  # every Linear packed; the default
@pytest.mark.parametrize("option", ["speedrun", "value_embeds", "one_head", "no_layernorm"])
def test_fast_decode_keeps_every_option_exact(option, pack_min_bytes):
    model = option_model(option)
    fast = optimize_for_decode(copy.deepcopy(model), *([] if pack_min_bytes is None
                                                       else [pack_min_bytes]))
    x = torch.randint(0, 37, (2, 20))
    with torch.no_grad():
        assert torch.allclose(fast(x), model(x), atol=1e-5)
    assert torch.equal(generate(fast, x[:, :4], 16, GREEDY), generate(model, x[:, :4], 16, GREEDY))
    layout = copy.deepcopy(model).decode_layout_()
    with torch.no_grad():
        assert torch.allclose(layout(x), model(x), atol=1e-5)


def test_speculative_greedy_with_rope_and_qk_norm_equals_target_greedy():
    def model(seed: int, **kw) -> GPT:
        torch.manual_seed(seed)
        m = GPT(GPTConfig(vocab_size=8, block_size=32, n_head=2, n_embd=16, **kw))
        with torch.no_grad():
            for p in m.parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, 0.5)  # far from uniform, so drafts are sometimes wrong
        return m.eval()

    target = model(1, n_layer=2, pos_encoding="rope", qk_norm=True, activation="relu2")
    draft = model(2, n_layer=1, pos_encoding="rope")
    prompt = torch.tensor([[3, 1, 4]])
    ref = generate(target, prompt, 60, GREEDY)  # past the context of 32: the window slides
    for k in (1, 3, 5):
        out, stats = speculative_generate(target, draft, prompt, 60, k, GREEDY)
        assert out.tolist() == ref.tolist()
        assert sum(stats.accepted) < sum(stats.drafted)


@pytest.mark.parametrize("cfg, flag", [
    (dict(bias=False), "--no-bias"), (dict(pos_encoding="sinusoidal"), "--pos-encoding"),
    (dict(pos_encoding="rope"), "--pos-encoding rope"), (dict(qk_norm=True), "--qk-norm"),
    (dict(activation="relu"), "--activation relu"), (dict(activation="relu2"), "--activation"),
    (dict(value_embeds=1), "--value-embeds"), (dict(unet_skips=True), "--unet-skips"),
    (dict(logit_softcap=15.0), "--logit-softcap"), (dict(residual=False), "--no-residual"),
    (dict(layernorm=False), "--no-layernorm"), (dict(mlp=False), "--no-mlp"),
])
def test_gpt2_incompatibility_names_the_flag(cfg, flag):
    reason = gpt2_incompatibility(GPTConfig(**cfg))
    assert reason is not None and reason.startswith(flag) and "\n" not in reason
    assert gpt2_incompatibility(GPTConfig(**cfg).to_dict()) == reason  # a dict works too


def test_gpt2_expressible_configs_have_no_incompatibility():
    for cfg in ({}, dict(zero_init_proj=True), dict(tie_weights=False), dict(activation="gelu"),
                dict(n_head=1, n_layer=1, dropout=0.2)):
        assert gpt2_incompatibility(GPTConfig(**cfg)) is None
    assert math.isclose(GPTConfig().logit_softcap, 0.0)  # off by default
