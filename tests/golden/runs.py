"""Seeded short runs whose exact numbers must survive refactoring.

Each run trains a tiny model for a few dozen steps on data built here (no files needed) and
reports numbers that change if anything in the computation changes: the exact full-split val
loss, a digest of every trained weight, and greedy output. ``golden.json`` holds the numbers
recorded from the code before a refactor, per kind of CPU kernels (:func:`capability`: AVX2 and
AVX-512 kernels round differently, and MKL's and oneDNN's products add in another order on
another maker's CPU or with AMX, so the same code gives other last bits);
``test_golden.py`` checks the code still gives them on a machine of a recorded kind.

Record anew (only when a change of numbers is intended and explained in the commit), which
replaces every kind's numbers by this machine's (the others are no longer right):

    python -m tests.golden.runs > tests/golden/golden.json

To add the numbers of another kind of machine, from the same code as those recorded (check
first that the code has not changed the numbers where they were recorded):

    python -m tests.golden.runs --add

Where an intended change moves one run's numbers and another kind of machine is not at hand,
the numbers it moved are removed from that run's entry in the other kinds' numbers (the whole
entry, where it moved the weights): the test checks what is left there, or skips the run,
until they are recorded again.
"""

from __future__ import annotations

import hashlib
import json
import platform
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

WORDS = ("the king and queen of a far land spoke to the people in the hall , and they "
         "answered with songs ; now is the winter of our discontent made glorious summer . "
         "what light through yonder window breaks ? it is the east").split()


def corpus(n_lines: int = 1500, seed: int = 0) -> str:
    """Deterministic text: lines of words drawn from a fixed list, with speaker names."""
    rng = random.Random(seed)
    lines = []
    for i in range(n_lines):
        if i % 6 == 0:
            lines.append(rng.choice(("ROMEO:", "JULIET:", "KING:", "NURSE:")))
        lines.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))).capitalize())
    return "\n".join(lines) + "\n"


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 of every parameter and buffer, in state_dict order (bit-exact fingerprint)."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


LM_RUNS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # name: (training settings, model settings)
    "gpt-adamw": (dict(model="gpt"), dict(n_layer=2, n_head=2, n_embd=32, block_size=32,
                                          dropout=0.1)),
    "gpt-muon": (dict(model="gpt", optimizer="muon"),
                 dict(n_layer=2, n_head=2, n_embd=32, block_size=32, dropout=0.0)),
    "lstm": (dict(model="lstm"), dict(n_layer=1, hidden=32, block_size=32)),
    "bigram": (dict(model="bigram", learning_rate=3e-2), dict(block_size=16)),
}


def lm_run(name: str, data_dir: Path, out: Path) -> dict[str, Any]:
    from scratchgpt.checkpoints import load_model
    from scratchgpt.data.dataset import TokenDataset
    from scratchgpt.generation.generate import generate
    from scratchgpt.generation.sampling import SamplingConfig
    from scratchgpt.models import model_config
    from scratchgpt.training.config import TrainConfig
    from scratchgpt.training.job import train

    train_settings, model_settings = LM_RUNS[name]
    train_settings = dict(train_settings)
    kind = train_settings.pop("model")
    cfg = TrainConfig(**{**dict(batch_size=8, max_iters=80, eval_interval=40, eval_iters=2,
                                log_interval=5, learning_rate=1e-2, warmup_iters=5,
                                dtype="fp32", seed=1337), **train_settings})
    data = TokenDataset(data_dir)
    config = model_config(kind, vocab_size=data.vocab_size, **model_settings)
    result = train(cfg, config, data, out, progress=False)
    model, _ = load_model(out / "last.pt")
    prompt = torch.tensor([[1, 2, 3]])
    greedy = generate(model, prompt, 24, SamplingConfig(temperature=0))[0, 3:].tolist()
    return {"val_loss": repr(result.val_loss), "weights": weights_digest(model),
            "greedy": greedy}


def seq2seq_run(arch: str) -> dict[str, Any]:
    from scratchgpt.data.translation import DataSpec
    from scratchgpt.training.config import TrainConfig
    from scratchgpt.training.seq2seq import Seq2SeqTask, translate
    from scratchgpt.training.trainer import Trainer

    task = Seq2SeqTask.from_spec(DataSpec(task="dates", n_train=600, n_test=4, seed=0))
    config = task.model_config(arch, d_model=32)
    cfg = TrainConfig(batch_size=32, learning_rate=1e-2, min_lr=5e-4, warmup_iters=5,
                      max_iters=60, weight_decay=0.01, eval_interval=30, eval_iters=2,
                      log_interval=10, dtype="fp32", seed=0)
    trainer = Trainer(cfg, config, task, progress=False)
    result = trainer.fit()
    texts, _, _ = translate(trainer.model, [s for s, _ in task.held_out], task.src_tok,
                            task.tgt_tok, max_len=12)
    return {"val_loss": repr(result.val_loss), "weights": weights_digest(trainer.model),
            "greedy": texts}


def record() -> dict[str, Any]:
    from scratchgpt.data.prepare import prepare_text

    torch.set_num_threads(1)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        prepare_text(corpus(), data, "char", source="golden")
        for name in LM_RUNS:
            out[name] = lm_run(name, data, Path(tmp) / name)
    for arch in ("transformer", "lstm-attention"):
        out[f"seq2seq-{arch}"] = seq2seq_run(arch)
    return out


def capability() -> str:
    """The kind of CPU kernels PyTorch runs here, golden.json's key: PyTorch's own kernels'
    instruction set (AVX2, AVX512), the CPU's maker, whose CPUs MKL and oneDNN run other code
    on, and AMX where the CPU has it (e.g. "AVX512 AuthenticAMD", "AVX512 GenuineIntel AMX")."""
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read(1 << 16)
    except OSError:
        info = ""
    vendor = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                   if line.startswith("vendor_id")), platform.processor() or "unknown")
    amx = " AMX" if " amx_tile" in info else ""
    return f"{torch.backends.cpu.get_cpu_capability()} {vendor}{amx}"


GOLDEN_FILE = Path(__file__).parent / "golden.json"

if __name__ == "__main__":
    numbers = {capability(): record()}
    if sys.argv[1:] == ["--add"]:
        GOLDEN_FILE.write_text(json.dumps({**json.loads(GOLDEN_FILE.read_text()), **numbers},
                                          indent=1) + "\n")
    else:
        json.dump(numbers, sys.stdout, indent=1)
        sys.stdout.write("\n")
