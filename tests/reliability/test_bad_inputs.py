"""Every hostile input a user might give gets one line on stderr and exit code 2: no
traceback, nothing allocated beyond what fits, and the files that were there are untouched.

Each case builds its arguments from a few small artefacts made once (a run, a recurrent run, a
seq2seq run, a Hugging Face directory, damaged copies of each). The test asserts the exit code,
that stderr is one line naming the command, and (where given) a word the message must hold so
that the user knows what to change.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from scratchgpt.checkpoints import load_checkpoint, save_checkpoint
from scratchgpt.cli import main
from scratchgpt.cpu import cores
from tests.corpus import play_text
from tests.reliability.conftest import TINY, snapshot
from tests.tiny_gpt import sharp_gpt

S2S_TINY = ["--n-train", "200", "--n-test", "20", "--steps", "2", "--d-model", "16",
            "--batch-size", "16", "--warmup", "1", "--no-progress", "--threads", "1"]


@pytest.fixture(scope="module")
def ctx(tmp_path_factory, tiny_data) -> dict[str, Path]:
    """The artefacts the cases point at, made once."""
    root = tmp_path_factory.mktemp("bad-inputs")
    c = {"root": root, "data": tiny_data, "run": root / "run", "lstm": root / "lstm",
         "s2s": root / "s2s"}
    assert main(["train", "--dataset", str(tiny_data), "--out", str(c["run"]), "--max-iters",
                 "2", *TINY]) == 0
    c["budgeted"] = root / "budgeted"  # a run its --time-budget ended
    assert main(["train", "--dataset", str(tiny_data), "--out", str(c["budgeted"]),
                 "--max-iters", "1000000", "--time-budget", "0.2s", *TINY]) == 0
    assert main(["train", "--dataset", str(tiny_data), "--out", str(c["lstm"]), "--model",
                 "lstm", "--max-iters", "1", *TINY[6:]]) == 0
    assert main(["seq2seq", "train", "--task", "dates", "--arch", "transformer", "--out",
                 str(c["s2s"]), *S2S_TINY]) == 0
    c.update(_classifier(root, c["run"]))
    c.update(_damaged_checkpoints(root, c["run"]))
    c.update(_damaged_datasets(root, tiny_data))
    c.update(_hf_dirs(root))
    c.update(_files(root))
    c.update(_bpe_copied(root))
    from scratchgpt.data.prepare import prepare_text

    c["other_data"] = root / "other-data"  # the same size of vocabulary, other characters
    alphabet = sorted(set(play_text(40_000)))
    shifted = "".join(chr(ord(ch) + 200) for ch in alphabet)
    prepare_text((shifted * 400)[:20_000], c["other_data"], "char", source="test")
    c["gb"] = root / "gb"  # a gpt-build's first stage, on the tiny data
    assert main(["experiment", "gpt-build", "--quick", "--stages", "1", "--dataset",
                 str(tiny_data), "--out", str(c["gb"]), "--no-progress", "--threads", "1"]) == 0
    c["gb_retexted"] = root / "gb-retexted"  # its stage, as if the data was prepared again
    shutil.copytree(c["gb"], c["gb_retexted"])  # since from another text
    config = json.loads((c["gb_retexted"] / "1-bigram" / "config.json").read_text())
    config["experiment"]["text"]["source_sha256"] = "0" * 64
    (c["gb_retexted"] / "1-bigram" / "config.json").write_text(json.dumps(config))
    c["foreign"] = _ckpt_copy(c["run"], root / "foreign", lambda ckpt: None)
    shutil.copy(c["lstm"] / "last.pt", c["foreign"] / "last.pt")
    c["no_ckpt"] = root / "no-ckpt"  # what a run killed while writing its first checkpoint left
    c["no_ckpt"].mkdir()
    for name in ("config.json", "tokenizer.json", "metrics.csv"):
        shutil.copy(c["run"] / name, c["no_ckpt"] / name)
    return c


def _classifier(root: Path, base: Path) -> dict[str, Path]:
    """A classifier of ``base`` (one step: only its labels matter), and a file of its texts
    written label first."""
    words = play_text(2_000, seed=3).split()
    rows = [(" ".join(words[i:i + 3]), "ab"[i % 2]) for i in range(40)]
    (root / "labels.tsv").write_text("".join(f"{t}\t{label}\n" for t, label in rows))
    (root / "label-first.tsv").write_text("".join(f"{label}\t{i} {t}\n"
                                                  for i, (t, label) in enumerate(rows)))
    # texts that are the model's labels in capitals: read as two labels it lacks
    (root / "label-first-caps.tsv").write_text("A\tsome words\nb\tother words\n")
    assert main(["finetune", "--task", "classify", "--init-from", str(base), "--data",
                 str(root / "labels.tsv"), "--out", str(root / "classifier"), "--max-iters",
                 "1", "--batch-size", "4", "--no-progress"]) == 0
    return {"classifier": root / "classifier", "label_first": root / "label-first.tsv",
            "label_first_caps": root / "label-first-caps.tsv"}


def _ckpt_copy(src: Path, dst: Path, change: Callable) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        if f.is_file() and f.name != ".lock":
            shutil.copy(f, dst / f.name)
    for name in ("last.pt", "best.pt"):
        ckpt = load_checkpoint(dst / name)
        change(ckpt)
        save_checkpoint(dst / name, ckpt)
    return dst


def _damaged_checkpoints(root: Path, run: Path) -> dict[str, Path]:
    def nan(ckpt):
        for v in ckpt.model.values():
            v.fill_(math.nan)

    def deep(ckpt):
        object.__setattr__(ckpt, "model_config", dataclasses.replace(
            ckpt.model_config, n_layer=1_000_000))

    def wide_vocab(ckpt):
        object.__setattr__(ckpt, "model_config", dataclasses.replace(
            ckpt.model_config, vocab_size=1_000_000_000))

    def small_tokenizer(ckpt):
        ckpt.model_config = dataclasses.replace(ckpt.model_config,
                                                vocab_size=ckpt.model_config.vocab_size + 5)
        ckpt.model = {k: torch.zeros(ckpt.model_config.vocab_size, v.shape[1])
                      if v.shape[:1] == (ckpt.model_config.vocab_size - 5,) else v
                      for k, v in ckpt.model.items()}

    def no_mlp(ckpt):
        ckpt.model = {k: v for k, v in ckpt.model.items() if ".mlp." not in k}

    # a copy cut short (torch said "[Errno 22] Invalid argument"), and convert --to gguf's
    # file given back as a checkpoint
    (root / "cut.pt").write_bytes((run / "best.pt").read_bytes()[:5_000])
    (root / "model.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(64))
    return {"cut_ckpt": root / "cut.pt", "gguf_file": root / "model.gguf",
            "nan_run": _ckpt_copy(run, root / "nan-run", nan),
            "deep_run": _ckpt_copy(run, root / "deep-run", deep),
            "vocab_run": _ckpt_copy(run, root / "vocab-run", wide_vocab),
            "small_tok_run": _ckpt_copy(run, root / "small-tok-run", small_tokenizer),
            "no_mlp_run": _ckpt_copy(run, root / "no-mlp-run", no_mlp),
            "moved_data_run": _ckpt_copy(run, root / "moved-data-run", lambda ckpt: ckpt.data
                                         .update(dataset=str(root / "moved-away")))}


def _dataset_copy(src: Path, dst: Path, change: Callable[[Path], None]) -> Path:
    shutil.copytree(src, dst)
    change(dst)
    return dst


def _damaged_datasets(root: Path, data: Path) -> dict[str, Path]:
    meta = json.loads((data / "meta.json").read_text())
    dtype = np.dtype(meta.get("dtype", "uint16"))

    def odd(d: Path):
        with open(d / "train.bin", "ab") as f:
            f.write(b"\0")

    def beyond(d: Path):
        ids = np.fromfile(d / "train.bin", dtype=dtype)
        ids[5] = meta["vocab_size"] + 3
        ids.tofile(d / "train.bin")

    def bad_meta(d: Path):
        (d / "meta.json").write_text("{not json")

    return {"odd_data": _dataset_copy(data, root / "odd-data", odd),
            "beyond_data": _dataset_copy(data, root / "beyond-data", beyond),
            "meta_data": _dataset_copy(data, root / "meta-data", bad_meta)}


def _hf_dirs(root: Path) -> dict[str, Path]:
    transformers = pytest.importorskip("transformers")
    good = root / "hf"
    cfg = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=32)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(good)
    out = {"hf": good}
    for name, change in {"hf_deep": {"n_layer": 100_000}, "hf_str_vocab": {"vocab_size": "50"},
                         "hf_list_embd": {"n_embd": [16]}}.items():
        d = root / name
        shutil.copytree(good, d)
        config = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**config, **change}))
        out[name] = d
    d = root / "hf_json_list"
    shutil.copytree(good, d)
    (d / "config.json").write_text("[1, 2]")
    out["hf_json_list"] = d
    d = out["hf_cut_short"] = root / "hf_cut_short"  # a download or copy cut short
    shutil.copytree(good, d)
    weights = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(weights[:len(weights) // 2])
    d = out["hf_shard_missing"] = root / "hf_shard_missing"  # a copy that left a shard out
    shutil.copytree(good, d)
    (d / "model.safetensors").rename(d / "model-00001-of-00002.safetensors")
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "transformer.wte.weight": "model-00001-of-00002.safetensors",
        "lm_head.weight": "model-00002-of-00002.safetensors"}}))
    d = out["hf_bin_shard_missing"] = root / "hf_bin_shard_missing"  # .bin shards, one left out
    shutil.copytree(good, d)
    (d / "model.safetensors").unlink()
    torch.save(transformers.GPT2LMHeadModel.from_pretrained(good).state_dict(),
               d / "pytorch_model-00001-of-00002.bin")
    (d / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": {
        "transformer.wte.weight": "pytorch_model-00001-of-00002.bin",
        "lm_head.weight": "pytorch_model-00002-of-00002.bin"}}))
    d = out["hf_bin_list"] = root / "hf_bin_list"  # a pytorch_model.bin of no tensors by name
    shutil.copytree(good, d)
    (d / "model.safetensors").unlink()
    torch.save([1, 2, 3], d / "pytorch_model.bin")
    d = out["hf_no_mlp"] = root / "hf_no_mlp"  # weights that lack a block's MLP
    shutil.copytree(good, d)
    from safetensors.torch import load_file, save_file

    weights = load_file(d / "model.safetensors")
    save_file({k: v for k, v in weights.items() if ".mlp." not in k}, d / "model.safetensors")
    return out


def _files(root: Path) -> dict[str, Path]:
    (root / "one-char.txt").write_text("a")
    (root / "two-chars.txt").write_text("ab")  # a token in each split: no window in either
    (root / "blank-line.txt").write_text("3 may 1999\n\n1 may 2000\n")  # (to translate)
    (root / "long-line.txt").write_text("3 may 1999\n" + "1 " * 300 + "\n1 may 2000\n")
    (root / "loop").symlink_to(root / "loop")
    (root / "a-dir").mkdir()
    (root / "bad-type.json").write_text(json.dumps({"learning_rate": "fast"}))
    (root / "a-list.json").write_text(json.dumps([{"n_layer": 2}]))
    (root / "twice.toml").write_text("n_layer = 2\n[model]\nn_layer = 3\n")
    (root / "lstm-width.toml").write_text('model = "lstm"\nqk_norm = true\n')
    (root / "inf-budget.toml").write_text("time_budget = inf\n")
    (root / "typo.toml").write_text("n_layers = 2\n")
    (root / "plain-file").write_text("x")
    os.mkfifo(root / "a-pipe")
    long = root / "text.txt"
    long.write_text(play_text(20_000))
    # a record whose output is empty: it taught a reply of the end marker alone
    (root / "empty-output.json").write_text(json.dumps(
        [{"instruction": f"{i} plus 1?", "output": str(i + 1) if i != 2 else ""}
         for i in range(6)]))
    (root / "three.json").write_text(json.dumps([{"instruction": f"{i} plus 1?",
                                                  "output": str(i + 1)} for i in range(3)]))
    words = play_text(2_000, seed=4).split()
    (root / "header.tsv").write_text("review\tsentiment\n" + "".join(
        f"{' '.join(words[i:i + 3])}\t{'ab'[i % 2]}\n" for i in range(40)))
    # a header of three columns: without it, each text would be 'id<TAB>text'
    (root / "id-header.tsv").write_text("id\ttext\tlabel\n" + "".join(
        f"{i}\t{' '.join(words[i:i + 3])}\t{'ab'[i % 2]}\n" for i in range(40)))
    # UTF-16 without a byte-order mark: valid UTF-8, a NUL beside every letter
    (root / "utf16.tsv").write_bytes("".join(f"{' '.join(words[i:i + 3])}\t{'ab'[i % 2]}\n"
                                             for i in range(40)).encode("utf-16-be"))
    # thirty short pairs and one of 20,000 characters: a transformer's attention over it alone
    # takes some 30 GiB to train
    (root / "long-pair.tsv").write_text("".join(
        f"{' '.join(words[i:i + 2])}\t{words[i]}\n" for i in range(30)) + "ab" * 10_000 + "\tb\n")
    return {"twice": root / "twice.toml", "lstm_width": root / "lstm-width.toml",
            "long_pair_tsv": root / "long-pair.tsv",
            "inf_budget": root / "inf-budget.toml", "typo": root / "typo.toml",
            "header_tsv": root / "header.tsv", "utf16_tsv": root / "utf16.tsv",
            "id_header_tsv": root / "id-header.tsv",
            "one_char": root / "one-char.txt", "two_chars": root / "two-chars.txt",
            "loop": root / "loop",
            "three_chats": root / "three.json", "empty_output": root / "empty-output.json",
            "a_dir": root / "a-dir", "bad_type": root / "bad-type.json",
            "a_list": root / "a-list.json",
            "plain_file": root / "plain-file", "text": long, "pipe": root / "a-pipe"}


def _bpe_copied(root: Path) -> dict[str, Path]:
    """A BPE run's ``best.pt`` copied on its own: its tokenizer's merges.txt stayed behind."""
    from scratchgpt.checkpoints import Checkpoint
    from scratchgpt.tokenizers import BPETokenizer

    tok = BPETokenizer.train(play_text(5_000), 300)
    model = sharp_gpt(vocab_size=tok.vocab_size, block_size=16)
    alone = root / "bpe-copied" / "best.pt"
    save_checkpoint(alone, Checkpoint("gpt", model.config, model.state_dict(),
                                      {"text": tok.state()}))
    return {"bpe_copied": alone}


def _train(c, *extra, out: str = "new") -> list[str]:
    return ["train", "--dataset", c["data"], "--out", c["root"] / "out" / out,
            "--max-iters", "1", *TINY, *extra]


def _sample(c, *extra, run: str = "run") -> list[str]:
    return ["sample", "--checkpoint", c[run], "--max-new-tokens", "4", *extra]


# (name, arguments from ctx, a word the one-line message must hold)
CASES: list[tuple[str, Callable[[dict], list], str]] = [
    # settings that would train to NaN weights
    # (each was "must be > 0, got inf" or the like, a bound that infinity or NaN does not break)
    ("train --learning-rate inf", lambda c: _train(c, "--learning-rate", "inf"),
     "--learning-rate must be a finite number, got inf"),
    ("train --lr nan", lambda c: _train(c, "--lr", "nan"), "--lr must be a finite number"),
    ("train --min-lr inf", lambda c: _train(c, "--min-lr", "inf"),
     "--min-lr must be a finite number"),
    ("train --beta2 nan", lambda c: _train(c, "--beta2", "nan"), "--beta2 must be a finite number"),
    ("train --decay-fraction inf", lambda c: _train(c, "--schedule", "wsd", "--decay-fraction",
                                                    "inf"),
     "--decay-fraction must be a finite number"),
    ("train --weight-decay nan", lambda c: _train(c, "--weight-decay", "nan"),
     "--weight-decay must be a finite number"),
    ("train --muon-lr-scale inf", lambda c: _train(c, "--muon-lr-scale", "inf"),
     "--muon-lr-scale"),
    ("train --embed-lr-scale inf", lambda c: _train(c, "--embed-lr-scale", "inf"),
     "--embed-lr-scale"),
    ("train --layer-norm-eps -1", lambda c: _train(c, "--layer-norm-eps", "-1"),
     "--layer-norm-eps"),
    ("train --layer-norm-eps 0", lambda c: _train(c, "--layer-norm-eps", "0"), "--layer-norm-eps"),
    ("train --dropout 1", lambda c: _train(c, "--dropout", "1"), "dropout"),
    ("train --dropout nan", lambda c: _train(c, "--dropout", "nan"), "dropout"),
    ("train --grad-clip nan", lambda c: _train(c, "--grad-clip", "nan"),
     "--grad-clip must be a finite number"),
    ("train --time-budget 0s", lambda c: _train(c, "--time-budget", "0s"), "--time-budget"),
    # a number of seconds in a file: inf was read as the duration "infs"
    ("train --config with time_budget = inf", lambda c: _train(c, "--config", c["inf_budget"]),
     "inf-budget.toml must be a finite number"),
    ("train --grad-accum 10^20", lambda c: _train(c, "--grad-accum", str(10**20)),
     "--grad-accum"),
    ("train --n-embd 10^20", lambda c: _train(c, "--n-embd", str(10**20)), "too large"),
    ("train --resume --overwrite",
     lambda c: ["train", "--out", c["run"], "--resume", "--overwrite"], "overwrite"),
    # an --overwrite whose new settings cannot run leaves the old run as it was
    ("train --overwrite --device cuda (none here)",
     lambda c: ["train", "--dataset", c["data"], "--out", c["run"], "--overwrite", *TINY,
                "--device", "cuda"], "cuda"),
    ("train --overwrite with data too short for the context",
     lambda c: ["train", "--dataset", c["data"], "--out", c["run"], "--overwrite", *TINY,
                "--block-size", "100000"], "block"),
    ("train --overwrite with a shape that cannot be built",
     lambda c: ["train", "--dataset", c["data"], "--out", c["run"], "--overwrite", *TINY,
                "--n-embd", "15"], "--n-embd (15) must be divisible by --n-head"),
    # the GPT's option refusals named its fields (pos_encoding, unet_skips), not the flags
    ("train --pos-encoding rope with an odd head width",
     lambda c: _train(c, "--pos-encoding", "rope", "--n-embd", "12", "--n-head", "4"),
     "--pos-encoding (rope) needs an even head width"),
    ("train --unet-skips --n-layer 1",
     lambda c: _train(c, "--unet-skips", "--n-layer", "1"), "--unet-skips needs --n-layer >= 2"),
    ("train --model lstm --optimizer muon (no hidden matrices for Muon)",
     lambda c: ["train", "--dataset", c["data"], "--out", c["root"] / "out" / "new",
                "--model", "lstm", "--n-layer", "1", "--hidden", "8", "--max-iters", "1",
                "--optimizer", "muon"], "adamw"),
    # resume with what cannot change
    ("train --resume --dataset OTHER-VOCABULARY",
     lambda c: ["train", "--out", c["run"], "--resume", "--dataset", c["other_data"]],
     "tokenized differently"),
    ("train --resume --n-embd 64", lambda c: ["train", "--out", c["run"], "--resume",
                                              "--n-embd", "64"], "--n-embd"),
    ("train --resume --model lstm", lambda c: ["train", "--out", c["run"], "--resume",
                                               "--model", "lstm"], "model"),
    ("train --resume a run whose last.pt is another run's",
     lambda c: ["train", "--out", c["foreign"], "--resume"], "different runs"),
    ("train --resume a run killed before its first checkpoint",
     lambda c: ["train", "--out", c["no_ckpt"], "--resume"], "--overwrite"),
    # a budget the run had already used trained nothing, without a word
    ("train --resume --time-budget shorter than the run has trained",
     lambda c: ["train", "--out", c["run"], "--resume", "--time-budget", "0.000001s"],
     "already trained for"),
    # the run's own spent budget given again stopped it before the updates asked for, in a
    # note that the run had finished
    ("train --resume --time-budget RUN'S-OWN-SPENT --max-iters MORE",
     lambda c: ["train", "--out", c["budgeted"], "--resume", "--time-budget", "0.2s",
                "--max-iters", "2000000"], "--time-budget 0.2s is used up"),
    ("train --config holding a list", lambda c: _train(c, "--config", c["a_list"]), "object"),
    ("train --config of a wrong type", lambda c: _train(c, "--config", c["bad_type"]),
     "learning_rate"),
    # one of the two values won silently, by the order of the file
    ("train --config setting n_layer twice", lambda c: _train(c, "--config", c["twice"]),
     "sets n_layer twice (at the top level and in [model])"),
    # it was "unknown settings: n_layers", with no word of the setting meant
    ("train --config with a key that nearly reads as a setting",
     lambda c: _train(c, "--config", c["typo"]), "does not take n_layers; did you mean 'n_layer'?"),
    # the refusal named a flag the user had not typed
    ("train --config giving an lstm qk_norm", lambda c: _train(c, "--config", c["lstm_width"]),
     "qk_norm in"),
    ("train --n-layer 10000 (does not fit)", lambda c: _train(c, "--n-layer", "10000",
                                                              "--n-embd", "4096"), "GiB"),
    ("train on a train.bin of odd size", lambda c: ["train", "--dataset", c["odd_data"], "--out",
                                                    c["root"] / "out" / "odd", *TINY], "train.bin"),
    ("train on ids beyond the vocabulary",
     lambda c: ["train", "--dataset", c["beyond_data"], "--out", c["root"] / "out" / "beyond",
                "--max-iters", "1", *TINY], "vocab"),
    ("train on a malformed meta.json",
     lambda c: ["train", "--dataset", c["meta_data"], "--out", c["root"] / "out" / "meta",
                *TINY], "meta.json"),
    # sampling
    ("sample --beam 0", lambda c: _sample(c, "--beam", "0"), "beam"),
    ("sample --beam 2 --num-samples 5", lambda c: _sample(c, "--beam", "2", "--num-samples", "5"),
     "num-samples"),
    ("sample --beam 2 --top-k 3 (beam search draws nothing)",
     lambda c: _sample(c, "--beam", "2", "--top-k", "3"), "do not apply"),
    ("sample --temperature 0 --top-k 5 (greedy draws nothing)",
     lambda c: _sample(c, "--temperature", "0", "--top-k", "5"), "do not apply"),
    ("sample --temperature 0 --top-p 0.9",
     lambda c: _sample(c, "--temperature", "0", "--top-p", "0.9"), "do not apply"),
    # chat samples as sample does: refused before the model loads (this run cannot chat)
    ("chat --temperature 0 --top-k 5 (greedy draws nothing)",
     lambda c: ["chat", "--checkpoint", c["run"], "--temperature", "0", "--top-k", "5"],
     "do not apply"),
    ("chat --temperature 0 --top-p 0.9",
     lambda c: ["chat", "--checkpoint", c["run"], "--temperature", "0", "--top-p", "0.9"],
     "do not apply"),
    # as sample's --max-new-tokens-limit: a reply of a billion tokens ran until Ctrl-C
    ("chat --max-new-tokens 1000000000",
     lambda c: ["chat", "--checkpoint", c["run"], "--max-new-tokens", "1000000000"],
     "max-new-tokens"),
    ("sample --beam 2 --temperature 0.5",
     lambda c: _sample(c, "--beam", "2", "--temperature", "0.5"), "do not apply"),
    # length ** penalty past the largest float, or rounded to 0: a traceback from the search
    ("sample --beam 2 --length-penalty 1e308",
     lambda c: _sample(c, "--beam", "2", "--length-penalty", "1e308"),
     "--length-penalty must be from -20 to 20"),
    ("seq2seq translate --beam 2 --length-penalty -1e308",
     lambda c: ["seq2seq", "translate", "--checkpoint", c["s2s"], "--source", "3 march 1999",
                "--beam", "2", "--length-penalty", "-1e308"], "from -20 to 20"),
    ("sample --num-samples 1000000000", lambda c: _sample(c, "--num-samples", "1000000000"),
     "num-samples"),
    # a batch no memory could hold was taken: it failed (or swapped) only once the server's
    # batch grew into it under load
    ("serve --max-batch whose KV caches cannot fit",
     lambda c: ["serve", "--checkpoint", c["run"], "--port", "0", "--max-batch", str(10**12)],
     "lower --max-batch (at most"),
    # it said "checkpoint X does not exist", naming neither flag of the two checkpoints
    ("sample --draft with no such run",
     lambda c: _sample(c, "--draft", c["root"] / "no-such-draft"), "--draft: checkpoint"),
    ("sample --stop ''", lambda c: _sample(c, "--stop", ""), "stop"),
    ("sample --temperature nan", lambda c: _sample(c, "--temperature", "nan"), "temperature"),
    ("sample --prompt-file DIR", lambda c: _sample(c, "--prompt-file", c["a_dir"]), "directory"),
    ("sample --prompt-file LOOP", lambda c: _sample(c, "--prompt-file", c["loop"]), "loop"),
    ("sample --draft RECURRENT", lambda c: _sample(c, "--draft", c["lstm"]), "draft"),
    # a --top-k above the vocabulary is noted, not refused: the note never comes before a
    # refusal, which stays one line
    ("sample --top-k 1000 --draft RECURRENT",
     lambda c: _sample(c, "--top-k", "1000", "--draft", c["lstm"]), "draft"),
    ("sample --top-k 1000 --prompt the vocabulary lacks",
     lambda c: _sample(c, "--top-k", "1000", "--prompt", "\u2603"), "not in the vocabulary"),
    ("sample a NaN model", lambda c: _sample(c, run="nan_run"), "NaN"),
    ("sample a checkpoint of 1e6 layers", lambda c: _sample(c, run="deep_run"), "n_layer"),
    ("sample a checkpoint of a 1e9 vocabulary", lambda c: _sample(c, run="vocab_run"), "GiB"),
    ("sample a checkpoint whose tokenizer is too small",
     lambda c: _sample(c, run="small_tok_run"), "tokenizer"),
    # the tensors past the third were "(and 1 more)", worded as no other list is
    ("sample a checkpoint whose weights lack a block's MLP", lambda c: _sample(c, run="no_mlp_run"),
     "do not fit the model its settings describe: missing transformer.h.0.mlp.c_fc.weight, "
     "transformer.h.0.mlp.c_fc.bias, transformer.h.0.mlp.c_proj.weight and 1 more"),
    ("eval --max-tokens 0", lambda c: ["eval", "--checkpoint", c["run"], "--max-tokens", "0"],
     "max-tokens"),
    # it said "top_k must be >= 0", a name the user had not written
    ("inspect --setting k=-1",
     lambda c: ["inspect", "--checkpoint", c["run"], "--prompt", "a", "--setting", "k=-1"],
     "sampling setting 'k=-1': k must be >= 0"),
    # it said '2.5' "is not a number"
    ("inspect --setting k=2.5",
     lambda c: ["inspect", "--checkpoint", c["run"], "--prompt", "a", "--setting", "k=2.5"],
     "not a whole number"),
    # it said "the text is empty after tokenization", once the model had loaded
    ("attention --text ''",
     lambda c: ["attention", "--checkpoint", c["run"], "--text", "", "--out",
                c["root"] / "out" / "attention.png"], "--text is empty"),
    # it was taken, and the default --max-new-tokens blamed: "500 exceeds the allowed -5"
    ("sample --max-new-tokens-limit -5",
     lambda c: _sample(c, "--max-new-tokens-limit", "-5"), "expected a positive integer"),
    ("eval a checkpoint cut short", lambda c: ["eval", "--checkpoint", c["cut_ckpt"]],
     "a zip archive without its end"),
    ("sample a GGUF file", lambda c: _sample(c, run="gguf_file"), "does not read it"),
    # a prepared dataset where a model goes was "no checkpoint (best.pt or last.pt)" in it
    ("sample --checkpoint a prepared dataset", lambda c: _sample(c, run="data"), "not a model"),
    ("eval --checkpoint a prepared dataset",
     lambda c: ["eval", "--checkpoint", c["data"]], "prepared dataset"),
    ("finetune --init-from a prepared dataset",
     lambda c: ["finetune", "--task", "classify", "--init-from", c["data"], "--data",
                c["root"] / "labels.tsv", "--out", c["root"] / "out" / "f"], "not a model"),
    ("train --init-from a prepared dataset",
     lambda c: ["train", "--init-from", c["data"], "--dataset", c["data"], "--out",
                c["root"] / "out" / "t", *TINY[8:]], "prepared dataset"),
    # the base was loaded and the data read before the device was checked
    ("train --init-from RUN --device cuda (none here)",
     lambda c: ["train", "--init-from", c["run"], "--dataset", c["data"], "--out",
                c["root"] / "out" / "t", *TINY[8:], "--device", "cuda"], "cuda"),
    # GPT-2 named as a path: "checkpoint gpt2 does not exist", no word of hf:gpt2
    ("train --init-from gpt2",
     lambda c: ["train", "--init-from", "gpt2", "--dataset", c["data"], "--out",
                c["root"] / "out" / "t", *TINY[8:]], "a Hugging Face model is hf:gpt2"),
    # the run is there, yet was "neither a local directory nor a Hugging Face hub model id"
    ("sample --checkpoint hf:RUN",
     lambda c: ["sample", "--checkpoint", f"hf:{c['run']}", "--max-new-tokens", "4"],
     "is not a Hugging Face hub model id; hf: names a hub model: give a local directory without"),
    # seq2seq
    ("seq2seq translate --source ''",
     lambda c: ["seq2seq", "translate", "--checkpoint", c["s2s"], "--source", ""], "empty"),
    # spaces alone were decoded into whatever the model writes for nothing, with no word
    ("seq2seq translate --source of spaces alone",
     lambda c: ["seq2seq", "translate", "--checkpoint", c["s2s"], "--source", "   "],
     "the source is blank (whitespace only)"),
    # a line out for each line in: a skipped empty line would shift every later output
    ("seq2seq translate --source-file with an empty line",
     lambda c: ["seq2seq", "translate", "--checkpoint", c["s2s"], "--source-file",
                c["root"] / "blank-line.txt"], "line 2: empty line"),
    ("seq2seq translate an over-long source",
     lambda c: ["seq2seq", "translate", "--checkpoint", c["s2s"], "--source", "1 " * 2000],
     "the source has 4000 tokens, more than the 511 this model reads (trained with "
     "--max-positions 512)"),
    # it said 'a source has 600 tokens', not which line of the file
    ("seq2seq translate --source-file with an over-long line",
     lambda c: ["seq2seq", "translate", "--checkpoint", c["s2s"], "--source-file",
                c["root"] / "long-line.txt"], "source 2 of 3 has 600 tokens, more than the 511"),
    ("seq2seq translate --beam 1e30",
     lambda c: ["seq2seq", "translate", "--checkpoint", c["s2s"], "--source", "1 may",
                "--beam", str(10**30)], "GiB"),
    ("seq2seq eval --beam 1e12",
     lambda c: ["seq2seq", "eval", "--checkpoint", c["s2s"], "--beam", str(10**12)], "GiB"),
    # a hub model was downloaded before it was refused, a GPT-2 being no seq2seq model
    ("seq2seq translate --checkpoint hf:gpt2",
     lambda c: ["seq2seq", "translate", "--checkpoint", "hf:gpt2", "--source", "1 may"],
     "seq2seq reads a run of 'scratchgpt seq2seq train'"),
    ("seq2seq translate --checkpoint a Hugging Face directory",
     lambda c: ["seq2seq", "translate", "--checkpoint", c["hf"], "--source", "1 may"],
     "is a Hugging Face model, a GPT-2 language model"),
    # it said to train one with 'scratchgpt train --dataset', which makes no seq2seq model
    ("seq2seq eval --checkpoint a prepared dataset",
     lambda c: ["seq2seq", "eval", "--checkpoint", c["data"]], "seq2seq trains on pairs"),
    ("seq2seq resume with another architecture's flag",
     lambda c: ["seq2seq", "train", "--out", c["s2s"], "--resume", "--no-bidirectional"],
     "does not take --no-bidirectional"),
    # a run is resumed by the command that trains its kind (train read a seq2seq model's
    # config as a GPT's: an AttributeError traceback)
    ("train --resume of a seq2seq run",
     lambda c: ["train", "--dataset", c["data"], "--out", c["s2s"], "--resume"],
     "resume it with 'scratchgpt seq2seq train --out"),
    ("finetune --resume of a language model's run",
     lambda c: ["finetune", "--out", c["run"], "--resume"],
     "resume it with 'scratchgpt train --out"),
    ("seq2seq train --resume of a language model's run",
     lambda c: ["seq2seq", "train", "--out", c["run"], "--resume"],
     "resume it with 'scratchgpt train --out"),
    ("seq2seq train --data a folder",  # it was "no such file", though the folder is there
     lambda c: ["seq2seq", "train", "--data", c["root"], "--out", c["root"] / "out" / "s",
                "--no-progress"], "is a directory, not a file"),
    ("seq2seq train --max-positions shorter than the pairs",  # was a first step's error
     lambda c: ["seq2seq", "train", "--task", "dates", "--out", c["root"] / "out" / "s",
                *S2S_TINY, "--max-positions", "8"],
     "--max-positions 8 is shorter than the longest source or target"),
    # the advice of the refusal above, followed for a pair of 20,000 characters: a failed
    # allocation of some 77 GB and a traceback, as the estimate counted no attention
    ("seq2seq train --data with a pair of 20,000 characters and --max-positions 20001",
     lambda c: ["seq2seq", "train", "--data", c["long_pair_tsv"], "--out",
                c["root"] / "out" / "s", "--max-positions", "20001", "--no-progress"],
     "(attention grows with the square of the length)"),
    # UTF-16 without a byte-order mark was read as pairs with a NUL beside every letter
    ("seq2seq train --data pairs saved as UTF-16 without a byte-order mark",
     lambda c: ["seq2seq", "train", "--data", c["utf16_tsv"], "--out", c["root"] / "out" / "s",
                *S2S_TINY[4:]], "UTF-16 text saved without a byte-order mark"),
    ("seq2seq train into an existing run",
     lambda c: ["seq2seq", "train", "--task", "dates", "--out", c["s2s"], *S2S_TINY],
     "already holds a run"),
    # it named d_model and n_head, settings nobody typed
    ("seq2seq train --n-head that does not divide --d-model",
     lambda c: ["seq2seq", "train", "--task", "dates", "--out", c["root"] / "out" / "s",
                *S2S_TINY, "--n-head", "3"], "--d-model (16) must be divisible by --n-head (3)"),
    # it said "too few pairs to hold out 0%"
    ("seq2seq train --data with a --valid-fraction that holds out no pair",
     lambda c: ["seq2seq", "train", "--data", c["root"] / "labels.tsv", "--valid-fraction",
                "0.001", "--out", c["root"] / "out" / "s", *S2S_TINY[4:]],
     "--valid-fraction 0.001 held out none of its 40 pairs"),
    # the split goes by source: it said 'give more pairs' of a file of two sources
    ("seq2seq train --data a label-first file (two sources)",
     lambda c: ["seq2seq", "train", "--data", c["root"] / "label-first.tsv", "--out",
                c["root"] / "out" / "s", *S2S_TINY[4:]], "they have 2 distinct sources"),
    # fine-tuning
    ("finetune --task instruct --held-out 0.9 of 3 conversations (none left to train on)",
     lambda c: ["finetune", "--task", "instruct", "--init-from", c["run"], "--data",
                c["three_chats"], "--held-out", "0.9", "--out", c["root"] / "out" / "ft"],
     "leaves no conversation to train on"),
    ("finetune --task instruct --data a record whose output is empty",
     lambda c: ["finetune", "--task", "instruct", "--init-from", c["run"], "--data",
                c["empty_output"], "--out", c["root"] / "out" / "ft"],
     "record 3: 'output' is empty: it would teach the model to reply with nothing"),
    # the memory was never checked: the base was loaded, the data read and the base evaluated
    ("finetune --task instruct --batch-size 1000000000",
     lambda c: ["finetune", "--task", "instruct", "--init-from", c["run"], "--data",
                c["three_chats"], "--batch-size", "1000000000", "--out",
                c["root"] / "out" / "ft"], "more than the"),
    # a header other than text<TAB>label was read as a text: a class of one, never tested
    ("finetune --task classify --data a TSV whose header is review<TAB>sentiment",
     lambda c: ["finetune", "--task", "classify", "--init-from", c["run"], "--data",
                c["header_tsv"], "--out", c["root"] / "out" / "ft"],
     "Is the first row a header?"),
    # a header of more columns: the user who removed it trained on texts led by their ids
    ("finetune --task classify --data a TSV whose header is id<TAB>text<TAB>label",
     lambda c: ["finetune", "--task", "classify", "--init-from", c["run"], "--data",
                c["id_header_tsv"], "--out", c["root"] / "out" / "ft"],
     "a text is all 2 columns before the label: keep only the text and label columns"),
    # labelled text was 'not valid JSON (Expecting value: line 1 column 1 (char 0))'
    ("finetune --task instruct --data a labelled TSV (classify's data)",
     lambda c: ["finetune", "--task", "instruct", "--init-from", c["run"], "--data",
                c["header_tsv"], "--out", c["root"] / "out" / "ft"],
     "line 1 is not valid JSON (Expecting value at column 1; a line of text<TAB>label is "
     "labelled text, for --task classify?)"),
    # UTF-16 without a byte-order mark was read as texts and labels with NULs in them
    ("finetune --task classify --data a TSV saved as UTF-16 without a byte-order mark",
     lambda c: ["finetune", "--task", "classify", "--init-from", c["run"], "--data",
                c["utf16_tsv"], "--out", c["root"] / "out" / "ft"],
     "UTF-16 text saved without a byte-order mark"),
    # the run's own --task, --init-from and --data pass a resume again; other ones do not
    ("finetune --resume --data another file",
     lambda c: ["finetune", "--out", c["classifier"], "--resume", "--task", "classify",
                "--data", c["label_first"]], "this run has --data"),
    # without --out a resume finds the run in runs/TASK-DATA, which --task and --data name
    ("finetune --resume without --out or --data",
     lambda c: ["finetune", "--resume", "--task", "classify"],
     "--out DIR, or the --task and --data (or --dataset) it was started with (a run started "
     "without --out is in runs/classify-DATA)"),
    # the run's own --epochs, --split-seed ... pass a resume again; another value does not
    ("finetune --resume --epochs other than the run's",
     lambda c: ["finetune", "--out", c["classifier"], "--resume", "--split-seed", "0",
                "--epochs", "2"], "this run has --epochs 3 (drop --epochs,"),
    ("classify --eval a file written label<TAB>text",
     lambda c: ["classify", "--checkpoint", c["classifier"], "--eval", c["label_first"]],
     "are its lines label<TAB>text?"),
    # it said "label 'other words' is not one the model knows (a, b)"
    ("classify --eval a file written label<TAB>text, its texts the labels in capitals",
     lambda c: ["classify", "--checkpoint", c["classifier"], "--eval", c["label_first_caps"]],
     "its label and text columns look swapped (its texts are the model's labels (a, b)"),
    # both would read standard input: one of them would find it already read, and empty
    ("classify --file - --eval -",
     lambda c: ["classify", "--checkpoint", c["classifier"], "--file", "-", "--eval", "-"],
     "would both read standard input"),
    # experiments: sizes beyond any memory, counts beyond any wait
    ("experiment count --modulus 1e5", lambda c: ["experiment", "count", "--modulus", "100000",
                                                  "--out", c["root"] / "out" / "c"], "GiB"),
    ("experiment count --hidden 1e30",
     lambda c: ["experiment", "count", "--hidden", str(10**30), "--out", c["root"] / "out" / "c"],
     "too large"),
    ("experiment memory --max-len 1e30",
     lambda c: ["experiment", "memory", "--quick", "--max-len", str(10**30), "--out",
                c["root"] / "out" / "m"], "GiB"),
    ("experiment memory --symbols 1e30",
     lambda c: ["experiment", "memory", "--quick", "--symbols", str(10**30), "--out",
                c["root"] / "out" / "m"], "too large"),
    ("experiment memory --cells lstm lstm",
     lambda c: ["experiment", "memory", "--quick", "--cells", "lstm", "rnn", "lstm", "--out",
                c["root"] / "out" / "m"], "--cells names lstm more than once"),
    # a bias beyond float32 was a traceback, once the RNN before the LSTM had trained
    ("experiment memory --forget-bias 1e300",
     lambda c: ["experiment", "memory", "--quick", "--forget-bias", "1e300", "--out",
                c["root"] / "out" / "m"], "--forget-bias must be in [-100, 100]"),
    # an infinite rate was refused as "must be > 0, got inf", a bound it does not break
    ("experiment memory --learning-rate inf",
     lambda c: ["experiment", "memory", "--quick", "--learning-rate", "inf", "--out",
                c["root"] / "out" / "m"], "--learning-rate/--lr: expected a finite number"),
    ("experiment gpt-build --lr inf",
     lambda c: ["experiment", "gpt-build", "--quick", "--lr", "inf", "--out",
                c["root"] / "out" / "g"], "--learning-rate/--lr: expected a finite number"),
    # its folder's mkdir found the file in the way only once every model had trained
    ("experiment memory --out below a file",
     lambda c: ["experiment", "memory", "--quick", "--out", c["plain_file"] / "m"],
     "is below"),
    # found by the writes once every model had trained: 'No such file or directory: /proc/m'
    ("experiment count --out where nothing can be written",
     lambda c: ["experiment", "count", "--out", "/proc/scratchgpt-count"],
     "no file can be written in /proc"),
    # found by the first stage's run directory, in train's words ('give the run its own --out')
    ("experiment gpt-build --out a file",
     lambda c: ["experiment", "gpt-build", "--quick", "--stages", "1", "--dataset", c["data"],
                "--out", c["plain_file"]], "is a file; give a directory"),
    # the stage was trained once, the repeat dropped in silence; refused as memory --cells' are
    ("experiment gpt-build --stages 1 bigram",
     lambda c: ["experiment", "gpt-build", "--quick", "--stages", "1", "bigram", "--dataset",
                c["data"], "--out", c["root"] / "out" / "g"], "--stages names 1-bigram more "
                                                             "than once"),
    # its report then compared the stages of two datasets as one build
    ("experiment gpt-build --dataset another than its --out's stages'",
     lambda c: ["experiment", "gpt-build", "--quick", "--stages", "2", "--dataset",
                c["other_data"], "--out", c["gb"]], "one report would compare the stages of "
                                                    "two datasets"),
    # told apart by its path alone, the dataset prepared again made one report of two texts
    ("experiment gpt-build --dataset prepared again from another text since its stages",
     lambda c: ["experiment", "gpt-build", "--quick", "--stages", "2", "--dataset", c["data"],
                "--out", c["gb_retexted"]], "before it was prepared again from another text"),
    # Hugging Face imports
    ("convert --from hf claiming 1e5 layers",
     lambda c: ["convert", "--from", "hf", c["hf_deep"], "--out", c["root"] / "out" / "hf1"],
     "n_layer"),
    ("convert --from hf with a string vocab_size",
     lambda c: ["convert", "--from", "hf", c["hf_str_vocab"], "--out", c["root"] / "out" / "h2"],
     "vocab_size"),
    ("convert --from hf with a list n_embd",
     lambda c: ["convert", "--from", "hf", c["hf_list_embd"], "--out", c["root"] / "out" / "h3"],
     "n_embd"),
    ("convert --from hf with a JSON list config",
     lambda c: ["convert", "--from", "hf", c["hf_json_list"], "--out", c["root"] / "out" / "h4"],
     "config.json"),
    # safetensors' "incomplete metadata, file not fully covered"
    ("convert --from hf of a safetensors file cut short",
     lambda c: ["convert", "--from", "hf", c["hf_cut_short"], "--out", c["root"] / "out" / "h7"],
     "it is truncated"),
    # a model in shards was "not a Hugging Face directory"; one left out is named
    ("convert --from hf of a model in shards, one missing",
     lambda c: ["convert", "--from", "hf", c["hf_shard_missing"], "--out",
                c["root"] / "out" / "h8"], "names the shard 'model-00002-of-00002.safetensors'"),
    # .bin shards (pytorch_model.bin.index.json) were "not a Hugging Face directory"
    ("convert --from hf of a model in .bin shards, one missing",
     lambda c: ["convert", "--from", "hf", c["hf_bin_shard_missing"], "--out",
                c["root"] / "out" / "h10"], "names the shard 'pytorch_model-00002-of-00002.bin'"),
    # an AttributeError traceback: 'list' object has no attribute 'get'
    ("convert --from hf of a pytorch_model.bin holding a list",
     lambda c: ["convert", "--from", "hf", c["hf_bin_list"], "--out", c["root"] / "out" / "h11"],
     "holds a list, not tensors by name"),
    # the tensors past the first were "(and 3 more)", worded as no other list is
    ("convert --from hf of a model whose weights lack a block's MLP",
     lambda c: ["convert", "--from", "hf", c["hf_no_mlp"], "--out", c["root"] / "out" / "h9"],
     "missing tensors 'h.0.mlp.c_fc.weight', 'h.0.mlp.c_fc.bias', 'h.0.mlp.c_proj.weight' and "
     "1 more"),
    # it said "not GPTClassifier", a class name the user never met
    ("convert --to hf of a classifier run",
     lambda c: ["convert", "--checkpoint", c["classifier"], "--to", "hf", "--out",
                c["root"] / "out" / "hc"], "gpt-classifier run (finetune --task classify)"),
    ("convert --to gguf of an lstm run",
     lambda c: ["convert", "--checkpoint", c["lstm"], "--to", "gguf", "--out",
                c["root"] / "out" / "l.gguf"], "model of type lstm"),
    ("convert --to hf into a run directory",
     lambda c: ["convert", "--checkpoint", c["run"], "--to", "hf", "--out", c["lstm"],
                "--overwrite"], "run"),
    # nor a dataset (the export's merges.txt replaced the dataset's), nor a pipe or device,
    # which the renamed export replaced (--out /dev/null, run as root)
    ("convert --to hf --overwrite into a prepared dataset",
     lambda c: ["convert", "--checkpoint", c["run"], "--to", "hf", "--out", c["data"],
                "--overwrite"], "prepared dataset"),
    ("convert --to gguf --overwrite over a pipe",
     lambda c: ["convert", "--checkpoint", c["run"], "--to", "gguf", "--out", c["pipe"],
                "--overwrite"], "not a regular file"),
    # the mkdir's "cannot write under F", once the model was read: the same words for both
    ("convert --to hf --out below a file",
     lambda c: ["convert", "--checkpoint", c["run"], "--to", "hf", "--out",
                c["plain_file"] / "hf"], "is below"),
    ("convert --to gguf --out below a file",
     lambda c: ["convert", "--checkpoint", c["run"], "--to", "gguf", "--out",
                c["plain_file"] / "m.gguf"], "is below"),
    # "argument --from: expected 2 arguments", which named no format
    ("convert --from a path without its format",
     lambda c: ["convert", "--from", c["hf"], "--out", c["root"] / "out" / "h6"],
     "--from takes a FORMAT and a PATH, as in --from hf"),
    # a pipe or device (--out /dev/null) was called "a file, not a run directory"
    ("convert --from hf --out a pipe",
     lambda c: ["convert", "--from", "hf", c["hf"], "--out", c["pipe"]],
     "a-pipe is a pipe, not a run directory"),
    ("train --out a pipe", lambda c: ["train", "--dataset", c["data"], "--out", c["pipe"], *TINY],
     "a-pipe is a pipe, not a run directory"),
    # a run given to --from hf was only "not a Hugging Face directory"
    ("convert --from hf a scratchgpt run",
     lambda c: ["convert", "--from", "hf", c["run"], "--out", c["root"] / "out" / "h5"],
     "a scratchgpt run, which every command reads as it is"),
    # a GGUF file to import: "only 'hf' is supported", and "not a Hugging Face directory"
    ("convert --from gguf a GGUF file",
     lambda c: ["convert", "--from", "gguf", c["gguf_file"], "--out", c["root"] / "out" / "g1"],
     "writes GGUF (convert --to gguf) but does not read it; convert reads hf alone"),
    ("convert --from hf a GGUF file",
     lambda c: ["convert", "--from", "hf", c["gguf_file"], "--out", c["root"] / "out" / "g2"],
     "it is a GGUF file, for llama.cpp, and scratchgpt writes GGUF"),
    # a prepared dataset is never a run's directory, whatever the flags say
    ("train --out a prepared dataset --overwrite",
     lambda c: ["train", "--dataset", c["data"], "--out", c["data"], "--overwrite", *TINY],
     "prepared dataset"),
    ("train --out a prepared dataset --resume",
     lambda c: ["train", "--out", c["data"], "--resume", *TINY], "prepared dataset"),
    # nor is a Hugging Face model's: the run's config.json would replace the model's
    ("train --out a Hugging Face model --overwrite",
     lambda c: ["train", "--dataset", c["data"], "--out", c["hf"], "--overwrite", *TINY],
     "Hugging Face model"),
    ("convert --from hf into the model's own directory --overwrite",
     lambda c: ["convert", "--from", "hf", c["hf"], "--out", c["hf"], "--overwrite"],
     "Hugging Face model"),
    # benchmarks: a base that is no GPT is refused before the suite writes its data
    ("bench finetune --suite synthetic --base an LSTM run",
     lambda c: ["bench", "finetune", "--suite", "synthetic", "--base", c["lstm"], "--out",
                c["root"] / "out" / "bf"], "lstm"),
    # NaN passed its '<= 0' check: no request was sent, and nan times were printed as figures
    ("bench serve --time-limit nan", lambda c: ["bench", "serve", "--time-limit", "nan"],
     "--time-limit must be > 0 seconds"),
    # each ran again: another --budget of training (10 minutes), a row of the table each time
    ("bench seq2seq --archs naming a model twice",
     lambda c: ["bench", "seq2seq", "--archs", "lstm", "lstm"],
     "--archs names lstm more than once"),
    # threads beyond the cores took turns on them: the figures timed the turns
    ("bench sample --threads beyond the cores",
     lambda c: ["bench", "sample", "--threads", str(cores() + 1)],
     "this machine's CPU cores"),
    # it was '--prompt-len must be in [1, 0], got 64', naming a flag nobody typed
    ("bench speculative --block-size 0",
     lambda c: ["bench", "speculative", "--random-target", "1,1,16", "--block-size", "0"],
     "argument --block-size: expected a positive integer"),
    # each was timed again, a row of the table each time
    ("bench decode-step --tokens naming a count twice",
     lambda c: ["bench", "decode-step", "--checkpoint", c["run"], "--tokens", "1,1"],
     "--tokens names 1 more than once"),
    # a text file is no prepared dataset: it was called "no such directory" though it exists
    ("train --dataset a text file", lambda c: ["train", "--dataset", c["text"], "--out",
                                               c["root"] / "out" / "t", *TINY],
     "prepare it first: scratchgpt prepare --data"),
    # prepare
    ("prepare a 1-character file", lambda c: ["prepare", "--data", c["one_char"], "--out",
                                              c["root"] / "out" / "p1"], "single character"),
    # prepared without a word, a token in each split: no run could train or evaluate on it
    ("prepare a 2-character file", lambda c: ["prepare", "--data", c["two_chars"], "--out",
                                              c["root"] / "out" / "p1"],
     "too few for a context window of any size"),
    ("prepare a symlink loop", lambda c: ["prepare", "--data", c["loop"], "--out",
                                          c["root"] / "out" / "p2"], "leads nowhere"),
    ("prepare --out under a file", lambda c: ["prepare", "--data", c["text"], "--out",
                                              c["plain_file"] / "sub"], "plain-file"),
    # a run's --out below a plain file: refused by the mkdir, once the data had been read
    ("train --out below a file",
     lambda c: ["train", "--dataset", c["data"], "--out", c["plain_file"] / "run", *TINY],
     "is below"),
    ("train --resume --out below a file",
     lambda c: ["train", "--resume", "--out", c["plain_file"] / "run"], "is below"),
    ("train --init-from --out below a file",
     lambda c: ["train", "--init-from", c["run"], "--dataset", c["data"], "--out",
                c["plain_file"] / "run", *TINY[8:]], "is below"),
    ("finetune --out below a file",
     lambda c: ["finetune", "--task", "classify", "--init-from", c["run"], "--data",
                c["root"] / "labels.tsv", "--out", c["plain_file"] / "run"], "is below"),
    ("prepare over an existing dataset", lambda c: ["prepare", "--data", c["text"], "--out",
                                                    c["data"]], "--overwrite"),
    # a character count given as --vocab-size was refused as not above 256 (a BPE's byte
    # tokens), and only a size above 256 was then told that the flag is BPE's alone
    ("prepare --tokenizer char --vocab-size 65",
     lambda c: ["prepare", "--data", c["text"], "--tokenizer", "char", "--vocab-size", "65",
                "--out", c["root"] / "out" / "p4"], "applies to --tokenizer bpe only"),
    # a BPE checkpoint copied without the merges.txt beside it: the message was Python's
    # "[Errno 2] No such file or directory", which did not say where the file must be
    ("sample a BPE checkpoint copied without its merges.txt",
     lambda c: ["sample", "--checkpoint", c["bpe_copied"], "--max-new-tokens", "4"],
     "copy merges.txt"),
    ("prepare --tokenizer-from a BPE checkpoint copied without its merges.txt",
     lambda c: ["prepare", "--data", c["text"], "--tokenizer-from", c["bpe_copied"], "--out",
                c["root"] / "out" / "p3"], "copy merges.txt"),
    # GPT-2's tokenizer asked for by --tokenizer-from: "checkpoint gpt2 does not exist", which
    # named no flag and read as if the flag took checkpoints alone (it takes datasets too)
    # a run resumed after its dataset moved: refused as "--dataset DIR: no such prepared
    # dataset directory", naming a flag the user had not given
    ("train --resume of a run whose dataset has moved",
     lambda c: ["train", "--out", c["moved_data_run"], "--resume", "--max-iters", "4"],
     "is no longer there; pass --dataset"),
    ("prepare --tokenizer-from gpt2",
     lambda c: ["prepare", "--data", c["text"], "--tokenizer-from", "gpt2", "--out",
                c["root"] / "out" / "p5"], "give --tokenizer gpt2"),
    # BPE-dropout copies that need more than the disk holds: the copies of a small text began
    # writing some 90 GB of train.bin (--train-copies 100000000) until the disk was full
    ("prepare --train-copies beyond the free disk space",
     lambda c: ["prepare", "--data", c["text"], "--tokenizer", "bpe", "--vocab-size", "300",
                "--bpe-dropout", "0.1", "--train-copies", str(10**12), "--out",
                c["root"] / "out" / "p6"], "ask for fewer"),
]


@pytest.mark.parametrize("name,argv,word", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_one_line_and_exit_code_2(ctx, name, argv, word, capsys, figures):
    if "--device cuda" in name and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    args = [str(a) for a in argv(ctx)]
    watched = [ctx[k] for k in ("run", "lstm", "s2s", "data", "foreign", "no_ckpt", "hf",
                                "classifier")]
    before = [snapshot(p) for p in watched]
    capsys.readouterr()
    try:
        code = main(args)
    except SystemExit as stop:  # argparse's own refusals: a flag's type or choices
        code = stop.code
    err = capsys.readouterr().err
    figures.exit_codes[name] = code
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("scratchgpt"), err
    assert "Traceback" not in err
    assert word.lower() in err.lower(), err
    assert [snapshot(p) for p in watched] == before  # nothing the user had was touched
    assert not (ctx["root"] / "out").exists()  # and a refused new run left no folder
