"""Resuming a fine-tuning run that its --time-budget ended."""

from __future__ import annotations

from scratchgpt.checkpoints import load_checkpoint
from tests.finetune.conftest import BUDGETED, classify_run, run_cli


def test_a_finetune_ended_on_its_budget_says_so_and_resumes_to_a_new_max_iters(
        ft_dir, tmp_path, capsys):
    out = tmp_path / "ft"
    code, _, err = run_cli(classify_run(ft_dir, out, *BUDGETED), capsys)
    assert code == 0, err
    step = load_checkpoint(out / "last.pt").state.step
    assert 0 < step < 1_000_000
    code, printed, err = run_cli(["finetune", "--out", out, "--resume", "--no-progress"],
                                 capsys)
    assert code == 0, err
    assert f"already used its --time-budget of 0.5 s; pass a --max-iters above {step}" \
        in printed, printed
    code, _, err = run_cli(["finetune", "--out", out, "--resume", "--max-iters", step + 2,
                            "--no-progress"], capsys)
    assert code == 0, err
    assert load_checkpoint(out / "last.pt").state.step == step + 2


def test_a_resume_refused_at_the_lock_says_no_start_of_run_note(ft_dir, tmp_path, capsys):
    """A finished run resumed while another process writes it printed its note (nothing
    left to train) before the lock refused it, as if it were about to run."""
    from scratchgpt.checkpoints.rundir import RunDir

    out = tmp_path / "ft"
    code, _, err = run_cli(classify_run(ft_dir, out, "--max-iters", "2"), capsys)
    assert code == 0, err
    with RunDir(out).lock():  # (another process writing the run)
        code, printed, err = run_cli(["finetune", "--out", out, "--resume", "--no-progress"],
                                     capsys)
    assert code == 2 and "is in use by process" in err and "note:" not in printed, printed
    code, printed, err = run_cli(["finetune", "--out", out, "--resume", "--no-progress"],
                                 capsys)
    assert code == 0 and f"note: {out} is already at step 2" in printed, (printed, err)


def test_a_resume_checks_the_memory_as_train_s_resume_does(ft_dir, tmp_path, capsys,
                                                           monkeypatch):
    """train --resume checks the device and the memory the run will take (a --batch-size
    given now, the run's own); finetune --resume checked neither, and trained a batch beyond
    memory. Refused in one line, the run as it was."""
    out = tmp_path / "ft"
    code, _, err = run_cli(classify_run(ft_dir, out, "--max-iters", "2"), capsys)
    assert code == 0, err
    before = (out / "last.pt").read_bytes()
    monkeypatch.setenv("SCRATCHGPT_MEMORY_LIMIT", "64MiB")  # (the tiny run loads within it)
    code, printed, err = run_cli(["finetune", "--out", out, "--resume", "--batch-size", "1000",
                                  "--max-iters", "4", "--no-progress"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "training this model needs about" in err and "more than the 64.0 MiB" in err, err
    assert printed == "" and (out / "last.pt").read_bytes() == before, printed


def test_a_finetune_that_ends_inside_its_warmup_says_so_as_train_does(ft_dir, tmp_path,
                                                                      capsys):
    """A run its budget ended (planned for 1,000,000 updates, with a warmup to match),
    resumed to a few more updates, keeps its warmup and ends inside it: the rate only rose
    and the schedule never started, which train's note says and finetune's run did not. So
    is one started with a --warmup-iters of its whole run. (The warmup is given: the default,
    100 updates, a fast machine passes within the budget.)"""
    out = tmp_path / "ft"
    code, _, err = run_cli(classify_run(ft_dir, out, *BUDGETED, "--warmup-iters", "100000"),
                           capsys)
    assert code == 0, err
    step = load_checkpoint(out / "last.pt").state.step
    code, printed, err = run_cli(["finetune", "--out", out, "--resume", "--max-iters",
                                  step + 2, "--no-progress"], capsys)
    assert code == 0, err
    assert f"note: --warmup-iters 100000 is not below --max-iters {step + 2}: the learning " \
        "rate rises for the whole run" in printed, printed
    code, printed, err = run_cli(classify_run(ft_dir, tmp_path / "new", "--max-iters", "3",
                                              "--warmup-iters", "3"), capsys)
    assert code == 0, err
    assert "note: --warmup-iters 3 is not below --max-iters 3" in printed, printed
    code, printed, err = run_cli(classify_run(ft_dir, tmp_path / "ok", "--max-iters", "3"),
                                 capsys)
    assert code == 0 and "note:" not in printed, printed  # (its warmup: 3 / 20, none)
