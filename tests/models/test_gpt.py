import pytest
import torch

from scratchgpt.errors import ScratchGPTError
from scratchgpt.models.gpt import GPT, GPTConfig


def tiny(**kw) -> GPT:
    torch.manual_seed(0)
    cfg = dict(vocab_size=37, block_size=24, n_layer=2, n_head=4, n_embd=32)
    cfg.update(kw)
    return GPT(GPTConfig(**cfg)).eval()


# Architecture options, alone and combined, that every exactness test runs (name: config).
OPTIONS = {
    "gpt2": {},
    "sinusoidal": dict(pos_encoding="sinusoidal"),
    "rope": dict(pos_encoding="rope"),
    "qk_norm": dict(qk_norm=True),
    "gelu": dict(activation="gelu"),
    "relu": dict(activation="relu"),
    "relu2": dict(activation="relu2"),
    "zero_init_proj": dict(zero_init_proj=True),
    # 5 layers, 2 tables: layers 0, 1, 3, 4 read tables 0, 1, 0, 1
    "value_embeds": dict(n_layer=5, value_embeds=2),
    "value_embeds_overlap": dict(n_layer=3, value_embeds=2),  # layer 1 is first and last
    "unet_skips": dict(n_layer=5, unet_skips=True),  # 0 -> 4, 1 -> 3; layer 2 has none
    "logit_softcap": dict(logit_softcap=2.0),
    "no_residual": dict(residual=False),
    "no_layernorm": dict(layernorm=False),
    "no_mlp": dict(mlp=False),
    "untied_no_bias": dict(tie_weights=False, bias=False),
    "one_head": dict(n_layer=1, n_head=1, mlp=False, residual=False, layernorm=False),
    "speedrun": dict(n_layer=4, pos_encoding="rope", qk_norm=True, activation="relu2",
                     zero_init_proj=True, value_embeds=1, unet_skips=True, logit_softcap=15.0,
                     tie_weights=False, bias=False),
}


def option_model(name: str, **kw) -> GPT:
    """A tiny GPT with the option ``name``, every parameter moved off its initial value (so
    zero-initialized projections, gains, mixing weights and skip weights all matter)."""
    model = tiny(**{**OPTIONS[name], **kw})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.mark.parametrize("option", OPTIONS)
def test_causal_future_tokens_do_not_change_past_logits(option):
    model = option_model(option)
    x = torch.randint(0, 37, (2, 16))
    y = x.clone()
    y[:, 10:] = torch.randint(0, 37, (2, 6))
    with torch.no_grad():
        a, b = model(x), model(y)
    assert torch.allclose(a[:, :10], b[:, :10], atol=1e-6)
    assert not torch.allclose(a[:, 10:], b[:, 10:], atol=1e-3)


def test_fast_attention_equals_plain_math():
    fast = tiny()
    slow = tiny(attn_impl="math")
    slow.load_state_dict(fast.state_dict())
    x = torch.randint(0, 37, (3, 20))
    with torch.no_grad():
        assert torch.allclose(fast(x), slow(x), atol=1e-5)
        logits, weights = fast.forward_with_attention(x)
    assert torch.allclose(logits, fast(x), atol=1e-5)
    assert len(weights) == 2 and weights[0].shape == (3, 4, 20, 20)
    assert torch.allclose(weights[0].sum(-1), torch.ones(3, 4, 20), atol=1e-5)
    assert torch.all(weights[1].triu(1) == 0)  # nothing attends to the future


@pytest.mark.parametrize("option", OPTIONS)
def test_cache_rollback_recomputes_same_logits(option):
    model = option_model(option)
    x = torch.randint(0, 37, (1, 12))
    cache = model.new_cache(1)
    with torch.no_grad():
        a = model(x, cache=cache)
        cache.rollback(5)
        b = model(x[:, 5:], cache=cache)
    assert torch.allclose(a[:, 5:], b, atol=1e-5)


def test_context_overflow_is_an_error():
    model = tiny()
    with pytest.raises(ScratchGPTError, match="exceeds the context"):
        model(torch.zeros(1, 25, dtype=torch.long))


def test_weight_tying_and_param_count():
    model = tiny()
    assert model.lm_head.weight is model.transformer.wte.weight
    total = sum(p.numel() for p in model.parameters())
    assert model.num_params(non_embedding=False) == total
    assert model.num_params() == total - 24 * 32
    untied = tiny(tie_weights=False)
    assert untied.num_params() == model.num_params() + 37 * 32


def test_residual_projection_init_is_scaled():
    model = GPT(GPTConfig(vocab_size=50, n_layer=8, n_head=4, n_embd=256, block_size=16))
    std = model.transformer.h[0].attn.c_proj.weight.std().item()
    assert abs(std - 0.02 / (2 * 8) ** 0.5) < 0.001


def test_attention_dropout_can_be_set_apart():
    """attn_dropout=0 keeps the residual/embedding dropout but drops no attention weight."""
    x = torch.randint(0, 37, (2, 24))
    only_resid = tiny(dropout=0.5, attn_dropout=0.0).train()
    assert all(b.attn.attn_dropout == 0.0 for b in only_resid.transformer.h)
    assert only_resid.transformer.h[0].attn.resid_dropout.p == 0.5
    # the fast and math paths then agree under the same dropout masks (same seed)
    torch.manual_seed(1)
    a = only_resid(x)
    for b in only_resid.transformer.h:
        b.attn.impl = "math"
    torch.manual_seed(1)
    assert torch.allclose(a, only_resid(x), atol=1e-5)
    # attention dropout alone still changes the output between calls in training mode
    only_attn = tiny(dropout=0.0, attn_dropout=0.5).train()
    assert not torch.allclose(only_attn(x), only_attn(x))
    assert tiny(dropout=0.3).transformer.h[1].attn.attn_dropout == 0.3  # None: same as dropout


@pytest.mark.parametrize("bad", [dict(n_embd=30, n_head=4), dict(dropout=1.0),
                                 dict(n_layer=0), dict(pos_encoding="alibi"),
                                 dict(attn_dropout=1.0), dict(attn_dropout=-0.1),
                                 dict(activation="swish"), dict(attn_impl="flash"),
                                 dict(pos_encoding="rope", n_embd=12, n_head=4),  # odd heads
                                 dict(value_embeds=-1), dict(value_embeds=3, n_layer=2),
                                 dict(unet_skips=True, n_layer=1), dict(logit_softcap=-1.0),
                                 dict(logit_softcap=float("inf")),
                                 dict(zero_init_proj=True, residual=False)])
def test_invalid_config_is_a_user_error(bad):
    cfg = dict(vocab_size=10, n_embd=32, n_head=4)
    cfg.update(bad)
    with pytest.raises(ScratchGPTError):
        GPTConfig(**cfg)


@pytest.mark.parametrize("option", OPTIONS)
def test_kv_cache_equals_full_recompute_for_a_batch_with_chunked_prefill(option):
    model = option_model(option)
    x = torch.randint(0, 37, (3, 24))
    cache = model.new_cache(3)
    with torch.no_grad():
        full = model(x)
        pre = model(x[:, :5], cache=cache)
        chunk = model(x[:, 5:9], cache=cache)  # a multi-token step after the prefill
        assert torch.allclose(torch.cat([pre, chunk], 1), full[:, :9], atol=1e-5)
        for t in range(9, 24):
            assert torch.allclose(model(x[:, t:t + 1], cache=cache)[:, 0], full[:, t], atol=1e-5)
    assert cache.pos == 24


@pytest.mark.parametrize("impl", ["sdpa", "math"])
@pytest.mark.parametrize("option", OPTIONS)
def test_left_padded_rows_compute_what_they_would_alone(impl, option):
    """Rows of different lengths, left-padded into one cache: at every prefill position and
    every decode step each row's logits equal that row run alone, with no cache at all."""
    model = option_model(option, attn_impl=impl)
    lengths, new = [3, 9, 6], 8
    rows = [torch.randint(0, 37, (n + new,)) for n in lengths]
    width = max(lengths)
    n_pad = torch.tensor([width - n for n in lengths])
    idx = torch.stack([torch.cat([torch.zeros(p, dtype=torch.long), r[:n]])
                       for p, r, n in zip(n_pad.tolist(), rows, lengths, strict=True)])
    cache = model.new_cache(3)
    cache.left_pad(n_pad)
    with torch.no_grad():
        alone = [model(r[None])[0] for r in rows]  # (n + new, V) each
        pre = model(idx, cache=cache)  # (3, width, V)
        assert not pre.isnan().any()
        for b, n in enumerate(lengths):
            assert torch.allclose(pre[b, width - n:], alone[b][:n], atol=1e-5)
        for s in range(new):
            nxt = torch.stack([r[n + s] for r, n in zip(rows, lengths, strict=True)])  # (3,)
            step = model(nxt[:, None], cache=cache)[:, 0]
            for b, n in enumerate(lengths):
                assert torch.allclose(step[b], alone[b][n + s], atol=1e-5)
