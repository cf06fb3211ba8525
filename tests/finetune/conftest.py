"""Small data and a tiny pretrained base for the fine-tuning tests, all made here."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from scratchgpt.cli import main
from tests.corpus import play_text

POSITIVE = "love great fine happy nice good sunny calm".split()
NEGATIVE = "hate awful sad angry bad rainy storm ugly".split()
TEMPLATE_TEXT = "<|system|>\n<|user|>\nWhat is 1 + 2?\n<|assistant|>\n3<|end|>\n"


def labelled_lines(n: int, seed: int = 0) -> list[str]:
    """``text<TAB>label`` lines of two easily told classes (pos: pleasant words)."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        label = rng.choice(["pos", "neg"])
        words = POSITIVE if label == "pos" else NEGATIVE
        lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(2, 6))) + "\t" + label)
    return lines


def addition_records(n: int, seed: int = 0) -> list[dict[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        out.append({"instruction": f"What is {a} + {b}?", "input": "", "output": str(a + b)})
    return out


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main([str(a) for a in args])
    except SystemExit as stop:  # argparse's own refusals: a flag's type or choices
        code = stop.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def classify_run(ft_dir: Path, out: Path, *flags: Any) -> list[Any]:
    """``finetune --task classify`` of the tiny base on labels.tsv into ``out``, in batches of
    8 with one evaluation batch, quiet, with ``flags`` (the run the resume tests start)."""
    return ["finetune", "--task", "classify", "--init-from", ft_dir / "base", "--data",
            ft_dir / "labels.tsv", "--out", out, "--batch-size", "8", "--eval-iters", "1",
            *flags, "--no-progress"]


BUDGETED = ("--max-iters", "1000000", "--time-budget", "0.5s")  # a run its budget ends


@pytest.fixture(scope="session")
def ft_dir(tmp_path_factory) -> Path:
    """A folder with labels.tsv, inst.json and a tiny char-level base GPT (``base``) whose
    vocabulary has every character the data, the chat template and the chat tests' messages
    use ('/' and '=': chat refuses a message with a character the model lacks)."""
    d = tmp_path_factory.mktemp("finetune")
    (d / "labels.tsv").write_text("\n".join(labelled_lines(240)) + "\n")
    (d / "inst.json").write_text(json.dumps(addition_records(60)))
    # the tokenizer learns its characters from the first 90%: the template's go first
    text = TEMPLATE_TEXT * 20 + "0123456789+?=/\t" * 20 + play_text(20_000, seed=5)
    (d / "corpus.txt").write_text(text)
    assert main(["prepare", "--data", str(d / "corpus.txt"), "--out", str(d / "data")]) == 0
    assert main(["train", "--dataset", str(d / "data"), "--n-layer", "2", "--n-head", "2",
                 "--n-embd", "32", "--block-size", "64", "--max-iters", "2",
                 "--eval-interval", "2", "--eval-iters", "1", "--out", str(d / "base"),
                 "--no-progress"]) == 0
    return d
