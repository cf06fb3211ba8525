"""The package's Python API: README.md's example runs as written, every exported name is
there, and ``import scratchgpt`` (which every command pays for) does not import torch."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import scratchgpt
from tests.corpus import play_text

ROOT = Path(__file__).resolve().parents[2]
SECTION = re.compile(r"^## Python API\n(.*?)^## ", re.M | re.S)
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)


def readme_example() -> str:
    section = SECTION.search((ROOT / "README.md").read_text())
    assert section, "README.md has no 'Python API' section"
    blocks = PYTHON_BLOCK.findall(section.group(1))
    assert len(blocks) == 1, "the section's one example"
    return blocks[0]


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("SCRATCHGPT_DATA_DIR", None)  # the example reads only its own input.txt
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_the_readme_example_runs_as_written(tmp_path):
    (tmp_path / "input.txt").write_text(play_text(20_000), encoding="utf-8")
    done = run_python(readme_example(), tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert re.fullmatch(r"val loss \d+\.\d{3} after 200 steps", lines[0]), lines[0]
    assert lines[1].startswith("ROMEO:")  # the sample, prompt included
    assert re.fullmatch(r"val loss \d+\.\d{3}", lines[-1]), lines[-1]
    assert (tmp_path / "data/mytext/train.bin").is_file()
    assert (tmp_path / "runs/mytext/best.pt").is_file()


def test_the_example_walks_the_whole_loop():
    code = readme_example()
    for name in ("prepare_text", "TokenDataset", "model_config", "TrainConfig", "train",
                 "load_model", "generate", "stream_text", "beam_search", "full_split_loss"):
        assert f"sg.{name}(" in code, name


def test_importing_the_package_does_not_import_torch(tmp_path):
    done = run_python("import sys, scratchgpt, scratchgpt.cli; "
                      "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))",
                      tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("name", scratchgpt.__all__)
def test_every_exported_name_is_its_modules_own(name):
    value = getattr(scratchgpt, name)
    module = sys.modules[scratchgpt._EXPORTS[name]]
    assert value is getattr(module, name)
    assert name in dir(scratchgpt)
    assert getattr(value, "__module__", "").startswith("scratchgpt.")


def test_the_api_covers_the_loop_and_an_unknown_name_is_an_attribute_error():
    assert scratchgpt.__all__ == list(scratchgpt._EXPORTS)
    assert {"prepare_text", "train", "load_model", "generate", "full_split_loss"} <= \
        set(scratchgpt.__all__)
    with pytest.raises(AttributeError, match="module 'scratchgpt' has no attribute 'trian'"):
        scratchgpt.trian  # noqa: B018
    assert not hasattr(scratchgpt, "_no_such_name")


def memorizing_gpt(ids: list[int], vocab_size: int):
    """A tiny GPT trained until greedy decoding repeats the cycle ``ids``."""
    import torch

    torch.manual_seed(0)
    model = scratchgpt.build_model(scratchgpt.model_config(
        "gpt", vocab_size=vocab_size, n_layer=1, n_head=2, n_embd=32, block_size=32))
    data = torch.tensor(ids * 8)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(150):
        starts = torch.randint(0, len(data) - 33, (16,))
        x = torch.stack([data[s:s + 32] for s in starts])
        y = torch.stack([data[s + 1:s + 33] for s in starts])
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def test_stream_text_streams_a_byte_level_bpe_models_text_whole():
    """With byte-level BPE a token can hold part of a character: decoding stream's tokens one
    at a time breaks 'é', 'ö' and '✓' apart; stream_text's pieces join to the decoded text."""
    import torch

    line = "héllo wörld ✓\n"
    tok = scratchgpt.build_tokenizer("bpe", line * 20, vocab_size=258)  # bytes, 1 merge, eot
    model = memorizing_gpt(tok.encode(line), tok.vocab_size)
    prompt = torch.tensor([tok.encode("h")])
    greedy = scratchgpt.SamplingConfig(temperature=0)
    new = scratchgpt.generate(model, prompt, 40, greedy)[0, 1:].tolist()
    whole = tok.decode(new)
    assert "wörld ✓" in whole  # the model learnt the text: tokens cut characters apart
    per_token = "".join(tok.decode([int(t[0])]) for t in scratchgpt.stream(model, prompt, 40,
                                                                             greedy))
    assert per_token != whole and "\ufffd" in per_token
    pieces = list(scratchgpt.stream_text(model, prompt, 40, greedy, decode=tok.decode))
    assert "".join(pieces) == whole
    assert all(pieces) and not any("\ufffd" in p for p in pieces)
    assert len(pieces) > 10  # streamed as it came, not all at the end


def test_the_exported_configs_import_no_torch(tmp_path):
    """A config is plain data: ``scratchgpt.GPTConfig`` came from the module of the GPT itself,
    and so imported torch and every layer to name a model's hyperparameters."""
    done = run_python("import sys, scratchgpt\n"
                      "cfg = scratchgpt.GPTConfig(vocab_size=65, n_layer=2)\n"
                      "for name in ('TrainConfig', 'StopRule', 'model_config'):\n"
                      "    getattr(scratchgpt, name)\n"
                      "print(cfg.n_layer, sorted(m for m in sys.modules "
                      "if m.split('.')[0] == 'torch'))", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2 []"
