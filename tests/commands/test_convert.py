"""convert --from hf / --to hf, sample straight from a Hugging Face directory, --batch-prompts,
--dtype bf16."""

from __future__ import annotations

import errno
import os
import signal
import stat
import time
from pathlib import Path

import pytest
import torch

from scratchgpt.checkpoints import Checkpoint, save_checkpoint
from scratchgpt.checkpoints.hf import save_hf
from scratchgpt.cli import main
from scratchgpt.models.bigram import BigramConfig, BigramLM
from scratchgpt.models.gpt import GPT, GPTConfig
from scratchgpt.tokenizers import CharTokenizer
from tests.cli_errors import error_of
from tests.reliability.conftest import snapshot
from tests.requires import optional
from tests.tiny_gpt import sharp_gpt

CHARS = list("abcdefghijklmnopqrstuvwxyz .,\n")


def tiny_gpt() -> GPT:
    return sharp_gpt(scale=30, vocab_size=len(CHARS), block_size=32)


@pytest.fixture()
def run_dir(tmp_path) -> Path:
    out = tmp_path / "run"
    tok = CharTokenizer(CHARS)
    tok.save(out)
    model = tiny_gpt()
    save_checkpoint(out / "best.pt", Checkpoint("gpt", model.config, model.state_dict()))
    return out


def run(capsys, argv) -> str:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def greedy(capsys, checkpoint: Path, prompt: str, *extra: str) -> str:
    return run(capsys, ["sample", "--checkpoint", str(checkpoint), "--prompt", prompt,
                        "--temperature", "0", "--max-new-tokens", "15", *extra])


def test_export_import_and_sample_from_hf_dir(run_dir, tmp_path, capsys):
    hf, back = tmp_path / "hf", tmp_path / "back"
    run(capsys, ["convert", "--to", "hf", "--checkpoint", str(run_dir), "--out", str(hf)])
    assert (hf / "config.json").is_file() and (hf / "model.safetensors").is_file()
    run(capsys, ["convert", "--from", "hf", str(hf), "--out", str(back)])
    a = greedy(capsys, run_dir, "the ")
    assert greedy(capsys, hf, "the ") == a  # sample reads the HF directory directly
    assert greedy(capsys, back, "the ") == a
    assert (back / "tokenizer.json").is_file()


def test_an_export_is_replaced_with_overwrite_and_a_run_never_is(run_dir, tmp_path, capsys):
    """An earlier export's config.json does not make it a run: --overwrite writes the export
    again. A run directory keeps refusing, --overwrite or not, and keeps its files."""
    hf = tmp_path / "hf"
    run(capsys, ["convert", "--to", "hf", "--checkpoint", str(run_dir), "--out", str(hf)])
    assert main(["convert", "--to", "hf", "--checkpoint", str(run_dir), "--out", str(hf)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    first = (hf / "model.safetensors").stat().st_mtime_ns
    run(capsys, ["convert", "--to", "hf", "--checkpoint", str(run_dir), "--out", str(hf),
                 "--overwrite"])
    assert (hf / "model.safetensors").stat().st_mtime_ns != first
    before = {f.name: f.read_bytes() for f in run_dir.iterdir() if f.is_file()}
    assert main(["convert", "--to", "hf", "--checkpoint", str(run_dir), "--out", str(run_dir),
                 "--overwrite"]) == 2
    assert "scratchgpt run" in capsys.readouterr().err
    assert {f.name: f.read_bytes() for f in run_dir.iterdir() if f.is_file()} == before


def test_overwrite_leaves_no_earlier_tokenizer_beside_the_new_model(tmp_path, capsys):
    """An export over an earlier one takes the earlier model's files away (its tokenizer would
    pass for the new model's), and keeps the user's own files."""
    hf = save_hf(tiny_gpt(), tmp_path / "hf", CharTokenizer(CHARS))
    (hf / "tokenizer.json").write_text("{}")  # another tool's tokenizer file
    (hf / "README.md").write_text("notes")
    model = tiny_gpt()
    save_checkpoint(tmp_path / "bare.pt", Checkpoint("gpt", model.config, model.state_dict()))
    run(capsys, ["convert", "--to", "hf", "--checkpoint", str(tmp_path / "bare.pt"), "--out",
                 str(hf), "--overwrite"])
    assert sorted(p.name for p in hf.iterdir()) == [
        "README.md", "config.json", "generation_config.json", "model.safetensors"]
    assert main(["sample", "--checkpoint", str(hf), "--prompt", "a"]) == 2
    assert "has no tokenizer" in capsys.readouterr().err


def test_overwrite_into_a_folder_without_a_model_removes_nothing(run_dir, tmp_path, capsys):
    """Only an earlier model's files are cleared: a folder of other files keeps them all, even
    one named like a tokenizer file."""
    out = tmp_path / "project"
    out.mkdir()
    (out / "vocab.json").write_text("my own vocabulary")
    run(capsys, ["convert", "--to", "hf", "--checkpoint", str(run_dir), "--out", str(out),
                 "--overwrite"])
    assert (out / "vocab.json").read_text() == "my own vocabulary"


def test_writing_over_a_run_suggests_only_the_flags_the_command_has(run_dir, tmp_path,
                                                                   capsys):
    """convert --from hf and finetune --merge cannot resume a run: refusing to write over one,
    they point to --overwrite alone."""
    from scratchgpt.models.lora import GPTLoRAConfig, LoRAConfig, build_gpt_lora

    hf = save_hf(tiny_gpt(), tmp_path / "hf", CharTokenizer(CHARS))
    cfg = GPTLoRAConfig(tiny_gpt().config, LoRAConfig(rank=2))
    save_checkpoint(tmp_path / "lora.pt", Checkpoint("gpt-lora", cfg,
                                                     build_gpt_lora(cfg).state_dict()))
    for argv in (["convert", "--from", "hf", str(hf), "--out", str(run_dir)],
                 ["finetune", "--merge", str(tmp_path / "lora.pt"), "--out", str(run_dir)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "already holds a run; pass --overwrite to replace it" in err, err
        assert "--resume" not in err, err


def test_hf_dir_without_tokenizer_is_a_clear_error(tmp_path, capsys):
    save_hf(tiny_gpt(), tmp_path / "hf")
    assert main(["sample", "--checkpoint", str(tmp_path / "hf"), "--prompt", "a"]) == 2
    assert "has no tokenizer" in capsys.readouterr().err


def test_importing_a_dir_without_tokenizer_says_the_run_cannot_be_prompted(tmp_path, capsys):
    """The run is written (its weights can still be exported or inspected), with a note on
    stderr that sample will refuse it and what to do; it said nothing, and sample refused the
    run later. A directory with its tokenizer gets no note."""
    save_hf(tiny_gpt(), tmp_path / "bare")
    assert main(["convert", "--from", "hf", str(tmp_path / "bare"), "--out",
                 str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"note: {tmp_path / 'bare'} has no tokenizer") and \
        "convert again with --overwrite" in err, err
    assert (tmp_path / "run" / "best.pt").is_file()
    for argv in (["sample", "--prompt", "a"], ["chat"]):
        # (it said 'no tokenizer found: RUN/tokenizer.json does not exist', as if a file of
        # the run were lost)
        assert error_of(capsys, [argv[0], "--checkpoint", str(tmp_path / "run"),
                                 *argv[1:]]) == (
            f"scratchgpt {argv[0]}: error: {tmp_path / 'run' / 'best.pt'} holds weights only: "
            f"it was converted from {tmp_path / 'bare'}, which had no tokenizer files; put the "
            "model's tokenizer there and convert again with --overwrite"), argv
    save_hf(tiny_gpt(), tmp_path / "full", CharTokenizer(CHARS))
    assert main(["convert", "--from", "hf", str(tmp_path / "full"), "--out",
                 str(tmp_path / "run2")]) == 0
    assert capsys.readouterr().err == ""


def test_the_help_says_what_checkpoint_takes_and_who_refuses_a_weights_only_run(
        run_dir, tmp_path, capsys):
    """--help said --checkpoint took a run directory or a .pt file, where a Hugging Face
    directory, hf:ID and a LoRA run's adapter.pt export too; and that a run imported without a
    tokenizer was one 'sample cannot prompt', where the import's note names every command
    that refuses it."""
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "a Hugging Face GPT-2 directory or hf:ID" in shown and "adapter.pt" in shown, shown
    hf = tmp_path / "hf"
    run(capsys, ["convert", "--to", "hf", "--checkpoint", str(run_dir), "--out", str(hf)])
    run(capsys, ["convert", "--to", "hf", "--checkpoint", str(hf), "--out",
                 str(tmp_path / "again")])  # a Hugging Face directory exports as it says
    assert (tmp_path / "again" / "model.safetensors").read_bytes() == \
        (hf / "model.safetensors").read_bytes()
    refusing = "which sample, chat, finetune and train --init-from refuse"
    assert refusing in shown, shown
    save_hf(tiny_gpt(), tmp_path / "bare")
    assert main(["convert", "--from", "hf", str(tmp_path / "bare"), "--out",
                 str(tmp_path / "weights")]) == 0
    assert refusing in " ".join(capsys.readouterr().err.split())


def test_a_tokenizer_larger_than_the_model_is_one_line(tmp_path, capsys):
    """A directory whose tokenizer has ids the model cannot embed is refused, as a checkpoint
    with such a tokenizer is: by sample, and by convert --from hf, which writes nothing."""
    small = sharp_gpt(scale=30, vocab_size=len(CHARS) - 5, block_size=32)
    hf = save_hf(small, tmp_path / "hf", CharTokenizer(CHARS))
    for argv in (["sample", "--checkpoint", str(hf), "--prompt", "z"],
                 ["convert", "--from", "hf", str(hf), "--out", str(tmp_path / "run")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"tokenizer has {len(CHARS)} tokens" in err and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()


def test_checkpoint_with_from_is_refused(run_dir, tmp_path, capsys):
    """--from reads its PATH: a --checkpoint beside it would be ignored, so it is refused."""
    hf = save_hf(tiny_gpt(), tmp_path / "hf", CharTokenizer(CHARS))
    assert main(["convert", "--from", "hf", str(hf), "--checkpoint", str(run_dir), "--out",
                 str(tmp_path / "out")]) == 2
    assert "--checkpoint applies to --to only" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_which_with_from_is_refused(tmp_path, capsys):
    """--which picks a run directory's checkpoint; an HF directory has one model, so --which
    beside --from would be ignored: it is refused, and nothing is written."""
    hf = save_hf(tiny_gpt(), tmp_path / "hf", CharTokenizer(CHARS))
    assert main(["convert", "--from", "hf", str(hf), "--which", "last", "--out",
                 str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "--which applies to --to only" in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_to_hf_over_a_file_says_it_writes_a_directory(run_dir, tmp_path, capsys):
    """It said to pass --overwrite, which then failed with 'File exists'."""
    (tmp_path / "model.bin").write_text("mine")
    for extra in ([], ["--overwrite"]):
        assert main(["convert", "--to", "hf", "--checkpoint", str(run_dir), "--out",
                     str(tmp_path / "model.bin"), *extra]) == 2
        assert "--to hf writes a directory" in capsys.readouterr().err
    assert (tmp_path / "model.bin").read_text() == "mine"


def test_from_hf_never_writes_into_a_hugging_face_directory(tmp_path, capsys):
    """--out naming the source (or any Hugging Face directory) had its config.json replaced by
    the run's, with --overwrite: then neither sample nor convert could read it."""
    hf = save_hf(tiny_gpt(), tmp_path / "hf", CharTokenizer(CHARS))
    before = {f.name: f.read_bytes() for f in hf.iterdir() if f.is_file()}
    for extra in ([], ["--overwrite"]):
        assert main(["convert", "--from", "hf", str(hf), "--out", str(hf), *extra]) == 2
        assert "holds a Hugging Face model" in capsys.readouterr().err
    assert {f.name: f.read_bytes() for f in hf.iterdir() if f.is_file()} == before


def test_to_hf_never_writes_into_a_prepared_dataset(tmp_path, capsys):
    """--overwrite wrote the export into the dataset's directory: its merges.txt replaced the
    dataset's, which neither train nor eval could read any more."""
    from scratchgpt.data.prepare import prepare_text
    from scratchgpt.tokenizers import load_tokenizer

    data = tmp_path / "data"
    prepare_text("the cat sat on the mat, and the dog sat on the log.\n" * 40, data, "bpe",
                 vocab_size=300, source="test")
    run_dir = tmp_path / "run"
    tok = load_tokenizer(data)  # the run the dataset was prepared for
    tok.save(run_dir)
    model = sharp_gpt(scale=30, vocab_size=tok.vocab_size, block_size=32)
    save_checkpoint(run_dir / "best.pt", Checkpoint("gpt", model.config, model.state_dict()))
    before = {f.name: f.read_bytes() for f in data.iterdir()}
    for extra in ([], ["--overwrite"]):
        msg = error_of(capsys, ["convert", "--to", "hf", "--checkpoint", str(run_dir), "--out",
                                str(data), *extra])
        assert "holds (or is part of) a prepared dataset" in msg, msg
    assert {f.name: f.read_bytes() for f in data.iterdir()} == before


def test_an_export_never_replaces_a_device_or_a_pipe(run_dir, tmp_path, capsys):
    """An export is renamed into place: with --overwrite it replaced the node itself (run as
    root, --out /dev/null left a regular file there); without, it said the pipe was 'a file,
    not a folder'."""
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    for extra in ([], ["--overwrite"]):
        msg = error_of(capsys, ["convert", "--to", "hf", "--checkpoint", str(run_dir), "--out",
                                str(pipe), *extra])
        assert "is not a regular file or directory (a device, a pipe)" in msg, msg
    assert stat.S_ISFIFO(pipe.stat().st_mode)


def test_from_hf_of_our_own_run_says_it_needs_no_converting(run_dir, tmp_path, capsys):
    """A user importing a run (or its .pt) was told only that it is no Hugging Face
    directory, not that nothing needs converting, nor how to make one of it."""
    for source, what in ((run_dir, "run"), (run_dir / "best.pt", "checkpoint")):
        msg = error_of(capsys, ["convert", "--from", "hf", str(source), "--out",
                                str(tmp_path / "out")])
        assert f"it is a scratchgpt {what}, which every command reads as it is" in msg, msg
        assert f"convert --to hf --checkpoint {source} --out DIR" in msg, msg
    assert not (tmp_path / "out").exists()


def test_an_unwritable_export_folder_is_named_not_its_temporary(run_dir, tmp_path, capsys,
                                                                monkeypatch):
    """The files go through a temporary folder: its name, not --out, was the message. (The
    OS's refusal to make that folder is stubbed: tests may run as root, whom chmod does not
    stop.)"""
    hf = tmp_path / "hf"
    run(capsys, ["convert", "--to", "hf", "--checkpoint", str(run_dir), "--out", str(hf)])
    before = {f.name: f.read_bytes() for f in hf.iterdir() if f.is_file()}
    mkdir = Path.mkdir

    def refused(self: Path, *args, **kwargs) -> None:
        if self.name.startswith(".export."):  # the temporary folder, not --out
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", refused)
    msg = error_of(capsys, ["convert", "--to", "hf", "--checkpoint", str(run_dir), "--out",
                            str(hf), "--overwrite"])
    assert msg.endswith(f"cannot write {hf}: Permission denied (the previous export is intact)")
    assert {f.name: f.read_bytes() for f in hf.iterdir() if f.is_file()} == before
    msg = error_of(capsys, ["convert", "--to", "hf", "--checkpoint", str(run_dir), "--out",
                            str(tmp_path / "new")])
    assert msg.endswith(f"cannot write {tmp_path / 'new'}: Permission denied"), msg
    assert not (tmp_path / "new").exists()


def test_a_tokenizer_that_cannot_be_read_is_not_taken_for_none(tmp_path, capsys):
    """A BPE checkpoint copied without the merges.txt beside it: its tokenizer's error was
    swallowed, so --to gguf said the checkpoint held no tokenizer and --to hf wrote the
    weights alone with 'no tokenizer found'."""
    from scratchgpt.data.prepare import prepare_text
    from scratchgpt.tokenizers import load_tokenizer

    prepare_text("the cat sat on the mat, and the dog sat on the log.\n" * 40,
                 tmp_path / "data", "bpe", vocab_size=300, source="test")
    tok = load_tokenizer(tmp_path / "data")
    model = sharp_gpt(scale=30, vocab_size=tok.vocab_size, block_size=32)
    alone = tmp_path / "copied" / "model.pt"
    save_checkpoint(alone, Checkpoint("gpt", model.config, model.state_dict(),
                                      {"text": tok.state()}))
    for target, out in (("gguf", tmp_path / "m.gguf"), ("hf", tmp_path / "hf")):
        msg = error_of(capsys, ["convert", "--to", target, "--checkpoint", str(alone), "--out",
                                str(out)])
        assert "merges" in msg and "has none" not in msg, msg
        assert not out.exists()
    tok.save(alone.parent)  # the merges back beside it: both export, tokenizer included
    run(capsys, ["convert", "--to", "hf", "--checkpoint", str(alone), "--out",
                 str(tmp_path / "hf")])
    assert (tmp_path / "hf" / "merges.txt").is_file()


def test_bigram_cannot_be_exported(tmp_path, capsys):
    model = BigramLM(BigramConfig(vocab_size=5))
    save_checkpoint(tmp_path / "b.pt", Checkpoint("bigram", model.config, model.state_dict()))
    assert main(["convert", "--to", "hf", "--checkpoint", str(tmp_path / "b.pt"), "--out",
                 str(tmp_path / "o")]) == 2
    assert "a model of type bigram cannot be exported" in capsys.readouterr().err


def test_batch_prompts_equal_one_at_a_time(run_dir, tmp_path, capsys):
    prompts = ["the cat", "a", "hello there, my friend"]
    (tmp_path / "p.txt").write_text("\n".join(prompts) + "\n\n")
    out = run(capsys, ["sample", "--checkpoint", str(run_dir), "--prompt-file",
                       str(tmp_path / "p.txt"), "--batch-prompts", "--temperature", "0",
                       "--max-new-tokens", "15"])
    alone = [greedy(capsys, run_dir, p, "--no-stream") for p in prompts]
    assert out == "\n---------------\n".join(alone)


def test_bf16_cli_runs(run_dir, capsys):
    assert greedy(capsys, run_dir, "the ", "--dtype", "bf16").startswith("the ")


def test_bf16_logits_are_close_and_greedy_agrees():
    """bf16 weights + cache vs fp32 on one model: bounded logit error, and the argmax agrees
    wherever fp32's top-2 margin exceeds twice that error (it cannot flip there)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=97, block_size=64, n_layer=2, n_head=4, n_embd=64)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        x = torch.randint(0, 97, (4, 64))
        ref = model(x)
        cache = model.to(torch.bfloat16).new_cache(4)
        assert cache.k.dtype == torch.bfloat16
        low = torch.cat([model(x[:, :32], cache=cache)] +
                        [model(x[:, t:t + 1], cache=cache) for t in range(32, 64)], 1).float()
    err = (low - ref).abs().max().item()
    assert err < 0.05, err  # logits span about +-1.5 here
    top2 = ref.topk(2, dim=-1).values
    sure = (top2[..., 0] - top2[..., 1]) > 2 * err
    assert torch.equal(low.argmax(-1)[sure], ref.argmax(-1)[sure])
    assert (low.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9


def killed_as_it_writes(to: str, argv: list[str]) -> None:
    """In a forked process: ``scratchgpt ARGV``, an export ``--to`` ``to``, killed with
    SIGKILL as it writes the weights, so that nothing of its own clean-up runs."""
    def kill_9(*args: object, **kwargs: object) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    if to == "hf":
        import safetensors.torch

        safetensors.torch.save_file = kill_9
    else:
        import gguf

        gguf.GGUFWriter.write_tensors_to_file = kill_9
    main(argv)


@pytest.mark.parametrize("to", ["hf", "gguf"])
def test_an_export_killed_outright_is_cleared_by_the_next_one(run_dir, tmp_path, capsys, to):
    """An export killed with kill -9 as it writes leaves its temporary (a --to hf one, in
    --out, made --out 'not empty (pass --overwrite ...)' for good) and its lock file; the
    next export to the same place removes the temporary and takes the lock over (the system
    dropped the dead process's lock), then removes it. The export is killed for real, so the
    temporary and the lock are the ones it names, not ones a test spelt."""
    from tests.reliability.procs import start_call

    if to == "gguf":
        optional("gguf")
    out = tmp_path / "exports" / ("hf" if to == "hf" else "m.gguf")
    argv = ["convert", "--to", to, "--checkpoint", str(run_dir), "--out", str(out)]
    killed = start_call(killed_as_it_writes, (to, argv), tmp_path / "killed.log")
    assert killed.wait() == -signal.SIGKILL, killed.output()
    folder = out if to == "hf" else out.parent  # where the temporary is
    left = sorted(p.name for p in folder.iterdir())
    assert len(left) == 2 and left[0].endswith(".tmp") and left[1].endswith(".lock"), left
    assert (folder / left[1]).read_text() == str(killed.pid)  # a lock of a dead process
    run(capsys, argv)
    assert out.exists() and not [p for p in folder.iterdir()
                                 if p.name.endswith((".tmp", ".lock"))]


def killed_as_it_moves(argv: list[str]) -> None:
    """In a forked process: ``scratchgpt ARGV``, a --to hf export, killed with SIGKILL as the
    second of its files moves from the temporary folder into --out."""
    rename, moved = os.replace, []

    def kill_9_at_the_second(src: str | Path, dst: str | Path) -> None:
        if Path(src).parent.name.startswith(".export."):
            moved.append(dst)
            if len(moved) == 2:
                os.kill(os.getpid(), signal.SIGKILL)
        rename(src, dst)

    os.replace = kill_9_at_the_second
    main(argv)


def test_an_export_killed_as_its_files_move_is_refused_until_the_next_one(run_dir, tmp_path,
                                                                         capsys):
    """A kill -9 between two of the renames that move an export into --out left one file of
    the new export beside the rest of the earlier one, and nothing said so: a new config.json
    beside old weights of the same shape loaded as a model that never existed. The marker the
    export leaves makes every reader refuse it in one line, naming the dead process, until
    the next export (--overwrite: the directory holds a model, if not a whole one) replaces it
    whole and removes the marker. (tests/checkpoints/test_hf.py kills an export before each
    of its disk changes.)"""
    from tests.reliability.procs import start_call

    hf = tmp_path / "hf"
    argv = ["convert", "--to", "hf", "--checkpoint", str(run_dir), "--out", str(hf)]
    run(capsys, argv)
    killed = start_call(killed_as_it_moves, ([*argv, "--overwrite"],), tmp_path / "killed.log")
    assert killed.wait() == -signal.SIGKILL, killed.output()
    cut_short = (f"{hf}: an export into it was cut short (process {killed.pid} died while "
                 "moving the files in: they may mix two models); export again")
    assert error_of(capsys, ["sample", "--checkpoint", str(hf), "--prompt", "ab"]) == \
        f"scratchgpt sample: error: {cut_short}"
    assert error_of(capsys, ["convert", "--from", "hf", str(hf), "--out",
                             str(tmp_path / "back")]) == f"scratchgpt convert: error: {cut_short}"
    assert not (tmp_path / "back").exists()
    assert "already holds a Hugging Face model (pass --overwrite" in error_of(capsys, argv)
    run(capsys, [*argv, "--overwrite"])
    assert not list(hf.glob(".*.tmp"))  # neither the marker nor the temporary folder
    assert greedy(capsys, hf, "ab") == greedy(capsys, run_dir, "ab")


def fail_as_it_writes(monkeypatch, to: str, also: Path | None = None) -> None:
    """Make an export ``--to`` ``to`` fail with a full disk as it writes the weights, having
    written part of them; first ``also`` is written, as another process would."""
    def full_disk(*args: object, **kwargs: object) -> None:
        if also is not None:
            also.write_text("another process's file")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    if to == "hf":
        import safetensors.torch

        monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    else:
        monkeypatch.setattr(optional("gguf").GGUFWriter, "write_tensors_to_file", full_disk)


@pytest.mark.parametrize("to", ["hf", "gguf"])
def test_a_failed_export_removes_the_empty_folders_it_made_and_nothing_else(
        run_dir, tmp_path, capsys, monkeypatch, to):
    """An export that fails part-way removes the folders it made for --out, each only while
    empty: a --to hf export removed the --out folder it had made with all it held, a file
    another process had written there since included."""
    out = tmp_path / "exports" / "new" / ("hf" if to == "hf" else "m.gguf")
    argv = ["convert", "--to", to, "--checkpoint", str(run_dir), "--out", str(out)]
    fail_as_it_writes(monkeypatch, to)
    assert "No space left on device" in error_of(capsys, argv)
    assert sorted(p.name for p in tmp_path.iterdir()) == [run_dir.name]
    folder = out if to == "hf" else out.parent  # the innermost folder the export made
    fail_as_it_writes(monkeypatch, to, also=folder / "notes.txt")
    assert "No space left on device" in error_of(capsys, argv)
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]  # and no temporary


def test_a_live_exports_temporary_stays_and_counts_as_content(run_dir, tmp_path, capsys):
    """The next export never removes the temporary of one still running (pid 1 always
    runs), and a --out holding it is not empty."""
    live = tmp_path / "hf" / ".export.1.running.tmp"
    live.mkdir(parents=True)
    argv = ["convert", "--to", "hf", "--checkpoint", str(run_dir), "--out", str(live.parent)]
    assert "already holds files (pass --overwrite" in error_of(capsys, argv)
    run(capsys, [*argv, "--overwrite"])
    assert live.is_dir() and (live.parent / "model.safetensors").is_file()


def aged(path: Path, days: float) -> Path:
    """``path``, and all a folder holds, last modified ``days`` ago."""
    when = time.time() - days * 86400
    for p in (*path.rglob("*"), path):  # (the folder last: its content's change touches it)
        os.utime(p, (when, when))
    return path


def test_a_temporary_from_before_the_process_id_is_cleared_once_a_day_old(run_dir, tmp_path,
                                                                          capsys):
    """An export killed before the temporary's name held the process id left
    '.export.X.tmp' (tempfile.mkdtemp's name) in --out: 'not empty (pass --overwrite ...)'
    for good, and never removed. Untouched for a day, it is an export's that died (a writer
    changes its temporary as it writes): the next export removes it. A younger one stays,
    and so does an old one of another name."""
    def left(folder: Path, days: float) -> Path:
        (folder / "model.safetensors").parent.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"half")
        return aged(folder, days)

    dead = left(tmp_path / "hf" / ".export.k1lled_x.tmp", 2)
    run(capsys, ["convert", "--to", "hf", "--checkpoint", str(run_dir), "--out",
                 str(dead.parent)])
    assert not dead.exists() and (dead.parent / "model.safetensors").is_file()
    kept = (left(tmp_path / "hf2" / ".export.stll_wrt.tmp", 0.9),
            left(tmp_path / "hf2" / ".export.not-mkdtemps.tmp", 2))
    run(capsys, ["convert", "--to", "hf", "--checkpoint", str(run_dir), "--out",
                 str(tmp_path / "hf2"), "--overwrite"])
    assert all((k / "model.safetensors").is_file() for k in kept)


@pytest.mark.parametrize("stop,code", [(KeyboardInterrupt, 130), ("Terminated", 143)])
def test_ctrl_c_or_sigterm_during_an_export_leaves_nothing(run_dir, tmp_path, capsys,
                                                           monkeypatch, stop, code):
    """Ctrl-C, or SIGTERM (raised by the CLI as Terminated), while the weights are written:
    neither the temporary folder nor the --out folder the export made stays."""
    import safetensors.torch

    from scratchgpt.errors import Terminated

    stop = Terminated if stop == "Terminated" else stop
    written = []

    def cut_short(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"\0" * 4096)
        written.append(Path(filename))
        raise stop

    monkeypatch.setattr(safetensors.torch, "save_file", cut_short)
    hf = tmp_path / "exports" / "hf"
    assert main(["convert", "--to", "hf", "--checkpoint", str(run_dir), "--out", str(hf)]) == code
    assert written and written[0].parent.name.startswith(".export.")  # stopped mid-write
    assert not (tmp_path / "exports").exists()


def test_ctrl_c_while_the_files_move_into_place_waits_for_the_last(run_dir, tmp_path, capsys,
                                                                  monkeypatch):
    """A Ctrl-C between two of the renames that move the export into --out left the
    temporary folder with the rest of the files, and --out half an export (over --overwrite,
    half of neither). The renames finish first, then the command stops (exit 130)."""
    from scratchgpt.checkpoints.hf import is_hf_dir

    hf = tmp_path / "hf"
    run(capsys, ["convert", "--to", "hf", "--checkpoint", str(run_dir), "--out", str(hf)])
    whole = sorted(p.name for p in hf.iterdir())
    rename = os.replace
    moved = []

    def interrupted(src, dst):
        if Path(src).parent.name.startswith(".export.") and not moved:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, as the first file moves
        moved.append(dst)
        rename(src, dst)

    monkeypatch.setattr(os, "replace", interrupted)
    assert main(["convert", "--to", "hf", "--checkpoint", str(run_dir), "--out", str(hf),
                 "--overwrite"]) == 130
    assert len(moved) == len(whole) and is_hf_dir(hf)  # every file moved, the export whole
    assert sorted(p.name for p in hf.iterdir()) == whole  # and no temporary folder


NOUN = {"hf": "a directory", "gguf": "one file"}  # what each target writes, in its refusals


def out_for(to: str, folder: Path) -> Path:
    """An --out for an export ``--to`` ``to`` in ``folder``."""
    return folder / ("hf" if to == "hf" else "m.gguf")


@pytest.fixture()
def read_only(tmp_path, monkeypatch) -> Path:
    """A folder nothing can be made in: chmod 555, and the system's refusal stubbed (tests
    may run as root, whom chmod does not stop) for every file or folder made in it."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    real_open, real_mkdir = os.open, os.mkdir

    def refuse(path) -> None:
        if Path(os.path.abspath(path)).parent == folder:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    def opened(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            refuse(path)
        return real_open(path, flags, *args, **kwargs)

    def made(path, *args, **kwargs):
        refuse(path)
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", opened)
    monkeypatch.setattr(os, "mkdir", made)
    folder.chmod(0o555)
    yield folder
    folder.chmod(0o755)


@pytest.mark.parametrize("to", ["hf", "gguf"])
def test_an_out_in_a_read_only_folder_is_named_alike_by_both_targets(run_dir, read_only, capsys,
                                                                     to):
    """--to hf said 'Permission denied: OUT' (the mkdir's words), --to gguf named its hidden
    temporary file ('Permission denied: .m.gguf.PID.X.tmp'), each once the model was read.
    Both now say 'cannot write OUT', found by taking the export's lock, before reading the
    model; nothing is left."""
    out = out_for(to, read_only)
    msg = error_of(capsys, ["convert", "--to", to, "--checkpoint", str(run_dir), "--out",
                            str(out)])
    assert msg.endswith(f"error: cannot write {out}: Permission denied"), msg
    assert list(read_only.iterdir()) == []


@pytest.mark.parametrize("to", ["hf", "gguf"])
def test_an_out_below_a_file_is_refused_alike_by_both_targets(run_dir, tmp_path, capsys, to):
    """Both said 'cannot write under F: it is a file, not a folder', the mkdir's refusal,
    once the model was read; now in --out's words, before anything is read."""
    plain = tmp_path / "plain"
    plain.write_text("mine")
    out = out_for(to, plain)
    msg = error_of(capsys, ["convert", "--to", to, "--checkpoint", str(run_dir), "--out",
                            str(out)])
    assert msg.endswith(f"error: --out {out} is below {plain}, a file, not a folder; name "
                        f"{NOUN[to]} for the export (nothing was written)"), msg
    assert plain.read_text() == "mine"


@pytest.mark.parametrize("to", ["hf", "gguf"])
def test_an_out_that_holds_something_is_refused_alike_by_both_targets(run_dir, tmp_path,
                                                                      capsys, to):
    """--to hf said 'OUT is not empty (pass --overwrite to write into it)', --to gguf 'OUT
    exists (pass --overwrite to replace it)': one sentence now says what --out holds, an
    earlier export by its kind."""
    first = out_for(to, tmp_path / "first")
    run(capsys, ["convert", "--to", to, "--checkpoint", str(run_dir), "--out", str(first)])
    other = out_for(to, tmp_path / "other")
    if to == "hf":
        other.mkdir(parents=True)
        (other / "notes.txt").write_text("mine")
    else:
        other.parent.mkdir()
        other.write_text("mine")
    kinds = {"hf": ("a Hugging Face model", "files"), "gguf": ("a GGUF file", "a file")}[to]
    for out, what in zip((first, other), kinds, strict=True):
        before = snapshot(out.parent)
        msg = error_of(capsys, ["convert", "--to", to, "--checkpoint", str(run_dir), "--out",
                                str(out)])
        assert msg.endswith(f"error: --out {out} already holds {what} (pass --overwrite to "
                            "write the export there; nothing was written)"), msg
        assert snapshot(out.parent) == before


def hold_lock(path: Path) -> int:
    """Take the lock ``path`` as a running export holds it (its id written in it); returns
    the descriptor, whose closing lets it go."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, b"4242")
    return fd


@pytest.mark.parametrize("to", ["hf", "gguf"])
def test_a_second_export_into_the_same_out_is_refused_naming_the_first(run_dir, tmp_path,
                                                                       capsys, to):
    """Two exports into one --out ran at once, each writing over the other's files (with
    --overwrite, or both having seen it empty). The second is refused, naming the process
    that holds the lock (a file in the folder the export writes in), and writes nothing;
    once that export ends, it runs."""
    out = out_for(to, tmp_path / "exports")
    lock = out / ".export.lock" if to == "hf" else out.with_name(".m.gguf.lock")
    lock.parent.mkdir(parents=True)
    fd = hold_lock(lock)
    argv = ["convert", "--to", to, "--checkpoint", str(run_dir), "--out", str(out),
            "--overwrite"]
    try:
        msg = error_of(capsys, argv)
        assert msg.endswith(f"error: --out {out} is being written by another export (process "
                            "4242); wait for it to end, or stop it (nothing was written)"), msg
        assert sorted(p.name for p in lock.parent.iterdir()) == [lock.name]
    finally:
        os.close(fd)
    run(capsys, argv)
    assert out.exists() and not lock.exists()


@pytest.mark.parametrize("to, name", [("hf", "Hugging Face GPT-2"),
                                      ("gguf", "GGUF (llama.cpp's gpt2)")])
def test_an_option_gpt2_lacks_is_refused_alike_by_both_targets(tmp_path, capsys, to, name):
    """A RoPE model was 'cannot export to Hugging Face GPT-2: ...' and 'cannot be exported to
    GGUF (llama.cpp's gpt2): ...': the same refusal, in one form, and nothing written."""
    run_dir = tmp_path / "rope"
    CharTokenizer(CHARS).save(run_dir)
    model = GPT(GPTConfig(vocab_size=len(CHARS), block_size=16, n_layer=1, n_head=2, n_embd=16,
                          pos_encoding="rope"))
    save_checkpoint(run_dir / "best.pt", Checkpoint("gpt", model.config, model.state_dict()))
    out = out_for(to, tmp_path / "exports")
    msg = error_of(capsys, ["convert", "--to", to, "--checkpoint", str(run_dir), "--out",
                            str(out)])
    assert msg.endswith(f"error: cannot export to {name}: --pos-encoding rope: GPT-2 learns a "
                        "table of position embeddings"), msg
    assert not out.parent.exists()


def test_an_error_of_the_export_itself_is_not_taken_for_an_unwritable_out(run_dir, tmp_path,
                                                                         capsys, monkeypatch):
    """Only the lock's own refusal is 'cannot write OUT': a system error of the work after it
    (here reading the model, refused for the folder --out is in) keeps its own words and
    path, where it was said to be --out that could not be written."""
    import scratchgpt.checkpoints

    out = tmp_path / "exports" / "m.gguf"

    def refused(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(out.parent))

    monkeypatch.setattr(scratchgpt.checkpoints, "load_model", refused)
    msg = error_of(capsys, ["convert", "--to", "gguf", "--checkpoint", str(run_dir), "--out",
                            str(out)])
    assert msg.endswith(f"error: Permission denied: {out.parent}"), msg
    assert not out.parent.exists()
