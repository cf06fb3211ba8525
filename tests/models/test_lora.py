"""LoRA and the GPT classifier: the equations, merging, what trains, padding, and parity with
peft's LoRA on a GPT-2-shaped model imported from Hugging Face."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from scratchgpt.errors import ConfigError
from scratchgpt.models import build_model, config_dict, model_config
from scratchgpt.models.classifier import GPTClassifier, GPTClassifierConfig
from scratchgpt.models.dropout import dropout
from scratchgpt.models.gpt import GPT, GPTConfig
from scratchgpt.models.lora import (
    GPTLoRAConfig,
    LoRAConfig,
    LoRALinear,
    add_lora,
    count_parameters,
    freeze_all_but,
    merge_lora,
)

TINY = GPTConfig(vocab_size=40, block_size=32, n_layer=3, n_head=2, n_embd=16)


def test_lora_linear_computes_the_equation():
    torch.manual_seed(0)
    base = nn.Linear(12, 7)
    layer = LoRALinear.wrap(base, rank=3, alpha=6.0)
    with torch.no_grad():
        layer.lora_B.normal_()
    x = torch.randn(5, 12)
    want = x @ base.weight.T + base.bias + (6.0 / 3) * (x @ layer.lora_A.T @ layer.lora_B.T)
    torch.testing.assert_close(layer(x), want)
    assert layer.weight is base.weight  # wraps, does not copy


def test_dropout_acts_on_the_lora_path_only():
    torch.manual_seed(0)
    base = nn.Linear(12, 7)
    layer = LoRALinear.wrap(base, rank=3, alpha=6.0, dropout=0.5)
    with torch.no_grad():
        layer.lora_B.normal_()
    x = torch.randn(64, 12)
    torch.manual_seed(1)
    y = layer(x)  # training mode: dropout is on
    torch.manual_seed(1)
    dropped = dropout(x, 0.5)  # the same draw
    want = x @ base.weight.T + base.bias + 2.0 * (dropped @ layer.lora_A.T @ layer.lora_B.T)
    torch.testing.assert_close(y, want)
    assert not torch.allclose(dropped, x)  # something was dropped, but not on the base path
    layer.eval()
    torch.testing.assert_close(layer(x), x @ base.weight.T + base.bias
                               + 2.0 * (x @ layer.lora_A.T @ layer.lora_B.T))


def test_b_starts_at_zero_so_the_adapted_model_is_the_base():
    torch.manual_seed(0)
    model = GPT(TINY)
    idx = torch.randint(0, 40, (2, 10))
    before = model(idx)
    names = add_lora(model, LoRAConfig(rank=4, targets="attn,mlp"))
    assert len(names) == 4 * TINY.n_layer
    assert all(float(m.lora_B.detach().abs().sum()) == 0 for m in model.modules()
               if isinstance(m, LoRALinear))
    assert torch.equal(model(idx), before)


def test_merged_logits_equal_unmerged():
    torch.manual_seed(0)
    model = build_model(GPTLoRAConfig(TINY, LoRAConfig(rank=4, alpha=8.0)))
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LoRALinear):
                m.lora_B.normal_(std=0.1)
    model.eval()
    idx = torch.randint(0, 40, (2, 12))
    unmerged = model(idx)
    assert merge_lora(model) == 4 * TINY.n_layer
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    torch.testing.assert_close(model(idx), unmerged, atol=1e-5, rtol=1e-5)


def test_only_adapters_train_and_get_gradients():
    model = build_model(GPTLoRAConfig(TINY, LoRAConfig(rank=2, targets="qkv")))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n and "c_attn" in n for n in trainable)
    model(torch.randint(0, 40, (2, 8))).sum().backward()
    assert all(p.grad is None for n, p in model.named_parameters() if "lora_" not in n)
    n_train, n_total = count_parameters(model)
    assert n_train == TINY.n_layer * 2 * (16 + 48)
    assert n_train < 0.2 * n_total


# Each named the command's flag (--lora-rank, --lora-targets) or its destination (lora_alpha)
# to a Python caller, who gives LoRAConfig's fields: they name the field, as GPTConfig's do
# (the commands name their --lora-* flags: tests/finetune/test_finetune_cli.py).
@pytest.mark.parametrize("values, message", [
    (dict(rank=0), "rank must be >= 1, got 0 (a rank-0 update adapts nothing; train without "
                   "adapters instead)"),
    (dict(alpha=0.0), "alpha must be > 0, got 0.0"),
    (dict(dropout=1.0), "dropout must be in [0, 1), got 1.0"),
    (dict(targets="attn,ffn"), "targets must be comma-separated names from qkv, attn, mlp, "
                               "got 'attn,ffn'"),
])
def test_bad_lora_settings_are_one_line_errors_naming_the_field(values, message):
    with pytest.raises(ConfigError) as e:
        LoRAConfig(**values)
    assert str(e.value) == message


def test_a_rank_wider_than_the_adapted_layers_is_refused_naming_the_field():
    """A rank above the width of the layers (n_embd for a GPT's) is refused when the config
    is made, in words of its fields, and so by add_lora for any model's layers."""
    wide = LoRAConfig(rank=TINY.n_embd + 1)
    message = (f"rank ({TINY.n_embd + 1}) must be at most the width of the layers it adapts "
               f"({TINY.n_embd}): a higher rank adds parameters, not updates it can make")
    for make in (lambda: GPTLoRAConfig(TINY, wide),
                 lambda: GPTClassifierConfig(TINY, 2, "lora", 1, wide)):
        with pytest.raises(ConfigError) as e:
            make()
        assert str(e.value) == message
    GPTLoRAConfig(TINY, LoRAConfig(rank=TINY.n_embd))  # as wide as the layers: taken
    block = nn.ModuleDict({"attn": nn.ModuleDict({"c_attn": nn.Linear(8, 32)})})
    with pytest.raises(ConfigError, match=r"^rank \(9\) must be at most the width of the "
                                          r"layers it adapts \(8\)"):
        add_lora(block, LoRAConfig(rank=9, targets="qkv"))
    with pytest.raises(ConfigError) as e:
        add_lora(block, LoRAConfig(rank=2, targets="mlp"))
    assert str(e.value) == ("targets must name layers the model has, got 'mlp' (it has no "
                            "mlp.c_fc, mlp.c_proj)")


def test_nested_configs_round_trip_as_plain_data(tmp_path):
    cfg = GPTClassifierConfig(TINY, 3, "lora", 1, LoRAConfig(rank=2))
    plain = config_dict(cfg)
    assert plain["gpt"]["n_layer"] == 3 and plain["lora"]["rank"] == 2
    torch.save(plain, tmp_path / "c.pt")
    loaded = torch.load(tmp_path / "c.pt", weights_only=True)
    assert model_config("gpt-classifier", **loaded) == cfg
    with pytest.raises(ConfigError, match="^the gpt of model 'gpt-classifier' does not take "
                                          "bogus$"):
        model_config("gpt-classifier", **{**loaded, "gpt": {**loaded["gpt"], "bogus": 1}})


# ---- the classifier


@pytest.mark.parametrize("policy, k, expect", [
    ("head", 1, {"head.weight", "head.bias"}),
    ("last-k", 2, None),
    ("all", 1, None),
])
def test_freezing_policies(policy, k, expect):
    model = GPTClassifier(GPTClassifierConfig(TINY, 2, policy, k))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    if policy == "head":
        assert trainable == expect
    elif policy == "last-k":
        blocks = {n.split(".")[3] for n in trainable if n.startswith("gpt.transformer.h.")}
        assert blocks == {"1", "2"} and "gpt.transformer.ln_f.weight" in trainable
        assert "gpt.transformer.wte.weight" not in trainable
    else:
        assert trainable == {n for n, _ in model.named_parameters()}


def test_classifier_reads_the_last_real_token_whatever_the_padding():
    torch.manual_seed(0)
    model = GPTClassifier(GPTClassifierConfig(TINY, 3)).eval()
    a, b = torch.randint(1, 40, (1, 5)), torch.randint(1, 40, (1, 9))
    batch = torch.zeros(2, 9, dtype=torch.long)
    batch[0, :5], batch[1] = a[0], b[0]
    batch[0, 5:] = 7  # padding of any value
    together = model(batch, torch.tensor([5, 9]))
    torch.testing.assert_close(together[0], model(a)[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(together[1], model(b)[0], atol=1e-5, rtol=1e-5)


def test_classifier_policy_checks():
    """Its refusals name its fields (last_k, train), not the flags of scratchgpt finetune."""
    with pytest.raises(ConfigError) as e:
        GPTClassifierConfig(TINY, 2, "last-k", 4)
    assert str(e.value) == "last_k must be in [1, n_layer = 3], got 4"
    with pytest.raises(ConfigError) as e:
        GPTClassifierConfig(TINY, 2, "lastk")
    assert str(e.value) == "train must be one of all, head, last-k, lora, got 'lastk'"
    with pytest.raises(ConfigError, match="at least 2 classes"):
        GPTClassifierConfig(TINY, 1)


# ---- parity with peft


def test_lora_forward_and_gradients_equal_peft(tmp_path):
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from scratchgpt.checkpoints.hf import load_hf

    torch.manual_seed(0)
    hf_cfg = transformers.GPT2Config(vocab_size=50, n_positions=32, n_embd=32, n_layer=2,
                                     n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0)
    transformers.GPT2LMHeadModel(hf_cfg).save_pretrained(tmp_path)
    ours, _ = load_hf(tmp_path)  # the same initial weights, through our importer
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path, attn_implementation="eager")
    rank, alpha = 4, 8
    theirs = peft.get_peft_model(hf, peft.LoraConfig(
        r=rank, lora_alpha=alpha, lora_dropout=0.0, fan_in_fan_out=True,
        target_modules=["c_attn", "c_proj", "c_fc"]))
    add_lora(ours, LoRAConfig(rank=rank, alpha=float(alpha), targets="attn,mlp"))
    freeze_all_but(ours, ("lora_",))  # as build_gpt_lora does
    # B = 0 would give A no gradient: give both random values, the same on each side
    pairs = []
    for name, m in ours.named_modules():
        if isinstance(m, LoRALinear):
            peft_layer = theirs.get_submodule(f"base_model.model.{name}")
            with torch.no_grad():
                peft_layer.lora_B["default"].weight.normal_(std=0.1)
                m.lora_A.copy_(peft_layer.lora_A["default"].weight)
                m.lora_B.copy_(peft_layer.lora_B["default"].weight)
            pairs.append((m, peft_layer))
    assert len(pairs) == 8
    ours.eval()
    theirs.eval()
    idx = torch.randint(0, 50, (2, 16))
    target = torch.randint(0, 50, (2, 16))
    logits_ours, logits_theirs = ours(idx), theirs(input_ids=idx).logits
    torch.testing.assert_close(logits_ours, logits_theirs, atol=1e-5, rtol=1e-5)
    F.cross_entropy(logits_ours.reshape(-1, 50), target.reshape(-1)).backward()
    F.cross_entropy(logits_theirs.reshape(-1, 50), target.reshape(-1)).backward()
    for m, p in pairs:
        torch.testing.assert_close(m.lora_A.grad, p.lora_A["default"].weight.grad,
                                   atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(m.lora_B.grad, p.lora_B["default"].weight.grad,
                                   atol=1e-5, rtol=1e-5)
    n_ours = count_parameters(ours)[0]
    assert n_ours == sum(p.numel() for p in theirs.parameters() if p.requires_grad)
