"""Data-parallel training through torch.distributed, on the CPU (gloo), via the command line.

Two processes with batch B each take the same steps as one process with batch 2B: they draw
the same global batch, each keeps its half, and DDP averages the two halves' gradients.
"""

from __future__ import annotations

import json

import pytest
import torch

from scratchgpt.cli import main
from scratchgpt.wording import plural

ARGS = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
        "--eval-iters", "2", "--eval-interval", "10", "--no-progress", "--dtype", "fp32",
        "--threads", "1", "--warmup-iters", "2"]


def weights(run) -> dict[str, torch.Tensor]:
    return torch.load(run / "last.pt", weights_only=True)["model"]


def weights_at_init(run) -> dict[str, torch.Tensor]:
    from scratchgpt.checkpoints import load_checkpoint
    from scratchgpt.models import build_model

    torch.manual_seed(1337)  # the trainer's default seed
    return build_model(load_checkpoint(run / "last.pt").model_config).state_dict()


@pytest.mark.parametrize("optimizer,accum,windows", [("adamw", 1, "random"),
                                                     ("muon", 1, "random"),
                                                     ("adamw", 2, "epoch")])
def test_two_processes_equal_one_with_the_whole_batch(small_dataset, tmp_path, optimizer,
                                                       accum, windows):
    common = ["--dataset", str(small_dataset), "--max-iters", "20", "--optimizer", optimizer,
              "--dropout", "0", "--grad-accum", str(accum), "--windows", windows, *ARGS]
    assert main(["train", *common, "--out", str(tmp_path / "one"), "--batch-size", "8"]) == 0
    assert main(["train", *common, "--out", str(tmp_path / "two"), "--batch-size", "4",
                 "--nproc", "2"]) == 0
    a, b = weights(tmp_path / "one"), weights(tmp_path / "two")
    assert a.keys() == b.keys()
    # Equal up to the order of float additions; Muon's bf16 Newton-Schulz step rounds those
    # differences to bf16's resolution, so it gets a looser bound. Training moved every
    # matrix by far more than either bound.
    tol = 2e-5 if optimizer == "adamw" else 3e-4
    key = "transformer.h.0.mlp.c_fc.weight"
    assert (a[key] - weights_at_init(tmp_path / "one")[key]).abs().max() > 10 * tol
    for k in a:
        assert torch.allclose(a[k], b[k], atol=tol), (k, (a[k] - b[k]).abs().max())
    ck = torch.load(tmp_path / "two" / "last.pt", weights_only=True)["state"]
    config = json.loads((tmp_path / "two" / "config.json").read_text())
    assert config["world_size"] == 2 and ck["tokens"] == 20 * 8 * 16 * accum
    assert (tmp_path / "two" / "loss.png").is_file()


def test_resume_with_two_processes_is_exact(small_dataset, tmp_path):
    common = ["--dataset", str(small_dataset), "--batch-size", "4", "--nproc", "2",
              "--lr-decay-iters", "20", "--dropout", "0.1", *ARGS]
    assert main(["train", *common, "--max-iters", "20", "--out", str(tmp_path / "a")]) == 0
    assert main(["train", *common, "--max-iters", "10", "--out", str(tmp_path / "b")]) == 0
    assert main(["train", *common, "--max-iters", "20", "--out", str(tmp_path / "b"),
                 "--resume"]) == 0
    a, b = weights(tmp_path / "a"), weights(tmp_path / "b")
    for k in a:  # dropout masks included: each process's RNG is saved and restored
        assert torch.allclose(a[k], b[k], atol=1e-6), k


def test_time_budget_ends_every_process_at_the_same_step(small_dataset, tmp_path, capsys):
    # rank 0's clock decides for all; a rank that stopped alone would hang the other
    assert main(["train", "--dataset", str(small_dataset), "--out", str(tmp_path / "r"),
                 "--batch-size", "4", "--nproc", "2", "--time-budget", "3s", *ARGS]) == 0
    state = torch.load(tmp_path / "r" / "last.pt", weights_only=True)["state"]
    assert state["step"] > 0 and 3.0 <= state["elapsed_s"] < 10.0
    assert f"done: {plural(state['step'], 'step')} in" in capsys.readouterr().out


def test_bad_input_fails_before_processes_start(small_dataset, tmp_path, capsys):
    code = main(["train", "--dataset", str(small_dataset), "--out", str(tmp_path / "r"),
                 "--nproc", "2", "--n-embd", "30", "--n-head", "4", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--n-head (4)" in err


def test_ctrl_c_stops_every_process_and_saves(small_dataset, tmp_path):
    """Ctrl-C reaches the whole process group (as from a terminal): every rank stops after the
    same step, rank 0 saves last.pt, and the command exits 130 with a one-line message."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "scratchgpt", "train", "--dataset", str(small_dataset),
           "--out", str(out), "--max-iters", "1000000", "--batch-size", "4", *ARGS,
           "--dropout", "0", "--nproc", "2"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=env)
    deadline = time.monotonic() + 120
    while not (out / "last.pt").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "stopped at step" in stdout and "Traceback" not in stderr, stderr
    state = torch.load(out / "last.pt", weights_only=True)["state"]
    assert state["step"] >= 10 and len(state["rng"]["torch_per_rank"]) == 2


def _children(pid: int, named: str) -> list[int]:
    """The processes whose parent is ``pid`` and whose command line holds ``named``."""
    from pathlib import Path

    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, ValueError):  # (not a process, or one that has just ended)
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and named in cmdline:
            found.append(int(entry.name))
    return found


def _interrupted_when(cmd: list[str], ready, env: dict) -> tuple[int, str, str]:
    """Run ``cmd`` in a process group of its own; once ``ready(pid)``, Ctrl-C it (SIGINT to
    the group, as from a terminal): (exit code, stdout, stderr). Killed, and failed, if it
    goes on for two minutes after."""
    import os
    import signal
    import subprocess
    import time

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + 240
        while not ready(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None, proc.communicate()
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:  # (the Ctrl-C was lost: the run trains on)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc.returncode, stdout, stderr


def test_ctrl_c_while_the_processes_start_ends_the_run_in_one_line(small_dataset, tmp_path):
    """--nproc's launcher ignored Ctrl-C while its processes ran, and so did the fork server
    that starts them and each process until it set its own handlers: a Ctrl-C in the seconds
    they took to start was lost, and the run trained on. Sent as soon as the fork server
    exists, it now ends every process before its first step: one line, exit code 130, and no
    run directory."""
    import os
    import sys

    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "scratchgpt", "train", "--dataset", str(small_dataset),
           "--out", str(out), "--max-iters", "1000000", "--batch-size", "4", *ARGS,
           "--nproc", "2"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    code, stdout, stderr = _interrupted_when(
        cmd, lambda pid: bool(_children(pid, "forkserver")), env)
    assert code == 130 and stderr == "scratchgpt train: interrupted\n", (code, stderr)
    assert stdout == "" and not out.exists()


def test_ctrl_c_as_torchrun_starts_says_one_line(small_dataset, tmp_path):
    """Under torchrun a Ctrl-C reaches every process, and before the training loop (which
    stops them all after the same step) each said 'interrupted', or rank 0 a gloo traceback
    after the others had left. Rank 0 alone speaks now, and the run directory it had begun
    is left as it was (what follows is torchrun's own report of the signal)."""
    import os
    import sys

    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", "-m", "scratchgpt", "train", "--dataset", str(small_dataset), "--out",
           str(out), "--max-iters", "1000000", "--batch-size", "4", *ARGS]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    # (rank 0 has locked the run: every process is past its imports, in train)
    code, stdout, stderr = _interrupted_when(cmd, lambda pid: (out / ".lock").exists(), env)
    ours = [line for line in stderr.splitlines() if line.startswith(("scratchgpt", "[rank"))]
    if "stopped at step" in stdout:  # (the loop had begun: it stopped every rank and saved)
        assert ours == [] and (out / "last.pt").is_file(), stderr
    else:
        assert ours == ["scratchgpt train: interrupted"], stderr
        assert not out.exists(), list(out.iterdir())


def test_torchrun_launch_equals_nproc(small_dataset, tmp_path):
    """`torchrun --nproc-per-node 2 -m scratchgpt train ...` trains exactly as `--nproc 2`."""
    import os
    import subprocess
    import sys

    common = ["--dataset", str(small_dataset), "--max-iters", "12", "--batch-size", "4",
              "--dropout", "0", *ARGS]
    assert main(["train", *common, "--out", str(tmp_path / "spawned"), "--nproc", "2"]) == 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", "-m", "scratchgpt", "train", *common,
                           "--out", str(tmp_path / "torchrun")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("done: 12 steps") == 1  # rank 0 alone reports
    a, b = weights(tmp_path / "spawned"), weights(tmp_path / "torchrun")
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6), k


def _torchrun(args: list[str]) -> tuple[int, str, str]:
    """``torchrun --standalone --nproc-per-node 2 -m scratchgpt ARGS``: (exit code, stdout,
    stderr without torchrun's own warning about OMP_NUM_THREADS)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", "-m", "scratchgpt", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=300)
    return done.returncode, done.stdout, done.stderr


def test_torchrun_plans_as_train_does_and_refuses_in_one_line(small_dataset, tmp_path):
    """Under torchrun, train planned with job.plan alone: --init-from and the LoRA flags were
    ignored (a fresh model trained from random weights, in silence), the run's notes (a
    warmup longer than the run, a resume with nothing left to train) were not said, and a
    refusal in rank 0 left the other ranks waiting at a barrier, each then dying of the
    broken connection with a traceback of gloo's. It now plans as train does, and rank 0's
    refusal ends the others without a word (what follows is torchrun's own report)."""
    from scratchgpt.checkpoints import load_checkpoint

    base, run = tmp_path / "base", tmp_path / "more"
    short = ["--max-iters", "2", "--batch-size", "4", *ARGS]
    assert main(["train", "--dataset", str(small_dataset), "--out", str(base), *short]) == 0
    trains = ARGS[ARGS.index("--eval-iters"):-2]  # (the model's shape is the base's)
    cont = ["train", "--init-from", base, "--lora-rank", "2", "--dataset", small_dataset,
            "--out", run, "--max-iters", "2", "--batch-size", "4", *trains,
            "--warmup-iters", "5"]
    code, out, err = _torchrun(cont)
    assert code == 0, err
    assert "--warmup-iters 5 is not below --max-iters 2" in out, out
    ck = load_checkpoint(run / "last.pt")
    assert ck.model_type == "gpt-lora" and ck.data["base"]["source"] == str(base.resolve())
    assert (run / "adapter.pt").is_file()
    before = (run / "last.pt").read_bytes()
    code, out, err = _torchrun(cont)  # again, without --resume or --overwrite
    assert code != 0 and err.count("scratchgpt train: error:") == 1, err
    assert "already holds a run" in err and "[rank1]" not in err, err
    assert (run / "last.pt").read_bytes() == before
    code, out, err = _torchrun(["train", "--out", run, "--resume", "--no-progress"])
    assert code == 0, err
    assert f"note: {run} is already at step 2 of --max-iters 2" in out, out


def test_torchrun_refuses_a_resume_whose_run_was_written_since_it_was_planned(small_dataset,
                                                                             tmp_path):
    """A resume is planned from last.pt before the run's lock is taken; train --resume then
    checks, holding it, that last.pt is still the one it planned from (another process may
    have written the run meanwhile, and resuming from the plan would overwrite its newer
    checkpoints). Rank 0 under torchrun locked and began the run without that check."""
    import os

    from scratchgpt.errors import RunInUseError
    from scratchgpt.training import job
    from scratchgpt.training.settings import Settings

    out = tmp_path / "r"
    assert main(["train", "--dataset", str(small_dataset), "--out", str(out), "--max-iters",
                 "2", "--batch-size", "4", *ARGS]) == 0
    plan = job.plan(Settings(), str(out), True, False, None, log=None)
    (out / "again.pt").write_bytes((out / "last.pt").read_bytes())
    os.replace(out / "again.pt", out / "last.pt")  # (another process saved it meanwhile)
    held: list = []
    with pytest.raises(RunInUseError, match="changed while this process was starting"):
        job._begun(plan, held)  # (rank 0's part of run_launched; it aborts what it holds)
    for run_dir in held:
        run_dir.release()


def test_a_run_with_a_progress_bar_ends_without_a_leaked_semaphore(small_dataset, tmp_path):
    """tqdm's bar made a multiprocessing lock in rank 0, which ends by os._exit: every --nproc
    run with a bar ended with the resource tracker's 'leaked semaphore objects' warning."""
    import os
    import subprocess
    import sys

    args = [a for a in ARGS if a != "--no-progress"]
    cmd = [sys.executable, "-m", "scratchgpt", "train", "--dataset", str(small_dataset),
           "--out", str(tmp_path / "run"), "--max-iters", "4", "--batch-size", "4", *args,
           "--nproc", "2"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "4/4" in done.stderr, done.stderr  # the bar was drawn
    assert "leaked semaphore" not in done.stderr, done.stderr


def test_a_script_without_a_main_guard_trains_with_two_processes(small_dataset, tmp_path):
    """scratchgpt.train(TrainConfig(nproc=2), ...) from a script with no `if __name__ ==
    "__main__":` guard ran the script again in each training process (multiprocessing runs
    the main module first): each started a training of its own, refused as the run in use
    with a traceback apiece, and the call failed with 'a training process ended without a
    result'. The processes no longer run the script."""
    import os
    import subprocess
    import sys

    script = tmp_path / "train_it.py"
    script.write_text(
        "import scratchgpt as sg\n"
        "print('the script runs')\n"
        f"data = sg.TokenDataset({str(small_dataset)!r})\n"
        "gpt = sg.model_config('gpt', vocab_size=data.vocab_size, n_layer=1, n_head=2,\n"
        "                      n_embd=16, block_size=16)\n"
        "cfg = sg.TrainConfig(max_iters=4, batch_size=4, eval_interval=2, eval_iters=1,\n"
        "                     warmup_iters=1, nproc=2, threads=1)\n"
        f"result = sg.train(cfg, gpt, data, {str(tmp_path / 'run')!r}, progress=False)\n"
        "print('trained', result.step)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["the script runs", "trained 4"], done.stdout
    assert "Traceback" not in done.stderr, done.stderr
