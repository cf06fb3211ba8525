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
    # one thread, as the notebooks' test runs: two spinning OpenMP threads on a CPU the rest
    # of the suite shares made the example's 200 steps take minutes instead of seconds
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
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


# The refusals that scratchgpt.train and the command share: (TrainConfig's settings, the model
# (type and settings), the command's flags, what the Python caller reads, what the command
# says). Each named a flag to a Python caller, who has none to pass.
SMALL_GPT = dict(n_layer=1, n_head=2, n_embd=16, block_size=16)
SMALL_FLAGS = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16"]
REFUSED_RUNS = {
    "context longer than the data": (
        {}, ("gpt", {**SMALL_GPT, "block_size": 100_000}),
        [*SMALL_FLAGS, "--block-size", "100000"],
        "use more data or a smaller block_size", "use more data or a smaller --block-size"),
    "muon with no hidden matrices": (
        {"optimizer": "muon"}, ("lstm", {"n_layer": 1, "hidden": 8, "block_size": 16}),
        ["--model", "lstm", "--n-layer", "1", "--hidden", "8", "--block-size", "16",
         "--optimizer", "muon"],
        "optimizer='muon' has nothing to train", "--optimizer muon has nothing to train"),
    "weights diverged": (
        {"learning_rate": 1e30, "min_lr": 0.0, "grad_clip": 0.0, "warmup_iters": 0},
        ("gpt", SMALL_GPT),
        [*SMALL_FLAGS, "--learning-rate", "1e30", "--min-lr", "0", "--grad-clip", "0",
         "--warmup-iters", "0"],
        "lower learning_rate or keep grad_clip on", "lower --learning-rate or keep --grad-clip on"),
    # it said to lower the learning rate, a usual 1e-3, where the decay flipped the weights
    "weight decay diverged": (
        {"weight_decay": 1e5, "min_lr": 0.0, "warmup_iters": 0}, ("gpt", SMALL_GPT),
        [*SMALL_FLAGS, "--weight-decay", "1e5", "--min-lr", "0", "--warmup-iters", "0"],
        "lower weight_decay first: each step multiplies the weights by 1 - learning rate x "
        "weight decay = 1 - 0.001 x 100000 = -99, which zeroes them or flips their sign (keep "
        "the product well below 1); else lower learning_rate or keep grad_clip on",
        "lower --weight-decay first: each step multiplies the weights by 1 - learning rate x "
        "weight decay = 1 - 0.001 x 100000 = -99, which zeroes them or flips their sign (keep "
        "the product well below 1); else lower --learning-rate or keep --grad-clip on"),
}


@pytest.mark.parametrize("case", REFUSED_RUNS)
def test_a_refused_run_names_keywords_to_python_and_flags_to_the_command(small_dataset,
                                                                        tmp_path, capsys, case):
    from tests.cli_errors import error_of

    settings, (kind, shape), flags, from_python, from_cli = REFUSED_RUNS[case]
    data = scratchgpt.TokenDataset(small_dataset)
    cfg = scratchgpt.TrainConfig(**{"max_iters": 50, "batch_size": 2, "eval_iters": 1,
                                    "dtype": "fp32", **settings})
    model = scratchgpt.model_config(kind, vocab_size=data.vocab_size, **shape)
    with pytest.raises(scratchgpt.ScratchGPTError) as refused:
        scratchgpt.train(cfg, model, data, tmp_path / "py", progress=False)
    assert from_python in str(refused.value) and "--" not in str(refused.value)
    capsys.readouterr()  # (train()'s note of a run inside its warmup, on stderr)
    line = error_of(capsys, ["train", "--dataset", str(small_dataset), "--out",
                             str(tmp_path / "cli"), "--max-iters", "50", "--batch-size", "2",
                             "--eval-iters", "1", "--dtype", "fp32", "--no-progress", *flags])
    assert from_cli in line, line
    assert not (tmp_path / "py").exists() and not (tmp_path / "cli").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a CUDA GPU is here")
def test_cuda_asked_for_where_there_is_none_is_named_as_the_caller_asked(small_dataset,
                                                                         tmp_path, capsys):
    from tests.cli_errors import error_of

    data = scratchgpt.TokenDataset(small_dataset)
    model = scratchgpt.model_config("gpt", vocab_size=data.vocab_size, **SMALL_GPT)
    with pytest.raises(scratchgpt.ScratchGPTError) as refused:
        scratchgpt.train(scratchgpt.TrainConfig(device="cuda"), model, data, tmp_path / "r")
    assert str(refused.value) == "device='cuda' was asked for, but no CUDA GPU is available"
    line = error_of(capsys, ["train", "--dataset", str(small_dataset), "--out",
                             str(tmp_path / "r"), *SMALL_FLAGS, "--device", "cuda"])
    assert line.endswith("--device cuda was asked for, but no CUDA GPU is available"), line


def test_a_run_out_in_a_dataset_or_on_another_tokenizer_is_named_as_the_caller_gave_it(
        small_dataset, tmp_path, capsys):
    """A run written into a dataset's directory, and a resume on a dataset of another
    tokenizer: the command's flags and `scratchgpt prepare` from the command, the keyword
    and prepare_text from Python."""
    from tests.cli_errors import error_of

    data = scratchgpt.TokenDataset(small_dataset)
    model = scratchgpt.model_config("gpt", vocab_size=data.vocab_size, **SMALL_GPT)
    cfg = scratchgpt.TrainConfig(max_iters=1, batch_size=2, eval_iters=1, dtype="fp32")
    with pytest.raises(scratchgpt.ScratchGPTError) as refused:
        scratchgpt.train(cfg, model, data, small_dataset, progress=False)
    assert str(refused.value).endswith("not a run; give the run its own out directory")
    capsys.readouterr()  # (train()'s note of a run inside its warmup, on stderr)
    line = error_of(capsys, ["train", "--dataset", str(small_dataset), "--out",
                             str(small_dataset), *SMALL_FLAGS])
    assert line.endswith("not a run; give the run its own --out"), line
    run = tmp_path / "run"
    scratchgpt.train(cfg, model, data, run, progress=False)
    other = tmp_path / "other"
    scratchgpt.prepare_text("".join(chr(ord(c) + 200) for c in play_text(5_000)), other)
    with pytest.raises(scratchgpt.ScratchGPTError) as refused:
        scratchgpt.train(cfg, None, other, run, resume=True, progress=False)
    assert str(refused.value).endswith(
        f"prepare the text with its tokenizer (prepare_text(text, out, "
        f"tokenizer=load_tokenizer('{run}')))")
    capsys.readouterr()
    line = error_of(capsys, ["train", "--out", str(run), "--resume", "--dataset", str(other)])
    assert line.endswith(f"(scratchgpt prepare --data TEXT --tokenizer-from {run} --out DIR)")


def test_prepare_text_names_its_keywords_and_the_command_its_flags(tmp_path, capsys,
                                                                   monkeypatch):
    """Each refusal of a destination named --out or --overwrite to a Python caller."""
    from tests.cli_errors import error_of

    text = play_text(5_000)
    (tmp_path / "text.txt").write_text(text)
    (tmp_path / "afile").write_text("mine")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    scratchgpt.prepare_text(text, tmp_path / "data")
    (tmp_path / "mixed").mkdir()
    scratchgpt.prepare_text(text, tmp_path / "mixed", overwrite=True)
    (tmp_path / "mixed" / "notes.txt").write_text("mine")
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    cases = [  # (out, overwrite, from Python, from the command)
        (tmp_path / "afile", False, f"out='{tmp_path / 'afile'}' is a file",
         f"--out {tmp_path / 'afile'} is a file"),
        (tmp_path / "data", False, "pass overwrite=True to replace it",
         "pass --overwrite to replace it"),
        (tmp_path / "full", False, "choose another out directory", "choose another --out"),
        (tmp_path / "mixed", True, "overwrite=True replaces the whole directory",
         "--overwrite replaces the whole directory"),
        (Path("."), True, "out='.' is the current directory", "--out . is the current"),
    ]
    for out, overwrite, from_python, from_cli in cases:
        with pytest.raises(scratchgpt.ScratchGPTError) as refused:
            scratchgpt.prepare_text(text, out, overwrite=overwrite)
        assert from_python in str(refused.value) and "--" not in str(refused.value)
        line = error_of(capsys, ["prepare", "--data", str(tmp_path / "text.txt"), "--out",
                                 str(out), *(["--overwrite"] if overwrite else [])])
        assert from_cli in line, line
    assert (tmp_path / "afile").read_text() == "mine"
    assert (tmp_path / "full" / "notes.txt").read_text() == "mine"
