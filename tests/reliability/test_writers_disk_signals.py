"""Two writers on one run, a full disk, SIGTERM, and a Hugging Face file whose stored head
differs from its tied embedding: each keeps what the user had and answers in one line.

The full disk is a per-process file size limit (``RLIMIT_FSIZE``): a write past it fails with
``EFBIG`` as a write to a full disk fails with ``ENOSPC``, through the same code.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import sys
import time

import pytest
import torch

from scratchgpt.checkpoints import load_checkpoint
from scratchgpt.cli import main
from tests.corpus import play_text
from tests.reliability.conftest import TINY, snapshot
from tests.reliability.procs import (
    file_version,
    scratchgpt_process,
    start_call,
    start_cli,
    wait_for,
    wait_until_torch_loads,
)
from tests.reliability.test_kill9 import check_run
from tests.requires import optional

LONG = ["--max-iters", "1000000", "--eval-interval", "1", "--log-interval", "1"]


@pytest.fixture(scope="module")
def trained_run(tiny_data, tmp_path_factory):
    """A finished run of 2 steps, trained once: the tests change copies of it."""
    out = tmp_path_factory.mktemp("trained") / "run"
    assert main(["train", "--dataset", str(tiny_data), "--out", str(out), "--max-iters", "2",
                 "--eval-interval", "1", *TINY]) == 0
    return out


@pytest.fixture
def run(trained_run, tmp_path):
    """A copy of ``trained_run`` of the test's own (it records no path of its folder)."""
    return shutil.copytree(trained_run, tmp_path / "run")


def test_a_second_writer_is_refused_while_a_run_trains(run, tiny_data, tmp_path, capsys,
                                                       figures):
    before = file_version(run / "last.pt")
    proc = start_cli(["train", "--out", run, "--resume", *LONG], tmp_path / "first.log")
    wait_for(lambda: file_version(run / "last.pt") not in (None, before), proc=proc,
             what="the first writer's checkpoint")
    second = [["train", "--out", str(run), "--resume"],
              ["train", "--dataset", str(tiny_data), "--out", str(run), "--overwrite", *TINY],
              ["train", "--dataset", str(tiny_data), "--out", str(run), *TINY]]
    for argv in second:
        capsys.readouterr()
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"in use by process {proc.pid}" in err, err
    proc.kill(signal.SIGINT)
    assert proc.wait() == 130
    check_run(run)
    figures.count("concurrent_writers_refused", len(second))


def test_a_damaged_metrics_csv_does_not_stop_resume(run):
    with open(run / "metrics.csv", "ab") as f:
        f.write(b"\0" * 64 + b"half,a,row")
    assert main(["train", "--out", str(run), "--resume", "--max-iters", "3"]) == 0
    assert load_checkpoint(run / "last.pt").state.step == 3


def with_file_limit(limit: int, argv: list[str]) -> None:
    """In a forked process: ``scratchgpt ARGV`` where no file may grow past ``limit`` bytes."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    code = main(argv)
    sys.stderr.flush()
    os._exit(code)


def _full_disk(argv, tmp_path, name: str) -> str:
    """Run ``argv`` with the disk 'full' past 4 KB a file; returns its one-line error."""
    proc = start_call(with_file_limit, (4096, [str(a) for a in argv]), tmp_path / f"{name}.log")
    assert proc.wait() == 2, proc.output()
    lines = proc.output().strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0], proc.output()
    return lines[0]


def test_a_full_disk_fails_in_one_line_and_loses_nothing(run, tiny_data, tmp_path, figures):
    old = snapshot(run)
    # resume: the new last.pt cannot be written; the old run stays as it was
    # (its schedule stretched to the new --max-iters: no note of updates past its end)
    _full_disk(["train", "--out", run, "--resume", "--max-iters", "4", "--lr-decay-iters", "4",
                "--no-progress"],
               tmp_path, "resume")
    assert not list(run.glob(".*.tmp")) and not list(run.glob("*.tmp"))
    kept = ("last.pt", "best.pt", "tokenizer.json")  # (config.json records the new settings)
    assert {k: snapshot(run)[k] for k in kept} == {k: old[k] for k in kept}
    # a fresh run into a new directory, and an overwrite of the old run
    fresh = tmp_path / "fresh"
    _full_disk(["train", "--dataset", tiny_data, "--out", fresh, "--max-iters", "2", *TINY],
               tmp_path, "fresh")
    assert not (fresh / "last.pt").exists() and not list(fresh.glob(".*tmp*"))
    old = snapshot(run)
    _full_disk(["train", "--dataset", tiny_data, "--out", run, "--overwrite", "--max-iters",
                "2", *TINY], tmp_path, "overwrite")
    assert snapshot(run) == old  # the old run came back whole
    # prepare: an existing dataset is kept, a new one is not left half written
    text = tmp_path / "text.txt"
    text.write_text(play_text(50_000))
    data = tmp_path / "data"
    assert main(["prepare", "--data", str(text), "--out", str(data)]) == 0
    old_data = snapshot(data)
    _full_disk(["prepare", "--data", text, "--out", data, "--overwrite"], tmp_path, "prep-over")
    assert snapshot(data) == old_data
    _full_disk(["prepare", "--data", text, "--out", tmp_path / "new-data"], tmp_path, "prep")
    assert not (tmp_path / "new-data").exists() or not any((tmp_path / "new-data").iterdir())
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
    # and with room again, the run resumes
    assert main(["train", "--out", str(run), "--resume", "--max-iters", "4"]) == 0
    figures.count("full_disk_commands_failed_cleanly", 5)


def test_a_full_disk_fails_an_export_in_one_line_and_keeps_the_earlier_one(run, tmp_path):
    """convert --to hf --overwrite cleared the earlier export before writing the new one, so a
    full disk lost it, with safetensors' traceback; a new export left an empty folder."""
    hf = tmp_path / "hf"
    assert main(["convert", "--to", "hf", "--checkpoint", str(run), "--out", str(hf)]) == 0
    old = snapshot(hf)
    msg = _full_disk(["convert", "--to", "hf", "--checkpoint", run, "--out", hf,
                      "--overwrite"], tmp_path, "hf-over")
    assert f"cannot write {hf}" in msg and "(the previous export is intact)" in msg, msg
    assert snapshot(hf) == old  # and no temporary folder beside it
    _full_disk(["convert", "--to", "hf", "--checkpoint", run, "--out", tmp_path / "new-hf"],
               tmp_path, "hf-new")
    assert not (tmp_path / "new-hf").exists()


def test_a_full_disk_fails_a_gguf_export_in_one_line_naming_the_file(run, tmp_path):
    """numpy's short write, 'OSError: 3072 requested and 536 written', was the whole line."""
    optional("gguf")
    out = tmp_path / "m.gguf"
    assert main(["convert", "--to", "gguf", "--checkpoint", str(run), "--out", str(out)]) == 0
    old = out.read_bytes()
    msg = _full_disk(["convert", "--to", "gguf", "--checkpoint", run, "--out", out,
                      "--overwrite"], tmp_path, "gguf-over")
    assert f"cannot write {out}: only part of it was written" in msg, msg
    assert "is the disk full? (the previous file is intact)" in msg, msg
    assert out.read_bytes() == old
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.parametrize("nproc", [1, 2])
def test_sigterm_saves_last_pt_and_exits_143(run, tmp_path, nproc, figures):
    before = file_version(run / "last.pt")
    extra = ["--nproc", "2"] if nproc == 2 else []
    proc = start_cli(["train", "--out", run, "--resume", *LONG, *extra], tmp_path / "t.log")
    wait_for(lambda: file_version(run / "last.pt") not in (None, before), proc=proc,
             timeout=180, what="a checkpoint")
    proc.kill(signal.SIGTERM)
    assert proc.wait() == 143, proc.output()
    assert "SIGTERM" in proc.output()
    last, _ = check_run(run)
    assert last.state.step > 2
    assert main(["train", "--out", str(run), "--resume", "--max-iters",
                 str(last.state.step + 1)]) == 0
    figures.count("sigterm_saved_and_resumed")


def test_a_stored_head_that_differs_from_the_tied_embedding_is_kept(tmp_path):
    """transformers keeps a stored ``lm_head.weight`` even with ``tie_word_embeddings``;
    the import must give the same logits."""
    transformers = pytest.importorskip("transformers")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    from scratchgpt.checkpoints.hf import load_hf

    cfg = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=40, n_positions=16,
                                  tie_word_embeddings=True)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path)
    weights = safetensors_torch.load_file(tmp_path / "model.safetensors")
    weights["lm_head.weight"] = torch.randn(40, 16)
    safetensors_torch.save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    ref = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    ours, _ = load_hf(tmp_path)
    ids = torch.randint(0, 40, (1, 12))
    with torch.no_grad():
        expected = ref(ids).logits
        got = ours(ids)
    got = got[0] if isinstance(got, tuple) else got
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(ref.lm_head.weight, ref.transformer.wte.weight)


@pytest.mark.parametrize("delay", [0.05, 0.3, 0.5, 0.6, 0.8, 1.5])
def test_ctrl_c_at_start_up_is_one_line_and_exit_130(tiny_data, tmp_path, delay):
    """Ctrl-C while Python imports torch, while the run is set up, or while it trains.

    ``delay`` counts from the process's start, but never sends the signal before torch's
    import has begun: on a busy machine 50 ms can end inside the interpreter's own start-up.
    """
    start = time.monotonic()
    proc = scratchgpt_process(["train", "--dataset", tiny_data, "--out", tmp_path / "run",
                               "--max-iters", "1000000", *TINY])
    wait_until_torch_loads(proc)
    time.sleep(max(0.0, delay - (time.monotonic() - start)))
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(("scratchgpt", "SIGINT", "interrupted")), err


def test_ctrl_c_while_the_trainer_is_set_up_is_never_swallowed(tiny_data, tmp_path, monkeypatch):
    """Setting a run up imports parts of torch lazily, and an import can swallow the
    KeyboardInterrupt raised inside it (leaving a run that trains on as if never
    interrupted). Here the set-up receives Ctrl-C inside code that swallows everything: the
    command still ends interrupted, with exit code 130, before training a step."""
    from scratchgpt.training import job

    real = job.Trainer

    def set_up_swallowing_ctrl_c(*args, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)  # the handler runs here, inside the try
        except BaseException:  # what a swallowing import does  # noqa: BLE001
            pass
        return real(*args, **kwargs)

    monkeypatch.setattr(job, "Trainer", set_up_swallowing_ctrl_c)
    code = main(["train", "--dataset", str(tiny_data), "--out", str(tmp_path / "run"),
                 "--max-iters", "3", *TINY])
    assert code == 130
    assert not (tmp_path / "run" / "last.pt").exists()


def test_a_ctrl_c_caught_inside_exec_does_not_override_the_exit_code():
    """CPython marks a KeyboardInterrupt that escapes ``exec`` of a string as unhandled even
    when it is caught, and at exit kills the process with SIGINT instead of exiting with the
    command's code; :func:`forget_interrupts_caught_in_exec` clears the mark. The mark is
    visible as a C variable on CPython 3.11 only (later versions keep it in a struct)."""
    import ctypes

    from scratchgpt.signals import forget_interrupts_caught_in_exec

    try:
        mark = ctypes.c_int.in_dll(ctypes.pythonapi, "_Py_UnhandledKeyboardInterrupt")
    except (ValueError, AttributeError):
        pytest.skip("this Python does not export the mark")
    try:
        exec("raise KeyboardInterrupt")
    except KeyboardInterrupt:
        pass
    assert mark.value == 1
    forget_interrupts_caught_in_exec()
    assert mark.value == 0


def test_a_loss_that_becomes_nan_stops_the_run_and_keeps_the_finite_checkpoints(
        run, capsys, figures):
    """A learning rate in range but far too high drives the weights to infinity: the run
    stops in one line naming the step; last.pt and best.pt keep finite weights."""
    capsys.readouterr()
    # (the schedule over the 200 updates: the run's own ended at its max-iters, at --min-lr)
    code = main(["train", "--out", str(run), "--resume", "--max-iters", "200", "--no-progress",
                 "--learning-rate", "1e30", "--min-lr", "0", "--eval-interval", "1",
                 "--lr-decay-iters", "200"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "step" in err and len(err.strip().splitlines()) == 1, err
    check_run(run)
    for name in ("last.pt", "best.pt"):
        weights = load_checkpoint(run / name).model.values()
        assert all(bool(torch.isfinite(w).all()) for w in weights), name
    figures.count("nan_runs_stopped_with_finite_checkpoints")


def test_a_new_run_that_diverges_before_its_first_checkpoint_claims_no_last_pt(tiny_data,
                                                                              tmp_path, capsys):
    """It was told "last.pt keeps the last finite model", but a new run's files are removed
    when it fails before its first checkpoint: there was no last.pt to look for."""
    out = tmp_path / "diverged"
    capsys.readouterr()
    code = main(["train", "--dataset", str(tiny_data), "--out", str(out), "--max-iters", "20",
                 "--learning-rate", "1e30", "--min-lr", "0", "--grad-clip", "0",
                 "--eval-interval", "100", *TINY])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "stopped (no checkpoint had been written yet: nothing of this run is kept)" in err, err
    assert "last.pt" not in err and not out.exists()


def test_an_overwrite_stands_once_it_has_written_a_checkpoint(run, tiny_data, monkeypatch):
    """A completed --overwrite leaves no trace of the old run; one that fails after its first
    checkpoint keeps the new run's checkpoints (it does not bring the old run back over them)."""
    from scratchgpt.checkpoints.rundir import RunDir

    old_id = load_checkpoint(run / "last.pt").run_id
    assert main(["train", "--dataset", str(tiny_data), "--out", str(run), "--overwrite",
                 "--max-iters", "2", "--eval-interval", "1", *TINY]) == 0
    new_id = load_checkpoint(run / "last.pt").run_id
    assert new_id != old_id and not (run / ".replaced").exists()

    save = RunDir.save

    def save_then_crash(self, checkpoint, best):
        save(self, checkpoint, best)
        raise RuntimeError("crashed after the first checkpoint")

    monkeypatch.setattr(RunDir, "save", save_then_crash)
    with pytest.raises(RuntimeError):
        main(["train", "--dataset", str(tiny_data), "--out", str(run), "--overwrite",
              "--max-iters", "20", "--eval-interval", "1", *TINY])
    last, _ = check_run(run)
    assert last.run_id not in (old_id, new_id) and last.state.step == 1
    assert not (run / ".replaced").exists()


def test_resume_without_config_json_uses_the_runs_own_dataset(run, tiny_data):
    """config.json is for people; --resume reads the run's dataset from last.pt, never the
    default corpus."""
    (run / "config.json").unlink()
    assert main(["train", "--out", str(run), "--resume", "--max-iters", "3"]) == 0
    last = load_checkpoint(run / "last.pt")
    assert last.state.step == 3 and last.data["dataset"] == str(tiny_data)


def test_a_seq2seq_overwrite_that_fails_before_its_first_checkpoint_restores_the_old_run(
        tmp_path, monkeypatch):
    from scratchgpt.checkpoints.rundir import RunDir
    from tests.reliability.test_bad_inputs import S2S_TINY

    out = tmp_path / "s2s"
    assert main(["seq2seq", "train", "--task", "dates", "--out", str(out), *S2S_TINY]) == 0
    old = snapshot(out)

    def crash(self, checkpoint, best):
        raise RuntimeError("crashed before the first checkpoint")

    monkeypatch.setattr(RunDir, "save", crash)
    with pytest.raises(RuntimeError):
        main(["seq2seq", "train", "--task", "dates", "--out", str(out), "--overwrite",
              *S2S_TINY])
    assert snapshot(out) == old
