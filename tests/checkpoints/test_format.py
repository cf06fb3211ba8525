"""The checkpoint format: typed round trips for every model kind, version-1 files, run
directories (lock, safe overwrite, stale temporaries, best/last reconciliation)."""

import math

import pytest
import torch

from scratchgpt.checkpoints import Checkpoint, load_checkpoint, load_model, save_checkpoint
from scratchgpt.checkpoints.rundir import RunDir, run_config
from scratchgpt.errors import CheckpointError, RunInUseError
from scratchgpt.models import build_model, model_config
from scratchgpt.tokenizers import CharTokenizer, Seq2SeqTokenizer
from scratchgpt.training.config import TrainConfig
from scratchgpt.training.state import TrainState


@pytest.mark.parametrize("kind,values", [
    ("gpt", dict(vocab_size=7, n_layer=1, n_head=2, n_embd=8, block_size=8)),
    ("lstm", dict(vocab_size=7, hidden=8, n_layer=1)),
    ("bigram", dict(vocab_size=7)),
    ("seq2seq", dict(arch="transformer", src_vocab=9, tgt_vocab=6, d_model=8, n_head=2,
                     d_ff=16)),
])
def test_every_model_kind_round_trips_with_its_settings(tmp_path, kind, values):
    torch.manual_seed(0)
    config = model_config(kind, **values)
    model = build_model(config)
    tok = Seq2SeqTokenizer.train(["abc"]) if kind == "seq2seq" else CharTokenizer("abcdefg")
    state = TrainState(step=3, tokens=48, elapsed_s=1.5, best_val_loss=2.0, val_loss=2.0,
                       rng={"batch": torch.Generator().get_state()})
    saved = Checkpoint(kind, config, model.state_dict(), {"text": tok.state()},
                       {"dataset": "somewhere"}, "run-1", TrainConfig(max_iters=9), state,
                       {"param_groups": []})
    save_checkpoint(tmp_path / "c.pt", saved)
    back = load_checkpoint(tmp_path / "c.pt")
    assert back.model_config == config and back.model_type == kind
    assert back.train_config == saved.train_config
    assert torch.equal(back.state.rng.pop("batch"), state.rng.pop("batch"))
    assert back.state == state
    assert back.tokenizer("text").state() == tok.state() and back.run_id == "run-1"
    loaded, source = load_model(tmp_path / "c.pt")
    assert source.checkpoint.path == tmp_path / "c.pt"
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v)


def test_a_version_1_file_still_loads_and_resumes(tmp_path):
    """Files written before the typed format: flat keys, one tokenizer, the dataset path."""
    config = model_config("gpt", vocab_size=5, n_layer=1, n_head=1, n_embd=4, block_size=4)
    model = build_model(config)
    gen = torch.Generator()
    torch.save({"format": "scratchgpt-checkpoint", "version": 1, "model_type": "gpt",
                "model_config": {"vocab_size": 5, "n_layer": 1, "n_head": 1, "n_embd": 4,
                                 "block_size": 4},
                "model": model.state_dict(), "optimizer": {}, "step": 7, "elapsed_s": 2.0,
                "tokens": 100, "best_val_loss": 1.5, "val_loss": 1.5,
                "train_config": {"model": "gpt", "max_iters": 50},
                "tokenizer": CharTokenizer("abcde").state(), "dataset": "data/x",
                "rng": {"batch": gen.get_state(), "torch": torch.get_rng_state(),
                        "cuda": None}}, tmp_path / "old.pt")
    ckpt = load_checkpoint(tmp_path / "old.pt")
    assert ckpt.state.step == 7 and ckpt.state.best_val_loss == 1.5
    assert ckpt.train_config.max_iters == 50 and ckpt.data == {"dataset": "data/x"}
    assert ckpt.tokenizer().decode([0, 4]) == "ae"
    assert len(ckpt.state.rng["torch_per_rank"]) == 1


@pytest.mark.parametrize("damage,message", [
    (lambda d: d.pop("model_config"), "lacks 'model_config'"),
    (lambda d: d["model_config"].update(n_layer="two"), "n_layer must be int"),
    (lambda d: d["model_config"].update(n_head=3), "divisible"),
    (lambda d: d["train_config"].update(learning_rate=math.inf), "learning_rate"),
    (lambda d: d.update(version=99), "version 99"),
])
def test_damaged_settings_are_one_line_errors(tmp_path, damage, message):
    config = model_config("gpt", vocab_size=5, n_layer=1, n_head=2, n_embd=4, block_size=4)
    data = Checkpoint("gpt", config, build_model(config).state_dict(),
                      train_config=TrainConfig()).to_dict()
    damage(data)
    torch.save(data, tmp_path / "d.pt")
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(tmp_path / "d.pt")


def test_weights_that_lack_many_tensors_name_three_and_count_the_rest(tmp_path, capsys):
    """The names past the third are counted as every list in a message counts them
    (wording.first_of), not in a parenthesis of their own: 'a, b, c and 9 more'."""
    from tests.cli_errors import error_of

    config = model_config("gpt", vocab_size=5, n_layer=2, n_head=2, n_embd=8, block_size=4)
    weights = build_model(config).state_dict()
    gone = [k for k in weights if ".h.1." in k]
    weights = {k: v for k, v in weights.items() if k not in gone}
    torch.save({**Checkpoint("gpt", config, {}).to_dict(), "model": weights}, tmp_path / "c.pt")
    line = error_of(capsys, ["sample", "--checkpoint", str(tmp_path / "c.pt"), "--prompt", "a"])
    assert len(gone) > 4 and line.endswith(
        f"its weights do not fit the model its settings describe: missing {gone[0]}, {gone[1]}, "
        f"{gone[2]} and {len(gone) - 3} more"), line


def test_a_byte_changed_on_disk_is_refused_not_loaded(tmp_path):
    """Every part of the file is checked against the CRC-32 written with it: one flipped byte
    in the weights makes the file unreadable rather than a model with other weights."""
    config = model_config("gpt", vocab_size=5, n_layer=1, n_head=2, n_embd=8, block_size=4)
    save_checkpoint(tmp_path / "c.pt", Checkpoint("gpt", config, build_model(config).state_dict()))
    data = bytearray((tmp_path / "c.pt").read_bytes())
    biggest = max(torch.load(tmp_path / "c.pt", weights_only=True)["model"].values(),
                  key=lambda t: t.numel())
    at = bytes(data).find(biggest.numpy().tobytes())  # the tensor's bytes, stored as they are
    assert at > 0
    data[at + 5] ^= 0x40
    (tmp_path / "c.pt").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="damaged .*archive/data/"):
        load_checkpoint(tmp_path / "c.pt")


def test_a_checkpoint_cut_short_anywhere_says_so(tmp_path):
    """A copy or download that stopped early: cut in the archive's first few kilobytes torch
    said only '[Errno 22] Invalid argument', elsewhere it named its zip reader."""
    config = model_config("gpt", vocab_size=5, n_layer=1, n_head=2, n_embd=8, block_size=4)
    save_checkpoint(tmp_path / "c.pt", Checkpoint("gpt", config, build_model(config).state_dict()))
    data = (tmp_path / "c.pt").read_bytes()
    for length in (100, 1_000, 5_000, len(data) // 2, len(data) - 1):
        (tmp_path / "cut.pt").write_bytes(data[:length])
        with pytest.raises(CheckpointError) as refused:
            load_checkpoint(tmp_path / "cut.pt")
        assert "truncated or corrupt: a zip archive without its end" in str(refused.value), \
            (length, str(refused.value))


def test_a_gguf_file_given_as_a_checkpoint_says_what_it_is(tmp_path):
    """convert --to gguf's file passed back where a checkpoint goes was 'not a file torch.save
    wrote', which left the user to guess that scratchgpt reads no GGUF."""
    (tmp_path / "model.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(64))
    with pytest.raises(CheckpointError, match="is a GGUF file, for llama.cpp: scratchgpt "
                                              "writes GGUF .* but does not read it"):
        load_model(tmp_path / "model.gguf")


def test_a_file_saved_without_checksums_still_loads(tmp_path):
    from torch.utils.serialization import config as serialization

    config = model_config("bigram", vocab_size=3)
    with serialization.patch({"save.compute_crc32": False}):  # torch writes each CRC as 0
        save_checkpoint(tmp_path / "c.pt", Checkpoint("bigram", config,
                                                      build_model(config).state_dict()))
    assert load_checkpoint(tmp_path / "c.pt").model_type == "bigram"


def test_second_writer_is_refused_with_the_holder(tmp_path):
    first = RunDir(tmp_path / "run")
    with first.lock():
        with pytest.raises(RunInUseError, match=r"in use by process \d+"):
            RunDir(tmp_path / "run").acquire()
    with RunDir(tmp_path / "run").lock():  # released: the next writer gets it
        pass


def test_a_lock_released_on_an_unused_new_folder_removes_it(tmp_path):
    """A start refused after taking the lock leaves no empty run (nor the folders made for
    it); a folder that was there, or that holds anything, stays."""
    with RunDir(tmp_path / "a" / "b" / "run").lock():
        assert (tmp_path / "a" / "b" / "run" / ".lock").is_file()
    assert not (tmp_path / "a").exists()
    (tmp_path / "mine").mkdir()
    with RunDir(tmp_path / "mine").lock():
        pass
    assert (tmp_path / "mine").is_dir()
    with RunDir(tmp_path / "used").lock() as run:
        run.file("notes.txt").write_text("kept")
    assert (tmp_path / "used" / "notes.txt").read_text() == "kept"


def test_a_folder_of_files_no_run_wrote_is_refused_even_with_overwrite(tmp_path):
    """A user's own config.json and metrics.csv are not a run that never checkpointed:
    --overwrite would move them aside and delete them once the new run checkpoints."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text('{"my": "settings"}')
    (mine / "metrics.csv").write_text("a,b\n1,2\n")
    for mode in ("new", "overwrite", "resume"):
        with pytest.raises(CheckpointError, match="no scratchgpt run wrote"):
            with RunDir(mine).lock() as run:
                run.begin(mode)
    assert (mine / "config.json").read_text() == '{"my": "settings"}'
    assert (mine / "metrics.csv").read_text() == "a,b\n1,2\n"
    # a run's own config.json, written before its first checkpoint: a run to start again
    config = model_config("bigram", vocab_size=3)
    theirs = RunDir(tmp_path / "started")
    theirs.path.mkdir()
    theirs.write_config(run_config(Checkpoint("bigram", config, {})))
    with theirs.lock():
        theirs.begin("overwrite")
    # killed here, its config.json aside: still a run, which the next start puts back
    assert not theirs.file("config.json").exists() and theirs.is_scratchgpt_run()


def write_run(run: RunDir, marker: str) -> None:
    config = model_config("bigram", vocab_size=3)
    run.path.mkdir(parents=True, exist_ok=True)
    run.file("config.json").write_text(marker)
    save_checkpoint(run.file("last.pt"), Checkpoint("bigram", config,
                                                    build_model(config).state_dict()))


def test_overwrite_keeps_the_old_run_until_the_new_one_has_a_checkpoint(tmp_path):
    run = RunDir(tmp_path / "run")
    write_run(run, "old")
    with run.lock():
        run.begin("overwrite")
        assert not run.file("config.json").exists()
        run.file("config.json").write_text("new, failed")
        run.abort()
    assert run.file("config.json").read_text() == "old" and run.file("last.pt").is_file()
    with run.lock():
        run.begin("overwrite")
        write_run(run, "new")
        run.commit()
    assert run.file("config.json").read_text() == "new"
    assert not run.file(".replaced").exists()


def test_an_overwrite_killed_before_its_first_checkpoint_is_undone_at_the_next_start(tmp_path):
    run = RunDir(tmp_path / "run")
    write_run(run, "old")
    with run.lock():
        run.begin("overwrite")  # ... and the process dies here: no abort, no commit
    with run.lock():
        with pytest.raises(CheckpointError, match="already holds a run"):
            run.begin("new")
    assert run.file("config.json").read_text() == "old"


def test_a_resume_after_an_overwrite_killed_before_its_first_checkpoint_resumes_the_old_run(
        tmp_path):
    """--resume is planned before the lock is taken: it too brings the run an interrupted
    --overwrite moved aside back (it said the run had never written a checkpoint, and
    advised an --overwrite that would have replaced it)."""
    run = RunDir(tmp_path / "run")
    write_run(run, "old")
    with run.lock():
        run.begin("overwrite")  # ... and the process dies here
    with pytest.raises(CheckpointError, match=r"\.replaced/"):
        load_checkpoint(run.path)  # a reader says where the run is
    assert RunDir(tmp_path / "run").load_last().model_type == "bigram"
    assert run.file("config.json").read_text() == "old"
    assert not run.file(".replaced").exists()


def test_stale_temporaries_are_removed_when_a_run_starts(tmp_path):
    run = RunDir(tmp_path / "run")
    write_run(run, "x")
    stale = run.file(".last.pt.abc123.tmp")
    stale.write_bytes(b"half a checkpoint")
    with run.lock():
        run.begin("resume")
    assert not stale.exists() and run.file("last.pt").is_file()


def test_resume_trusts_best_pt_when_last_pt_lags_behind(tmp_path):
    """Killed after writing best.pt, before last.pt: last.pt's record of the best loss is
    stale, and must not let a worse model overwrite best.pt later."""
    run = RunDir(tmp_path / "run")
    config = model_config("bigram", vocab_size=3)
    weights = build_model(config).state_dict()

    def ckpt(val: float, best: float, run_id: str = "r") -> Checkpoint:
        return Checkpoint("bigram", config, weights, run_id=run_id,
                          train_config=TrainConfig(),
                          state=TrainState(step=1, best_val_loss=best, val_loss=val))

    save_checkpoint(run.file("last.pt"), ckpt(2.0, 2.0))
    save_checkpoint(run.file("best.pt"), ckpt(1.5, 1.5))
    assert run.load_last().state.best_val_loss == 1.5
    save_checkpoint(run.file("best.pt"), ckpt(1.5, 1.5, run_id="another"))
    with pytest.raises(CheckpointError, match="different runs"):
        run.load_last()


@pytest.mark.parametrize("links", [True, False])
def test_a_copy_is_the_same_checkpoint_and_keeps_it_when_the_file_moves_on(tmp_path, links,
                                                                          monkeypatch):
    """best.pt and last.pt saved together hold the same bytes (a hard link where the file
    system has them, else a second write); the next save of last.pt alone leaves best.pt as
    it was."""
    if not links:
        def no_links(*_):
            raise OSError("no hard links here")
        monkeypatch.setattr("scratchgpt.checkpoints.io.os.link", no_links)
    config = model_config("bigram", vocab_size=3)
    model = build_model(config)

    def ckpt(step: int) -> Checkpoint:
        return Checkpoint("bigram", config, model.state_dict(), run_id="r",
                          state=TrainState(step=step))

    best, last = tmp_path / "best.pt", tmp_path / "last.pt"
    save_checkpoint(last, ckpt(1), copies=[best])
    assert best.read_bytes() == last.read_bytes()
    assert (best.stat().st_ino == last.stat().st_ino) == links
    kept = best.read_bytes()
    with torch.no_grad():
        model.table.weight.add_(1.0)
    save_checkpoint(last, ckpt(2))
    assert best.read_bytes() == kept and load_checkpoint(best).state.step == 1
    assert load_checkpoint(last).state.step == 2
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind


def test_which_best_or_last_is_that_file_or_refused(tmp_path, capsys):
    """--which last reads a run's last.pt, --which best its best.pt; where there is none (a
    run of the other file alone, or a checkpoint file named directly) it is refused, where it
    used to read the other file silently. Without --which, a run that has not evaluated yet
    is read from its last.pt. From Python the refusals name the keyword, which the command
    line's --which had been named to a caller who has no flags."""
    from tests.cli_errors import error_of

    config = model_config("bigram", vocab_size=3)
    run = tmp_path / "run"
    run.mkdir()
    save_checkpoint(run / "last.pt",
                    Checkpoint("bigram", config, build_model(config).state_dict()))
    assert load_checkpoint(run).path == run / "last.pt"
    assert load_checkpoint(run, "last").path == run / "last.pt"
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(run, "best")
    assert str(refused.value).endswith("has no best.pt, only last.pt (the run has not "
                                       "evaluated yet); leave which None")
    assert error_of(capsys, ["eval", "--checkpoint", str(run), "--which", "best"]).endswith(
        "has no best.pt, only last.pt (the run has not evaluated yet); drop --which best")
    (run / "last.pt").rename(run / "best.pt")
    assert load_checkpoint(run).path == load_checkpoint(run, "best").path == run / "best.pt"
    with pytest.raises(CheckpointError, match="has no last.pt, only best.pt; leave which None"):
        load_checkpoint(run, "last")
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(run / "best.pt", "last")
    assert str(refused.value).endswith("is a checkpoint file; which='last' picks a run "
                                       "directory's last.pt (name the directory, or leave "
                                       "which None)")
    line = error_of(capsys, ["eval", "--checkpoint", str(run), "--which", "last"])
    assert line.endswith("has no last.pt, only best.pt; drop --which last"), line
    line = error_of(capsys, ["eval", "--checkpoint", str(run / "best.pt"), "--which", "last"])
    assert line.endswith("is a checkpoint file; --which last picks a run directory's last.pt "
                         "(name the directory, or drop --which)"), line


@pytest.mark.parametrize("which", ["worst", "best.pt", ""])
def test_which_other_than_best_or_last_is_refused_by_name(tmp_path, which):
    """From Python: which="worst" was told the run had no checkpoint (best.pt or last.pt),
    beside the run's best.pt."""
    config = model_config("bigram", vocab_size=3)
    save_checkpoint(tmp_path / "best.pt",
                    Checkpoint("bigram", config, build_model(config).state_dict()))
    with pytest.raises(CheckpointError, match=f"which is 'best', 'last' or None.*got {which!r}"):
        load_checkpoint(tmp_path, which)


def test_files_written_atomically_are_readable_as_the_umask_allows(tmp_path):
    """0644 under the usual umask 022, as open() makes a file: they were mkstemp's private
    0600, so another user could not read a shared run's best.pt or metrics."""
    import os

    from scratchgpt.checkpoints.io import atomic_write_text

    for umask, mode in ((0o022, 0o644), (0o077, 0o600)):
        saved = os.umask(umask)
        try:
            atomic_write_text(tmp_path / f"f{umask}.json", "{}")
        finally:
            os.umask(saved)
        assert (tmp_path / f"f{umask}.json").stat().st_mode & 0o777 == mode


def test_a_loaded_models_source_prints_in_a_few_lines(tmp_path):
    """``print(source)`` after ``load_model`` printed every weight and the optimizer's state,
    some 100 KB of tensors for a 2-layer GPT: it names what was loaded and from where."""
    config = model_config("gpt", vocab_size=7, n_layer=2, n_head=2, n_embd=16, block_size=8)
    model = build_model(config)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.zeros(1, 4, dtype=torch.long))[0].sum().backward()
    optimizer.step()
    saved = Checkpoint("gpt", config, model.state_dict(), {"text": CharTokenizer("abc").state()},
                       {"dataset": "data/x"}, "run-1", TrainConfig(max_iters=9), TrainState(),
                       optimizer.state_dict())
    save_checkpoint(tmp_path / "best.pt", saved)
    _, source = load_model(tmp_path)
    shown = repr(source)
    assert len(shown) < 2000, shown[:3000]
    assert "best.pt" in shown and "n_layer=2" in shown and "run-1" in shown
