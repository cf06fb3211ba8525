"""Length batching and defaults of seq2seq training."""

import random

import torch

from scratchgpt.training.epochs import length_batches
from scratchgpt.training.seq2seq import length_bucket, train_config


def test_length_batches_cover_everything_once_and_group_lengths():
    lengths = [random.Random(i).randint(1, 30) for i in range(1000)]
    batches = length_batches(lengths, 64, torch.Generator().manual_seed(0))
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(1000))
    spread = [max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches]
    assert sum(spread) / len(spread) <= 2


def test_length_batches_follow_the_generator():
    lengths = [random.Random(i).randint(1, 30) for i in range(300)]
    a = length_batches(lengths, 16, torch.Generator().manual_seed(1))
    b = length_batches(lengths, 16, torch.Generator().manual_seed(1))
    c = length_batches(lengths, 16, torch.Generator().manual_seed(2))
    assert a == b and a != c


def test_length_bucket():
    assert length_bucket(1) == " 1-5" and length_bucket(5) == " 1-5" and length_bucket(6) == " 6-10"


def test_train_config_defaults_to_a_time_budget_unless_iterations_are_given():
    budget = train_config({})
    assert budget.time_budget_s == 600 and budget.max_iters > 10**9
    assert budget.min_lr == 0.05 * budget.learning_rate
    steps = train_config({"max_iters": 50, "learning_rate": 1e-3})
    assert steps.time_budget_s is None and steps.max_iters == 50
    assert steps.min_lr == 0.05 * 1e-3
