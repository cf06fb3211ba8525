"""``scratchgpt eval --by-position`` and ``--plot``: the val loss by context length."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from scratchgpt.cli import main
from scratchgpt.viz import by_context_range, context_ranges
from tests.cli_errors import error_of

BLOCK = 12


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, small_dataset) -> Path:
    out = tmp_path_factory.mktemp("runs") / "tiny"
    assert main(["train", "--dataset", str(small_dataset), "--out", str(out), "--max-iters", "60",
                 "--eval-interval", "30", "--n-layer", "1", "--n-head", "2", "--n-embd", "32",
                 "--block-size", str(BLOCK), "--batch-size", "8", "--eval-iters", "2",
                 "--no-progress", "--dtype", "fp32"]) == 0
    return out


def test_ranges_cover_every_context_once_and_average_it():
    for block in (1, 2, 3, 12, 64, 100, 128):
        ranges = context_ranges(block)
        covered = [c for lo, hi in ranges for c in range(lo, hi + 1)]
        assert covered == list(range(1, block + 1))
    curve = [float(t) for t in range(10)]  # position t: context t + 1
    assert by_context_range(curve) == [((1, 1), 0.0), ((2, 2), 1.0), ((3, 4), 2.5),
                                       ((5, 8), 5.5), ((9, 10), 8.5)]


def test_json_has_a_curve_per_split_whose_mean_is_the_loss(run_dir, capsys):
    assert main(["eval", "--checkpoint", str(run_dir), "--by-position", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    for split in ("train", "val"):
        curve = figures[f"{split}_by_position"]
        assert len(curve) == BLOCK
        assert abs(sum(curve) / BLOCK - figures[f"{split}_loss"]) < 1e-4
    assert main(["eval", "--checkpoint", str(run_dir), "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert "val_by_position" not in plain and plain["val_loss"] == figures["val_loss"]


def test_split_val_gives_the_val_figures_alone(run_dir, capsys, tmp_path):
    """--split val evaluates the held-out split only (the quick look: the training split is
    nine tenths of the text), with the figures both splits' evaluation gives it."""
    assert main(["eval", "--checkpoint", str(run_dir), "--by-position", "--json"]) == 0
    both = json.loads(capsys.readouterr().out)
    assert main(["eval", "--checkpoint", str(run_dir), "--by-position", "--json",
                 "--split", "val"]) == 0
    val = json.loads(capsys.readouterr().out)
    assert not [k for k in val if k.startswith("train")]
    assert {k: v for k, v in both.items() if not k.startswith("train")} == val
    plot = tmp_path / "ctx.png"
    assert main(["eval", "--checkpoint", str(run_dir), "--split", "val", "--plot",
                 str(plot)]) == 0
    out = capsys.readouterr().out
    body = out.split("\n", 1)[1]  # (below the checkpoint's path)
    assert plot.exists() and "  val " in body and "train" not in body


def test_the_printed_loss_is_the_exact_loss_to_four_places(run_dir, capsys, monkeypatch):
    """The lines show each loss itself to 4 places, as train's report does, not the JSON's
    5-place figure rounded again: 2.2869493 is 2.2869, where 2.28695 would print 2.2870."""
    from scratchgpt.training import task

    monkeypatch.setattr(task, "full_split_loss", lambda *a, **k: 2.2869493)
    assert main(["eval", "--checkpoint", str(run_dir)]) == 0
    lines = [ln.split() for ln in capsys.readouterr().out.splitlines()[1:3]]
    assert [ln[:3] for ln in lines] == [["train", "loss", "2.2869"], ["val", "loss", "2.2869"]]
    assert main(["eval", "--checkpoint", str(run_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["val_loss"] == 2.28695  # its own 5 places


def test_bits_per_character_are_trains_own(small_dataset, tmp_path, capsys):
    """train ends with its val loss in nats per token and bits per character; eval reported
    the former alone, so a run could not be compared with its own report, or with a run of
    another tokenizer, in the unit that compares them. Now each split has both."""
    import re

    out = tmp_path / "r"
    assert main(["train", "--dataset", str(small_dataset), "--out", str(out), "--max-iters",
                 "4", "--eval-interval", "4", "--n-layer", "1", "--n-head", "2", "--n-embd",
                 "16", "--block-size", str(BLOCK), "--batch-size", "4", "--eval-iters", "1",
                 "--no-progress", "--dtype", "fp32"]) == 0
    trained = re.search(r"val loss ([\d.]+) \(full val split, ([\d.]+) bits/char\)",
                        capsys.readouterr().out)
    assert main(["eval", "--checkpoint", str(out)]) == 0
    val = capsys.readouterr().out.splitlines()[2].split()
    assert val[0] == "val" and (val[2], val[5], val[6]) == (*trained.groups(), "bits/char")
    assert main(["eval", "--checkpoint", str(out), "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert f"{figures['val_bpc']:.4f}" == trained.group(2) and figures["train_bpc"] > 0
    assert main(["eval", "--checkpoint", str(out), "--json", "--max-tokens", "50"]) == 0
    assert "val_bpc" not in json.loads(capsys.readouterr().out)  # of part of the split: none


def test_max_tokens_is_the_loss_of_the_first_windows_that_fit(run_dir, capsys):
    """--max-tokens N scores the first N // BLOCK windows of each split, no more (at least
    one); the same loss as computed here window by window."""
    import torch
    import torch.nn.functional as F

    from scratchgpt.checkpoints import load_model
    from scratchgpt.data.resolve import resolve_dataset

    model, source = load_model(run_dir)
    data, _ = resolve_dataset(source.checkpoint.data["dataset"])
    for max_tokens, windows in ((3 * BLOCK + 5, 3), (BLOCK - 1, 1)):
        assert main(["eval", "--checkpoint", str(run_dir), "--json",
                     "--max-tokens", str(max_tokens)]) == 0
        figures = json.loads(capsys.readouterr().out)
        for split in ("train", "val"):
            tokens = torch.from_numpy(data.splits[split][: windows * BLOCK + 1].astype("int64"))
            x = torch.stack([tokens[i * BLOCK: (i + 1) * BLOCK] for i in range(windows)])
            y = torch.stack([tokens[i * BLOCK + 1: (i + 1) * BLOCK + 1] for i in range(windows)])
            with torch.no_grad():
                loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
            assert abs(figures[f"{split}_loss"] - loss) < 1e-4


def test_a_run_whose_dataset_is_gone_is_told_to_pass_one(run_dir, tmp_path, capsys):
    """Not '--dataset PATH: no such ...', a flag the user never gave."""
    from scratchgpt.checkpoints import load_checkpoint
    from scratchgpt.checkpoints.io import Checkpoint
    from scratchgpt.checkpoints.rundir import write_model_run

    ckpt = load_checkpoint(run_dir)
    gone = str(tmp_path / "moved-away")
    moved = write_model_run(tmp_path / "run", Checkpoint(
        ckpt.model_type, ckpt.model_config, ckpt.model, ckpt.tokenizers,
        {**ckpt.data, "dataset": gone}, ckpt.run_id))
    line = error_of(capsys, ["eval", "--checkpoint", str(moved)])
    assert line.endswith(f"eval: error: the dataset the run was trained on, {gone}, is no "
                         "longer there; pass --dataset (prepared with the run's tokenizer: "
                         f"prepare --tokenizer-from {moved})"), line  # train --resume's words
    assert main(["eval", "--checkpoint", str(moved), "--dataset", ckpt.data["dataset"],
                 "--max-tokens", "100"]) == 0


def test_a_run_that_recorded_a_named_dataset_is_evaluated_on_it(run_dir, tmp_path, capsys,
                                                                monkeypatch):
    """(as older checkpoints record their dataset): a name, not a directory, is no error."""
    from scratchgpt.checkpoints import load_checkpoint
    from scratchgpt.checkpoints.io import Checkpoint
    from scratchgpt.checkpoints.rundir import write_model_run
    from scratchgpt.data import resolve, sources

    ckpt = load_checkpoint(run_dir)
    real = resolve.resolve_dataset
    monkeypatch.setattr(sources, "DATASET_NAMES", (*sources.DATASET_NAMES, "tiny-named"))
    monkeypatch.setattr(resolve, "resolve_dataset", lambda name, log=print, **kw: real(
        ckpt.data["dataset"] if name == "tiny-named" else name, log, **kw))
    named = write_model_run(tmp_path / "run", Checkpoint(
        ckpt.model_type, ckpt.model_config, ckpt.model, ckpt.tokenizers,
        {"dataset": "tiny-named"}, ckpt.run_id))
    assert main(["eval", "--checkpoint", str(named), "--max-tokens", "100"]) == 0


def test_json_stays_json_when_a_named_dataset_is_prepared_first(run_dir, capsys, monkeypatch):
    """Preparing a named dataset reports it; not on stdout, which holds the JSON."""
    from scratchgpt.data import resolve

    real = resolve.resolve_dataset

    def preparing(name, log=print, **kw):
        log(f"prepared {name}: (as a named dataset's first use reports it)")
        return real(name, log, **kw)

    monkeypatch.setattr(resolve, "resolve_dataset", preparing)
    assert main(["eval", "--checkpoint", str(run_dir), "--json", "--max-tokens", "100"]) == 0
    out, err = capsys.readouterr()
    assert "val_loss" in json.loads(out) and err.startswith("prepared ")


def test_a_loss_beyond_exp_range_has_an_infinite_perplexity(run_dir, tmp_path, capsys):
    """A diverged model (logits thousands apart): its loss is reported, not a traceback."""
    from scratchgpt.checkpoints import load_checkpoint
    from scratchgpt.checkpoints.io import Checkpoint
    from scratchgpt.checkpoints.rundir import write_model_run

    ckpt = load_checkpoint(run_dir)
    scaled = {k: v * 1e4 if "lm_head" in k or "wte" in k else v for k, v in ckpt.model.items()}
    run = write_model_run(tmp_path / "diverged", Checkpoint(
        ckpt.model_type, ckpt.model_config, scaled, ckpt.tokenizers, ckpt.data, ckpt.run_id))
    assert main(["eval", "--checkpoint", str(run), "--json", "--max-tokens", "100"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["val_loss"] > 710 and figures["val_ppl"] == float("inf")
    assert main(["eval", "--checkpoint", str(run), "--max-tokens", "100"]) == 0
    assert "perplexity inf" in capsys.readouterr().out


def test_table_and_plot(run_dir, tmp_path, capsys):
    png = tmp_path / "figs" / "context.png"
    assert main(["eval", "--checkpoint", str(run_dir), "--plot", str(png)]) == 0
    captured = capsys.readouterr()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {png}" in captured.out
    rows = [line.split() for line in captured.out.splitlines() if line.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == ["1", "2", "3-4", "5-8", "9-12"]
    assert all(len(r) == 3 for r in rows)  # context, train, val
    png.write_bytes(b"kept")  # a file already there is replaced only with --overwrite
    assert "already exists" in error_of(capsys, ["eval", "--checkpoint", str(run_dir),
                                                 "--plot", str(png)])
    assert png.read_bytes() == b"kept"
    assert main(["eval", "--checkpoint", str(run_dir), "--plot", str(png), "--overwrite"]) == 0
    capsys.readouterr()  # (its output, a progress bar on a slow machine among it)
    assert "goes with --plot" in error_of(capsys, ["eval", "--checkpoint", str(run_dir),
                                                   "--overwrite"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_plot_in_an_unknown_format_is_one_line(run_dir, tmp_path, capsys):
    line = error_of(capsys, ["eval", "--checkpoint", str(run_dir), "--plot",
                             str(tmp_path / "c.xyz")])
    assert "xyz" in line


def test_a_checkpoint_without_training_state_names_no_step(run_dir, tmp_path, capsys):
    """A merged or converted run (written as finetune --merge writes one) holds no step."""
    from scratchgpt.checkpoints import load_checkpoint
    from scratchgpt.checkpoints.io import Checkpoint
    from scratchgpt.checkpoints.rundir import write_model_run

    ckpt = load_checkpoint(run_dir)
    assert ckpt.state is not None
    merged = write_model_run(tmp_path / "merged", Checkpoint(
        ckpt.model_type, ckpt.model_config, ckpt.model, ckpt.tokenizers, ckpt.data,
        ckpt.run_id))
    assert main(["eval", "--checkpoint", str(merged), "--max-tokens", "200"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert head == f"{merged / 'best.pt'} (fp32)", head  # was '(step None, fp32)'
    assert main(["eval", "--checkpoint", str(run_dir), "--max-tokens", "200"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith(" (step 60, fp32)")


def test_a_dataset_of_another_tokenizer_is_refused_with_what_to_do(run_dir, tmp_path, capsys):
    """eval, like resume, needs the run's tokenizer; the refusal said "resume with the run's
    own dataset", which an eval cannot do, and not how to prepare other text for the run."""
    from scratchgpt.data.prepare import prepare_text

    prepare_text("text of another vocabulary, 0123456789 " * 30, tmp_path / "other", "char")
    msg = error_of(capsys, ["eval", "--checkpoint", str(run_dir), "--dataset",
                            str(tmp_path / "other")])
    assert "tokenized differently" in msg and "resume" not in msg
    assert f"--tokenizer-from {run_dir}" in msg and "use the run's own dataset (" in msg
    # the command it suggests is one prepare takes (it lacked --data and --out)
    import re

    from scratchgpt.cli import build_parser

    suggested = re.search(r"\(scratchgpt (prepare [^)]*)\)", msg).group(1).split()
    assert build_parser().parse_args(suggested).tokenizer_from == str(run_dir)


@pytest.fixture(scope="module")
def hf_dir(run_dir, tmp_path_factory) -> Path:
    """The run as a Hugging Face GPT-2 directory (its tokenizer beside the weights)."""
    out = tmp_path_factory.mktemp("hf") / "model"
    assert main(["convert", "--to", "hf", "--checkpoint", str(run_dir), "--out", str(out)]) == 0
    return out


def test_a_hugging_face_model_is_measured_as_the_run_it_was_converted_from(
        run_dir, hf_dir, small_dataset, capsys):
    """eval reads a Hugging Face directory as sample does (it refused any model not trained
    here): the same weights on the same windows give the run's own losses."""
    assert main(["eval", "--checkpoint", str(run_dir), "--json"]) == 0
    own = json.loads(capsys.readouterr().out)
    assert main(["eval", "--checkpoint", str(hf_dir), "--dataset", str(small_dataset),
                 "--json"]) == 0
    converted = json.loads(capsys.readouterr().out)
    assert converted["step"] is None
    for key in ("train_loss", "val_loss"):
        assert converted[key] == pytest.approx(own[key], abs=1e-4)


def test_a_hugging_face_model_needs_a_dataset_of_its_tokenizer(hf_dir, tmp_path, capsys):
    from scratchgpt.data.prepare import prepare_text

    msg = error_of(capsys, ["eval", "--checkpoint", str(hf_dir)])
    assert "records no dataset" in msg and f"--tokenizer-from {hf_dir}" in msg
    prepare_text("text of another vocabulary, 0123456789 " * 30, tmp_path / "other", "char")
    msg = error_of(capsys, ["eval", "--checkpoint", str(hf_dir), "--dataset",
                            str(tmp_path / "other")])
    assert "tokenized differently" in msg and f"--tokenizer-from {hf_dir}" in msg


def test_a_converted_run_is_told_how_to_get_a_dataset(hf_dir, small_dataset, tmp_path,
                                                      capsys):
    """A run imported with convert --from hf records no dataset, as the directory did not: it
    was 'the checkpoint does not record its dataset; pass --dataset', naming neither the run
    nor how to prepare a text with its tokenizer, which the directory itself was told."""
    back = tmp_path / "back"
    assert main(["convert", "--from", "hf", str(hf_dir), "--out", str(back)]) == 0
    capsys.readouterr()
    msg = error_of(capsys, ["eval", "--checkpoint", str(back)])
    assert f"{back / 'best.pt'} records no dataset (it was converted from {hf_dir})" in msg, msg
    assert f"--tokenizer-from {back}" in msg, msg
    assert main(["eval", "--checkpoint", str(back), "--dataset", str(small_dataset),
                 "--max-tokens", "200"]) == 0
    # a dataset of another tokenizer: there is no dataset of the run's own to go back to (it
    # said "use the run's own dataset (see its config.json)", which records none)
    from scratchgpt.data.prepare import prepare_text

    prepare_text("text of another vocabulary, 0123456789 " * 30, tmp_path / "other", "char")
    msg = error_of(capsys, ["eval", "--checkpoint", str(back), "--dataset",
                            str(tmp_path / "other")])
    assert "own dataset" not in msg, msg
    assert f"it records no dataset; prepare the text with its tokenizer (scratchgpt prepare " \
           f"--data TEXT --tokenizer-from {back} --out DIR)" in msg, msg


def test_a_hugging_face_model_without_tokenizer_files_is_measured_with_a_note(
        hf_dir, small_dataset, tmp_path, capsys):
    """Nothing can say the dataset was tokenized as such a model was trained: a note says
    so, and ids past the model's vocabulary are refused (they would index past its
    embedding)."""
    import shutil

    from scratchgpt.data.prepare import prepare_text

    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(hf_dir / name, bare / name)
    assert main(["eval", "--checkpoint", str(bare), "--dataset", str(small_dataset),
                 "--max-tokens", "200"]) == 0
    assert "has no tokenizer files" in capsys.readouterr().err
    wide = "".join(chr(0x4E00 + i) for i in range(300))
    prepare_text(wide * 3, tmp_path / "wide", "char")
    msg = error_of(capsys, ["eval", "--checkpoint", str(bare), "--dataset",
                            str(tmp_path / "wide")])
    assert "more than the model's" in msg


def test_a_named_dataset_is_prepared_with_the_runs_tokenizer(run_dir, tmp_path, capsys,
                                                             monkeypatch):
    """eval --dataset NAME on a run of another vocabulary prepared the name with a tokenizer
    learned from its text into the cache, then refused it: two lines, and a cache entry no
    run could read. It is prepared with the run's own tokenizer (its own cache entry), once."""
    from scratchgpt.checkpoints import load_checkpoint
    from scratchgpt.data.dataset import TokenDataset
    from tests.corpus import play_text
    from tests.named_datasets import fake_named_dataset

    monkeypatch.setenv("SCRATCHGPT_CACHE_DIR", str(tmp_path / "cache"))
    fake_named_dataset(monkeypatch, tmp_path / "data", "tiny-other",
                       " 0123456789 " * 20 + play_text(20_000, seed=5))  # digits: not the run's
    own = load_checkpoint(run_dir).tokenizer()
    argv = ["eval", "--checkpoint", str(run_dir), "--dataset", "tiny-other", "--max-tokens",
            "100", "--json"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "val_loss" in json.loads(out) and "stand-in character" in err
    entries = list((tmp_path / "cache" / "datasets").iterdir())
    assert [e.name.rsplit("-", 1)[0] for e in entries] == ["tiny-other-char"], entries
    assert TokenDataset(entries[0]).tokenizer().same_as(own)
    assert main(argv) == 0  # the entry is used again, not prepared again
    assert "prepared" not in capsys.readouterr().err
    assert list((tmp_path / "cache" / "datasets").iterdir()) == entries


def test_a_hugging_face_model_reads_a_named_dataset_with_its_tokenizer(hf_dir, tmp_path,
                                                                       capsys, monkeypatch):
    from scratchgpt.checkpoints.hf import hf_tokenizer
    from scratchgpt.data.dataset import TokenDataset
    from tests.corpus import play_text
    from tests.named_datasets import fake_named_dataset

    monkeypatch.setenv("SCRATCHGPT_CACHE_DIR", str(tmp_path / "cache"))
    fake_named_dataset(monkeypatch, tmp_path / "data", "tiny-other",
                       " 0123456789 " * 20 + play_text(20_000, seed=5))
    assert main(["eval", "--checkpoint", str(hf_dir), "--dataset", "tiny-other",
                 "--max-tokens", "100"]) == 0
    [entry] = (tmp_path / "cache" / "datasets").iterdir()
    assert TokenDataset(entry).tokenizer().same_as(hf_tokenizer(hf_dir))


def test_the_output_says_how_many_tokens_each_split_had(run_dir, capsys, monkeypatch):
    """--max-tokens N did not say how many tokens were scored: N cut to whole windows (at
    least one), or the whole split where N is past it. Each split's count is the number of
    targets the loss was taken over, counted here as the evaluation reads them."""
    from scratchgpt.training import task

    seen: list[int] = []
    real = task.lm_loss

    def counting(logits, targets):
        seen.append(targets.numel())
        return real(logits, targets)

    monkeypatch.setattr(task, "lm_loss", counting)
    for max_tokens in (3 * BLOCK + 5, BLOCK - 1, 10**9):
        seen.clear()
        assert main(["eval", "--checkpoint", str(run_dir), "--json", "--split", "val",
                     "--max-tokens", str(max_tokens)]) == 0
        figures = json.loads(capsys.readouterr().out)
        assert figures["val_tokens"] == sum(seen) and figures["val_tokens"] % BLOCK == 0
        seen.clear()
        assert main(["eval", "--checkpoint", str(run_dir), "--max-tokens",
                     str(max_tokens)]) == 0
        lines = capsys.readouterr().out.splitlines()[1:3]
        counts = [int(ln.split()[-2].replace(",", "")) for ln in lines]
        assert [ln.split()[0] for ln in lines] == ["train", "val"]
        assert counts[1] == figures["val_tokens"] and sum(counts) == sum(seen)
        assert all(ln.endswith(" tokens") for ln in lines)
    assert figures["val_tokens"] > 3 * BLOCK  # 10**9: the whole split, not the 10**9 named


@pytest.mark.parametrize("flags,terminal,shown", [
    ([], True, True), (["--no-progress"], True, False), ([], False, False)])
def test_eval_shows_each_splits_progress_unless_told_not_to(run_dir, capsys, monkeypatch,
                                                            flags, terminal, shown):
    """A large split takes minutes (a million training tokens took five on a busy machine),
    which eval spent printing nothing. Each split has a bar on stderr by tokens once it has
    run for a second (here at once), as prepare's slow steps do; stdout keeps the figures.
    As train's bars, drawn on a terminal only: a log file or a pipe got every redraw."""
    from tqdm import tqdm

    from scratchgpt import bars

    monkeypatch.setattr(bars, "PROGRESS_DELAY_S", 0.0)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: terminal)
    assert main(["eval", "--checkpoint", str(run_dir), "--json", *flags]) == 0
    out, err = capsys.readouterr()
    figures = json.loads(out)
    for split in ("train", "val"):
        done = f"{split} split: 100%"
        assert (done in err) is shown, err
        if shown:  # counted in tokens, to the split's last one
            tokens = tqdm.format_sizeof(figures[f"{split}_tokens"])
            line = err[err.index(done):].splitlines()[0].split("\r")[0]
            assert f" {tokens}/{tokens} " in line and "token/s" in line, line


def test_eval_runs_on_the_threads_it_is_given(run_dir, capsys, monkeypatch):
    """eval had no --threads, where train has one: on a busy 2-core machine torch's default
    of two threads evaluated 40k tokens in 12-16 s against 2 s on one, and only OMP_NUM_THREADS
    could say so. By default torch's choice stands, as train's; a count it cannot be is
    refused in one line."""
    import torch

    set_to: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", set_to.append)  # (this process's threads)
    argv = ["eval", "--checkpoint", str(run_dir), "--split", "val", "--json"]
    assert main(argv) == 0
    default = json.loads(capsys.readouterr().out)
    assert set_to == []
    assert main([*argv, "--threads", "1"]) == 0
    assert set_to == [1] and json.loads(capsys.readouterr().out) == default
    assert "--threads" in error_of(capsys, [*argv, "--threads", "-1"])
