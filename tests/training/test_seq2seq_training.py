"""Learning-rate schedule and length batching of the seq2seq trainer."""

import random

import pytest

from scratchgpt.training.seq2seq import TrainConfig, length_batches, length_bucket, lr_at


def test_warmup_then_cosine_to_floor():
    cfg = TrainConfig(lr=1e-3, warmup_steps=10, max_steps=100, min_lr_ratio=0.1)
    assert lr_at(0, 0.0, cfg) == pytest.approx(1e-4)
    assert lr_at(9, 0.09, cfg) == pytest.approx(1e-3)
    assert lr_at(50, 0.5, cfg) == pytest.approx(0.55e-3)
    assert lr_at(100, 1.0, cfg) == pytest.approx(1e-4)
    with pytest.raises(ValueError):
        TrainConfig()  # neither steps nor a time budget


def test_length_batches_cover_everything_once_and_group_lengths():
    lengths = [random.Random(i).randint(1, 30) for i in range(1000)]
    batches = length_batches(1000, lengths, 64, random.Random(0))
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(1000))
    spread = [max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches]
    assert sum(spread) / len(spread) <= 2


def test_length_bucket():
    assert length_bucket(1) == " 1-5" and length_bucket(5) == " 1-5" and length_bucket(6) == " 6-10"
