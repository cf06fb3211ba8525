"""The synthetic instruction set: every answer is right, records are distinct and seeded, and
each prompt can be told by its kind (for the benchmark's exact match by kind)."""

from __future__ import annotations

import doctest
import re
from datetime import date

import pytest

from scratchgpt.finetune import synthetic
from scratchgpt.finetune.synthetic import KINDS, kind_of, synthetic_records


def test_docstring_examples():
    assert doctest.testmod(synthetic, raise_on_error=True).attempted > 0


def answer(record: dict[str, str]) -> str:
    """The answer worked out independently of the generator."""
    if record["instruction"] == "Reverse the word.":
        return "".join(reversed(record["input"]))
    if m := re.fullmatch(r"What is (\d+) \+ (\d+)\?", record["instruction"]):
        return str(int(m[1]) + int(m[2]))
    d = date.fromisoformat(record["input"])
    return f"{d.day} {d:%B} {d.year}"


def test_every_answer_is_right_and_every_record_distinct():
    records = synthetic_records(3000, seed=7)
    assert all(r["output"] == answer(r) for r in records)
    assert len({(r["instruction"], r["input"]) for r in records}) == 3000
    kinds = [kind_of(r["instruction"]) for r in records]
    assert kinds[:3] == [k.__name__ for k in KINDS] and kinds.count("addition") == 1000


def test_seeded_and_bounded():
    assert synthetic_records(50, seed=1) == synthetic_records(50, seed=1)
    assert synthetic_records(50, seed=1) != synthetic_records(50, seed=2)
    with pytest.raises(ValueError, match="n must be"):
        synthetic_records(30_001)
    with pytest.raises(ValueError, match="not a synthetic instruction"):
        kind_of("Translate this.")


def test_the_benchmark_scores_each_kind_apart():
    from scratchgpt.bench.finetune import exact_match_by_kind
    from scratchgpt.finetune.instruct import GenerationEval

    ev = GenerationEval(["What is 1 + 2?", "What is 2 + 2?", "Reverse the word.\n\nab"],
                        ["3", "5", " ba"], ["3", "4", "ba"])
    assert exact_match_by_kind(ev) == {"addition": 0.5, "reverse_word": 1.0}
