"""The fine-tuning tasks on tiny models: the classification report against scikit-learn,
what balanced class weights mean, and padding that changes no loss (batched = alone)."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from scratchgpt.chat import DEFAULT_TEMPLATE, TEMPLATES
from scratchgpt.finetune.classify import ClassifyData, ClassifyTask, ClassReport, class_weights
from scratchgpt.finetune.instruct import collate as instruct_collate
from scratchgpt.finetune.instruct import encode_conversation, held_out_loss, response_loss
from scratchgpt.models.classifier import GPTClassifier, GPTClassifierConfig
from scratchgpt.models.gpt import GPT, GPTConfig
from scratchgpt.tokenizers import CharTokenizer
from scratchgpt.training.task import EvalSetting

TINY = GPTConfig(vocab_size=40, block_size=32, n_layer=2, n_head=2, n_embd=16)


def test_class_report_equals_scikit_learn():
    metrics = pytest.importorskip("sklearn.metrics")
    rng = random.Random(0)
    labels = ["a", "b", "c", "d"]
    true = [rng.choice([0, 0, 0, 1, 2, 3]) for _ in range(200)]
    pred = [rng.choice([0, 0, 1, 2]) for _ in range(200)]  # class d is never predicted
    rep = ClassReport.of(labels, true, pred)
    p, r, f, support = metrics.precision_recall_fscore_support(
        true, pred, labels=range(4), zero_division=0)
    for c in range(4):
        assert (rep.precision(c), rep.recall(c), rep.f1(c)) == pytest.approx((p[c], r[c], f[c]))
        assert sum(rep.confusion[c]) == support[c]
    assert rep.accuracy == pytest.approx(metrics.accuracy_score(true, pred))
    assert rep.macro_f1 == pytest.approx(metrics.f1_score(true, pred, labels=range(4),
                                                          average="macro", zero_division=0))
    assert rep.confusion == metrics.confusion_matrix(true, pred, labels=range(4)).tolist()


def test_macro_f1_leaves_out_a_class_neither_in_the_set_nor_predicted():
    """classify --eval of a file of one class, labelled without a mistake: accuracy 100%, and
    macro F1 1 as scikit-learn gives it (it was 0.5, the other class's 0/0 counted as 0); a
    class the set has but the model never predicted still counts, as a 0."""
    metrics = pytest.importorskip("sklearn.metrics")
    for true, pred in (([0, 0, 0], [0, 0, 0]), ([0, 0, 1], [0, 0, 0]), ([0, 2, 2], [0, 2, 0])):
        rep = ClassReport.of(["ham", "spam", "other"], true, pred)
        assert rep.macro_f1 == pytest.approx(metrics.f1_score(true, pred, average="macro",
                                                              zero_division=0))
    assert ClassReport.of(["ham", "spam"], [0, 0], [0, 0]).macro_f1 == 1.0


def _imbalanced(n_common: int, n_rare: int) -> list[tuple[list[int], int]]:
    rng = random.Random(1)
    return [([rng.randrange(1, 40) for _ in range(rng.randint(2, 9))], 0 if i < n_common else 1)
            for i in range(n_common + n_rare)]


def test_balanced_weights_make_each_class_weigh_the_same():
    examples = _imbalanced(27, 3)
    w = class_weights(examples, 2, "balanced")
    per_class = [float(w[c]) * sum(y == c for _, y in examples) for c in range(2)]
    assert per_class == pytest.approx([15.0, 15.0])  # n / classes each
    assert class_weights(examples, 2, "none") is None
    # over the training split, the weighted loss is the mean of the classes' mean losses
    torch.manual_seed(0)
    model = GPTClassifier(GPTClassifierConfig(TINY, 2))
    data = ClassifyData(["common", "rare"], {"train": examples, "val": [], "test": []}, {})
    task = ClassifyTask(data, tokenizer=None, class_weighting="balanced")
    batch = task.train_batch(len(examples), torch.Generator().manual_seed(0))
    assert sorted(batch[2].tolist()) == sorted(y for _, y in examples)  # the whole split
    x, lengths, y = batch
    each = F.cross_entropy(model(x, lengths), y, reduction="none")
    by_class = torch.stack([each[y == c].mean() for c in range(2)]).mean()
    torch.testing.assert_close(task.loss(model, batch), by_class)
    plain = ClassifyTask(data, tokenizer=None).loss(model, batch)
    torch.testing.assert_close(plain, each.mean())


def test_each_evaluation_reports_accuracy_and_macro_f1():
    examples = _imbalanced(12, 4)
    torch.manual_seed(0)
    model = GPTClassifier(GPTClassifierConfig(TINY, 2))
    data = ClassifyData(["common", "rare"], {"train": examples, "val": examples, "test": []},
                        {})
    task = ClassifyTask(data, tokenizer=None)
    assert task.eval_fields[:2] == ("val_acc", "val_f1")
    setting = EvalSetting(torch.device("cpu"), "fp32", 5, 0)
    task.estimate(model, "val", 10, setting)
    with torch.no_grad():
        pred = [int(model(torch.tensor([ids])).argmax()) for ids, _ in examples]
    rep = ClassReport.of(data.labels, [y for _, y in examples], pred)
    assert rep.macro_f1 != pytest.approx(rep.accuracy)  # the two figures can be told apart
    expected = {"val_acc": rep.accuracy, "val_f1": rep.macro_f1}
    for c, name in enumerate(data.labels):  # each class's figures, every evaluation
        expected.update({f"val_precision:{name}": rep.precision(c),
                         f"val_recall:{name}": rep.recall(c), f"val_f1:{name}": rep.f1(c)})
    assert set(task.eval_fields) == set(expected)
    assert task.eval_extras() == pytest.approx(expected)


def test_instruction_padding_changes_no_loss():
    """Right padding comes after every real token, so causal attention never sees it: the
    response loss of a padded batch is the token-weighted loss of each conversation alone."""
    tok = CharTokenizer.train("<|system|>\n<|user|>\n<|assistant|>\n<|end|> abcdefghij")
    template = TEMPLATES[DEFAULT_TEMPLATE]
    chats = [[{"role": "user", "content": u}, {"role": "assistant", "content": a}]
             for u, a in (("a", "b"), ("abcdefghij", "jihgfedcba"), ("cab", "bac"))]
    examples = [encode_conversation(tok, template, c)[0] for c in chats]
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=64, n_layer=2, n_head=2,
                          n_embd=16)).eval()
    x, y = instruct_collate(examples, pad_id=5)  # padding of any id
    with torch.no_grad():
        together = response_loss(model(x), y, reduction="sum")
        alone = sum(response_loss(model(xi), yi, reduction="sum")
                    for xi, yi in (instruct_collate([e]) for e in examples))
    torch.testing.assert_close(together, alone)
    targets = sum(int(sum(flags[1:])) for _, flags in examples)
    assert held_out_loss(model, examples, 3) == pytest.approx(held_out_loss(model, examples, 1),
                                                              rel=1e-5)
    assert held_out_loss(model, examples, 3) == pytest.approx(float(alone) / targets, rel=1e-5)
