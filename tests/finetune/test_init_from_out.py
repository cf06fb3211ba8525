"""train --init-from checks its --out before it reads the base and the data."""

from __future__ import annotations

from tests.finetune.conftest import run_cli


def test_train_init_from_refuses_its_out_before_reading_the_base(ft_dir, tmp_path, capsys):
    """An --out below a file, or holding a run, was refused only once the base and the data
    had been read (and the parameters counted and printed)."""
    (tmp_path / "file").write_text("x")
    taken = tmp_path / "taken"
    start = ["train", "--init-from", ft_dir / "base", "--dataset", ft_dir / "data",
             "--max-iters", "1", "--eval-iters", "1"]
    code, _, err = run_cli([*start, "--out", taken, "--no-progress"], capsys)
    assert code == 0, err
    for out, words in ((tmp_path / "file" / "run", "is below"), (taken, "--overwrite")):
        code, printed, err = run_cli([*start, "--out", out], capsys)  # (progress: it logs)
        assert code == 2 and words in err, err
        assert printed == "", printed  # nothing read, nothing counted


def test_train_init_from_checks_device_and_memory_before_reading_the_base(
        ft_dir, tmp_path, capsys, monkeypatch):
    """A plain train checks the device, its precision and the memory first; --init-from
    skipped them: the base was loaded, its parameters counted and the data read before the
    device or the memory refused the run."""
    import torch

    from scratchgpt.finetune import plan

    loaded: list[str] = []
    load_base = plan.load_base
    monkeypatch.setattr(plan, "load_base", lambda *a: loaded.append(a[0]) or load_base(*a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    start = ["train", "--init-from", ft_dir / "base", "--dataset", ft_dir / "data",
             "--max-iters", "1", "--eval-iters", "1", "--out", tmp_path / "r"]
    code, printed, err = run_cli([*start, "--device", "cuda"], capsys)
    assert code == 2 and "cuda" in err and len(err.splitlines()) == 1, err
    assert printed == "" and loaded == [] and not (tmp_path / "r").exists()
    monkeypatch.setenv("SCRATCHGPT_MEMORY_LIMIT", "1KiB")
    for lora in ([], ["--lora"]):
        code, printed, err = run_cli([*start, *lora], capsys)
        assert code == 2 and "more than the" in err and len(err.splitlines()) == 1, err
        assert printed == "" and not (tmp_path / "r").exists(), printed
