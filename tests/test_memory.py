"""The memory check's refusal: sizes in the unit that shows them."""

import pytest

from scratchgpt import memory
from scratchgpt.errors import ConfigError


def test_a_small_budget_is_shown_in_a_unit_that_says_something():
    """A 10 KiB limit against a model of a few hundred KiB read '0.0 GiB ... more than the
    0.0 GiB of memory available'."""
    estimate = memory.Estimate({"weights": 300 * 2**10, "activations": 50 * 2**10})
    with pytest.raises(ConfigError) as refused:
        memory.check_fits(estimate, "the model", available=10 * 2**10)
    message = str(refused.value)
    assert "about 350.0 KiB (weights 300.0, activations 50.0)" in message
    assert "more than the 10.0 KiB of memory available" in message
    assert memory.Estimate({"weights": 3 * 2**30}).describe() == "3.0 GiB (weights 3.0)"
    assert memory.parse_bytes("10KiB") == 10 * 2**10  # the limit's own units, unchanged


@pytest.mark.parametrize("rows, new_tokens", [(1, 30), (2, 30), (2, 8)])
def test_the_kv_estimate_holds_the_slots_generation_takes(rows, new_tokens):
    """The estimate that sample checks before a batch counts the cache slots decode holds: a
    batch past the context reserves more slots than the context (for rows sliding at their
    own lengths), which the estimate left out."""
    from scratchgpt.generation.decode import decode
    from scratchgpt.generation.sampling import SamplingConfig
    from tests.tiny_gpt import sharp_gpt

    model = sharp_gpt()
    caches, new_cache = [], model.new_cache
    model.new_cache = lambda *a, **k: caches.append(new_cache(*a, **k)) or caches[-1]
    prompts = [[1, 2, 3, 4, 5][: 3 + 2 * r] for r in range(rows)]
    for _ in decode(model, prompts, new_tokens, SamplingConfig(temperature=0)):
        pass
    held = sum(t.numel() * t.element_size() for t in (caches[0].k, caches[0].v))
    length = max(map(len, prompts)) + new_tokens
    estimate = memory.inference_estimate(model.config, rows, length).parts["kv_cache"]
    assert held <= estimate
    assert held > 0.75 * estimate  # (and not far more than it takes)


def test_a_classifier_is_estimated_with_its_gpt_s_shape():
    """A classifier's config wraps its GPT's, whose shape the estimate did not look into: it
    saw width 1, 1 layer and context 1, and estimated bytes of activations where a forward
    keeps a GPT's worth (a GPT-2-small classifier at batch 8: 0 GiB of some 4). The estimate
    comes within a tenth of what a real forward keeps for the backward pass (its blocks keep
    about 17 x width floats a token, the estimate counts 16), where it was 1/5000 of it."""
    import torch

    from scratchgpt.models.classifier import GPTClassifier, GPTClassifierConfig
    from scratchgpt.models.gpt import GPTConfig

    gpt = GPTConfig(vocab_size=65, n_layer=2, n_head=2, n_embd=128, block_size=32)
    model = GPTClassifier(GPTClassifierConfig(gpt, 3))
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def keep(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        model(torch.randint(0, 65, (4, 32)))
    estimate = memory.training_estimate(model.config, batch_size=4)
    assert estimate.parts["activations"] >= 0.9 * sum(kept.values()) > 0
    assert estimate.parts["weights"] == 4 * sum(p.numel() for p in model.parameters())


def test_a_lora_model_is_estimated_with_its_gpt_s_shape():
    """A LoRA model wraps its GPT's config too: its estimate counted one layer of width 1
    and no vocabulary, though it runs its whole GPT and its logits (the KV cache of its
    inference: one position, as if it were an RNN)."""
    from scratchgpt.models.gpt import GPTConfig
    from scratchgpt.models.lora import GPTLoRAConfig, LoRAConfig

    gpt = GPTConfig(vocab_size=65, n_layer=2, n_head=2, n_embd=32, block_size=16)
    lora = GPTLoRAConfig(gpt, LoRAConfig(rank=2))
    for estimate in (memory.training_estimate, memory.inference_estimate):
        wrapped, plain = estimate(lora, 4).parts, estimate(gpt, 4).parts
        for part in ("activations", "kv_cache"):  # (its weights: the GPT's and adapters)
            assert wrapped.get(part) == plain.get(part), part
    assert memory.inference_estimate(gpt, 4).parts["kv_cache"] > 0


def test_a_deep_classifier_or_lora_model_is_counted_from_two_shallow_builds(monkeypatch):
    """A deep GPT is counted from two shallow builds; one inside a classifier's or LoRA
    model's config was built whole on the meta device, every layer of it (20,000 layers:
    35 s, where its GPT took 0.04; a checkpoint claiming a million, minutes). The counts of
    the shallow builds are the model's own, trained blocks (--train last-k) included."""
    from scratchgpt.models import build_model
    from scratchgpt.models.classifier import GPTClassifierConfig
    from scratchgpt.models.gpt import GPTConfig
    from scratchgpt.models.lora import GPTLoRAConfig, LoRAConfig
    from scratchgpt.training.optim import hidden_matrices

    gpt = GPTConfig(vocab_size=65, n_layer=memory.DIRECT_DEPTH + 6, n_head=2, n_embd=32,
                    block_size=16)
    configs = [GPTClassifierConfig(gpt, 3), GPTClassifierConfig(gpt, 3, "last-k", 5),
               GPTClassifierConfig(gpt, 3, "lora", lora=LoRAConfig(rank=2)),
               GPTLoRAConfig(gpt, LoRAConfig(rank=2))]
    built = [build_model(c) for c in configs]  # (built before the builds are watched)
    meta_counts, depths = memory._meta_counts, []

    def watched(config):
        depths.append(memory._read(config, ("n_layer",)))
        assert depths[-1] <= memory.DIRECT_DEPTH, "built whole"
        return meta_counts(config)

    monkeypatch.setattr(memory, "_meta_counts", watched)
    for config, model in zip(configs, built, strict=True):
        exact = (sum(p.numel() for p in model.parameters()),
                 sum(p.numel() for p in hidden_matrices(model)))
        assert memory._counts(config) == exact, config
    assert depths and max(depths) <= memory.DIRECT_DEPTH


def test_a_deep_classifiers_checkpoint_is_checked_by_size_without_building_it(monkeypatch):
    """Loading a checkpoint checks its weights against the model its settings describe; a
    deep GPT is compared by size, but a classifier's or LoRA model's depth was looked for on
    the wrapper, so the whole model was built on the meta device first, every layer."""
    from scratchgpt.checkpoints import Checkpoint
    from scratchgpt.errors import CheckpointError
    from scratchgpt.models import build_model
    from scratchgpt.models.classifier import GPTClassifierConfig
    from scratchgpt.models.gpt import GPTConfig

    gpt = GPTConfig(vocab_size=65, n_layer=memory.DIRECT_DEPTH + 6, n_head=2, n_embd=32,
                    block_size=16)
    config = GPTClassifierConfig(gpt, 3)
    weights = build_model(config).state_dict()
    meta_counts = memory._meta_counts

    def shallow_only(config):
        assert memory.depth(config) <= memory.DIRECT_DEPTH, "built whole"
        return meta_counts(config)

    monkeypatch.setattr(memory, "_meta_counts", shallow_only)
    Checkpoint("gpt-classifier", config, weights).check_weights()  # (its own weights: accepted)
    fewer = {k: v for k, v in weights.items() if ".h.3." not in k}  # a layer short
    assert len(fewer) < len(weights)
    with pytest.raises(CheckpointError, match=rf"numbers .* \(n_layer {gpt.n_layer}\)"):
        Checkpoint("gpt-classifier", config, fewer).check_weights()
