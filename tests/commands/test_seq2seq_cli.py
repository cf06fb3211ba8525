"""`scratchgpt seq2seq` and `scratchgpt experiment` end to end, with tiny settings."""

import csv
import functools
import json
import re
import shutil
from dataclasses import dataclass, field

import pytest
import torch

from scratchgpt.checkpoints import load_checkpoint
from scratchgpt.cli import main
from tests.cli_errors import error_of

TINY = ["--n-train", "300", "--n-test", "40", "--steps", "15", "--d-model", "16",
        "--batch-size", "32", "--warmup", "3", "--no-progress", "--threads", "1"]
TSV_TINY = TINY[4:]  # a --data file's pairs are its lines: no --n-train, --n-test
WORDS = ["abc", "bca", "cab", "aab", "bba", "cca", "acb", "bac", "cba", "abb"]


def reversal_rows(times: int) -> list[str]:
    """The TSV lines of ``WORDS * times``, each word with a digit (so sources differ), then
    its reversal."""
    return [f"{w}{i % 7}\t{w[::-1]}\n" for i, w in enumerate(WORDS * times)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt")
    rc = main(["seq2seq", "train", "--task", "dates", "--arch", "transformer",
               "--out", str(out), *TINY])
    assert rc == 0
    return out


def test_train_writes_a_run_directory(checkpoint):
    info = json.loads((checkpoint / "config.json").read_text())
    assert info["model"]["type"] == "seq2seq" and info["model"]["arch"] == "transformer"
    assert info["model"]["d_model"] == 16
    assert info["data"]["seq2seq"]["task"] == "dates"
    assert info["train"]["max_iters"] == 15 and info["train"]["warmup_iters"] == 3
    for name in ("last.pt", "best.pt", "metrics.csv", "loss.png"):
        assert (checkpoint / name).is_file(), name
    ckpt = load_checkpoint(checkpoint / "last.pt")
    assert ckpt.state.step == 15
    assert "<" not in "".join(ckpt.tokenizer("source").chars)  # specials are implicit
    assert not list(checkpoint.glob(".*tmp*"))  # atomic write left no temp file


def test_a_run_is_refused_then_resumed_and_extended(checkpoint, tmp_path, capsys):
    out = shutil.copytree(checkpoint, tmp_path / "run")  # a run of these very settings
    args = ["seq2seq", "train", "--task", "dates", "--out", str(out), *TINY]
    assert main(args) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert main(["seq2seq", "train", "--out", str(out), "--resume", "--max-iters", "20",
                 "--no-progress"]) == 0
    assert load_checkpoint(out / "last.pt").state.step == 20


def test_resuming_a_finished_run_says_it_is_finished(checkpoint, tmp_path, capsys):
    """A run resumed at its --max-iters trains no more: it printed a blank line (no final
    evaluation, so no table) and the last summary, as if it had trained."""
    import shutil

    run = shutil.copytree(checkpoint, tmp_path / "run")
    capsys.readouterr()
    assert main(["seq2seq", "train", "--out", str(run), "--resume", "--no-progress"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (f"note: {run} is already at step 15 of --max-iters 15; pass a "
                        "larger --max-iters to train it further")
    assert lines[1].startswith("15 steps in ") and len(lines) == 2, lines
    assert load_checkpoint(run / "last.pt").state.step == 15


def test_a_resume_refused_at_the_lock_says_no_start_of_run_note(checkpoint, tmp_path,
                                                                capsys):
    """A finished run resumed while another process writes it printed its note (nothing
    left to train) before the lock refused it, as if it were about to run."""
    import shutil

    from scratchgpt.checkpoints.rundir import RunDir

    run = shutil.copytree(checkpoint, tmp_path / "run")
    capsys.readouterr()
    with RunDir(run).lock():  # (another process writing the run)
        code = main(["seq2seq", "train", "--out", str(run), "--resume", "--no-progress"])
    said = capsys.readouterr()
    assert code == 2 and "is in use by process" in said.err and said.out == "", said


def test_attention_figure_has_a_colour_scale():
    """The heatmap was shades of grey with no scale, each figure stretched to its own largest
    weight: how much attention a shade meant could not be read off it."""
    import numpy as np

    from scratchgpt.viz import alignment_figure, pyplot

    plt = pyplot()
    weights = np.array([[0.9, 0.1, 0.0], [0.2, 0.3, 0.5]])
    fig = alignment_figure(weights, ["a", "b", "<eos>"], ["x", "<eos>"], "lstm: 'ab' -> 'x'")
    try:
        heat, bar = fig.axes
        assert bar.get_ylabel() == "attention weight"
        image = heat.get_images()[0]
        assert image.get_clim() == (0.0, 1.0)  # one scale for every figure, as `attention`'s
        assert [t.get_text() for t in heat.get_xticklabels()] == ["a", "b", "<eos>"]
    finally:
        plt.close(fig)


def test_attention_title_stays_within_the_figure():
    """A long translation over a short source ran off both edges of the figure's title."""
    import numpy as np

    from scratchgpt.viz import alignment_figure, pyplot

    plt = pyplot()
    title = "transformer: 'abc' -> '" + "v" * 60 + "'"
    fig = alignment_figure(np.full((64, 4), 0.25), [*"abc", "<eos>"], ["v"] * 64, title)
    try:
        fig.canvas.draw()
        shown, frame = fig.axes[0].title, fig.bbox
        box = shown.get_window_extent()
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1, (box, frame)
        assert shown.get_text().replace("\n", "").replace(" ", "") == title.replace(" ", "")
    finally:
        plt.close(fig)


@pytest.mark.parametrize("flags, drawn", [
    ([], "decoder layer 1, mean of 4 heads"),
    (["--layer", "0", "--head", "-1"], "decoder layer 0, head 3"),
    (["--head", "2"], "decoder layer 1, head 2"),
])
def test_a_transformers_alignment_title_names_the_layer_and_head_drawn(
        cli_main, checkpoint, tmp_path, monkeypatch, flags, drawn):
    """The figures of two layers or heads of a transformer had the same title,
    'transformer: SOURCE -> OUTPUT': which attention a figure showed was not in it."""
    from scratchgpt import viz

    titles = []
    real = viz.alignment_figure

    def spy(weights, source, output, title=""):
        titles.append(title)
        return real(weights, source, output, title)

    monkeypatch.setattr(viz, "alignment_figure", spy)
    assert cli_main(["seq2seq", "attention", "--checkpoint", str(checkpoint), "--source",
                     "3 mar 99", "--out", str(tmp_path / "a.png"), *flags]) == 0
    assert len(titles) == 1 and titles[0].startswith(f"transformer, {drawn}: '3 mar 99' -> ")


def test_a_long_alignment_is_drawn_at_a_readable_size(tmp_path):
    """The figure grew with the tokens: a source of 480 characters drew a 20,502 x 12,744 PNG
    in 1m45s, a label per token. It stops growing at ALIGNMENT_MAX_INCHES and labels every
    k-th token where all would not be readable; a short one is drawn as before."""
    import numpy as np
    from PIL import Image

    from scratchgpt.viz import (
        ALIGNMENT_MAX_INCHES,
        LABELS_PER_INCH,
        alignment_figure,
        save_figure,
    )

    source = [chr(ord("a") + i % 26) for i in range(479)] + ["<eos>"]
    output = ["x"] * 299 + ["<eos>"]
    weights = np.random.default_rng(0).dirichlet(np.ones(len(source)), len(output))
    fig = alignment_figure(weights, source, output, "transformer: " + "v" * 300)
    width, height = fig.get_size_inches()
    assert (width, height) == ALIGNMENT_MAX_INCHES
    heat = fig.axes[0]
    shown = [t.get_text() for t in heat.get_xticklabels()]
    k = int(heat.get_xticks()[1])  # every k-th source token is labelled, from the first
    assert 40 <= len(shown) <= LABELS_PER_INCH * width and shown == source[::k]
    assert len(heat.get_yticklabels()) <= LABELS_PER_INCH * height
    out = save_figure(fig, tmp_path / "long.png", dpi=120)
    assert Image.open(out).size == (int(width * 120), int(height * 120))

    short = alignment_figure(weights[:8, :10], source[:10], output[:8])
    assert [t.get_text() for t in short.axes[0].get_xticklabels()] == source[:10]
    assert Image.open(save_figure(short, tmp_path / "short.png", dpi=120)).size == (720, 480)


@pytest.mark.parametrize("action", [["translate", "--source", "1 may"], ["eval"],
                                    ["attention", "--source", "1 may", "--out", "a.png"]])
def test_length_penalty_without_a_beam_is_refused(checkpoint, tmp_path, monkeypatch, capsys,
                                                  action):
    """Greedy decoding (--beam 1, the default) scores no hypotheses: --length-penalty was
    taken and changed nothing; `sample` refused it already."""
    monkeypatch.chdir(tmp_path)
    for beam in ([], ["--beam", "1"]):
        err = error_of(capsys, ["seq2seq", *action, "--checkpoint", str(checkpoint), *beam,
                                "--length-penalty", "0.5"])
        assert "--length-penalty scores beam search's hypotheses; it goes with --beam N > 1" \
            in err, err
    assert not (tmp_path / "a.png").exists()


def test_eval_names_the_characters_the_model_never_saw(cli_main, checkpoint, tmp_path, capsys):
    """Pairs of another kind than the training's scored 0% with no word why: translate
    noted unseen source characters, eval did not, nor target characters no output holds."""
    pairs = tmp_path / "odd.tsv"
    pairs.write_text("3 march 1999 ☃\t1999-03-03\n4 may 2000\t2000-05-04☃\n", encoding="utf-8")
    capsys.readouterr()
    assert cli_main(["seq2seq", "eval", "--checkpoint", str(checkpoint), "--data", str(pairs),
                     "--show-errors", "0"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == ["note: 1 source character the model never saw, read as <unk>: '☃'",
                   "note: 1 target character the model never wrote in training (a target "
                   "holding one cannot be matched): '☃'"], err
    assert cli_main(["seq2seq", "eval", "--checkpoint", str(checkpoint), "--limit", "5"]) == 0
    assert "target character" not in capsys.readouterr().err  # its own dates: all written


def test_translate_says_which_translations_max_len_cut(cli_main, checkpoint, capsys):
    """An output that ran out of --max-len before <eos> was printed as if it were finished."""
    from scratchgpt.checkpoints import load_model
    from scratchgpt.training.seq2seq import translate

    model, source = load_model(str(checkpoint))
    src_tok, tgt_tok = source.checkpoint.tokenizer("source"), source.checkpoint.tokenizer("target")
    sources = ["3 march 1999", "12/10/2001", "1 may 2000"]
    notes = {}
    for max_len in (1, 3, 64):
        _, ids, _ = translate(model, sources, src_tok, tgt_tok, 1, max_len)
        cut = [n for n, row in enumerate(ids, start=1) if row[-1] != model.config.eos_id]
        capsys.readouterr()
        assert cli_main(["seq2seq", "translate", "--checkpoint", str(checkpoint),
                         "--max-len", str(max_len), *(f"--source={s}" for s in sources)]) == 0
        said = capsys.readouterr()
        assert len(said.out.splitlines()) == len(sources)
        notes[max_len] = said.err
        if cut:
            numbers = ", ".join(map(str, cut))
            assert f"{numbers} of 3 {'was' if len(cut) == 1 else 'were'} cut at --max-len " \
                   f"{max_len}, before <eos>" in said.err, said.err
        else:
            assert "cut at" not in said.err, said.err
    assert "translations 1, 2, 3 of 3 were cut at --max-len 1" in notes[1]  # no date is 0 long
    assert cli_main(["seq2seq", "translate", "--checkpoint", str(checkpoint), "--max-len", "1",
                     "--source", "3 march 1999"]) == 0
    assert capsys.readouterr().err == "note: the translation was cut at --max-len 1, before <eos>\n"


def test_a_blank_source_is_refused_as_an_empty_one_is(cli_main, checkpoint, tmp_path,
                                                      capsys):
    """A --source of spaces alone was decoded into whatever the model writes for nothing,
    with no word, where an empty one is refused: it is refused too, before the model is read
    and before any figure is written."""
    missing = str(tmp_path / "no-run")  # (refused before the checkpoint is looked at)
    for sources, says in ((["   "], "the source is blank (whitespace only); give text to "
                                    "translate"),
                          (["1 may", "\t "], "source 2 of 2 is blank (whitespace only); give "
                                             "text to translate")):
        err = error_of(capsys, ["seq2seq", "translate", "--checkpoint", missing,
                                *(f"--source={s}" for s in sources)])
        assert err.endswith(says), err
    figure = tmp_path / "heat.png"
    err = error_of(capsys, ["seq2seq", "attention", "--checkpoint", missing, "--source", "  ",
                            "--out", str(figure)])
    assert err.endswith("the source is blank (whitespace only); give text to translate"), err
    assert not figure.exists()
    assert cli_main(["seq2seq", "translate", "--checkpoint", str(checkpoint),
                     "--source", " 1 may 2000 "]) == 0  # (spaces around text are text)


def test_a_note_of_many_cut_translations_counts_the_rest(capsys):
    """The notes of the translations --max-len or a stop cut short listed every number, up
    to 256 of a batch: they list the first few and count the others."""
    from scratchgpt.commands.seq2seq import NUMBERS_SHOWN, note_cut

    eos = 2
    for cut in ([3, 7, 9], list(range(1, NUMBERS_SHOWN + 1)), list(range(1, 301, 2))):
        ids = [[5, 6] if n in cut else [5, eos] for n in range(1, 301)]
        note_cut(ids, 300, eos, 64)
        err = capsys.readouterr().err
        shown = ", ".join(map(str, cut[:NUMBERS_SHOWN]))
        more = f" and {len(cut) - NUMBERS_SHOWN} more" if len(cut) > NUMBERS_SHOWN else ""
        assert err == f"note: translations {shown}{more} of 300 were cut at --max-len 64, " \
                      "before <eos>\n", err
    assert "1, 3, 5, 7, 9 and 145 more of 300" in err  # (the last: 150 cut, 5 of them shown)


def test_a_header_line_is_said_to_be_read_as_a_pair(cli_main, tmp_path, capsys):
    """A TSV whose first line names its columns ('source<TAB>target') was trained on with
    that line as a pair, with no word: a note says so, by train and by eval --data."""
    pairs = tmp_path / "rev.tsv"
    pairs.write_text("Source\tTarget\n" + "".join(reversal_rows(4)))
    out = tmp_path / "run"
    note = f"note: {pairs}:1 'Source<TAB>Target' is read as a pair; if it is a header, remove it"
    assert cli_main(["seq2seq", "train", "--data", str(pairs), "--arch", "lstm", "--out",
                     str(out), *TSV_TINY]) == 0
    assert capsys.readouterr().err.count(note) == 1
    assert cli_main(["seq2seq", "eval", "--checkpoint", str(out), "--data", str(pairs)]) == 0
    assert capsys.readouterr().err.count(note) == 1
    pairs.write_text("".join(reversal_rows(4)))  # no header: no note
    assert cli_main(["seq2seq", "eval", "--checkpoint", str(out), "--data", str(pairs)]) == 0
    assert "header" not in capsys.readouterr().err


# ten sources, which translate decodes in three batches once its batch is 4 (_decodes_seen)
SOURCES = ["abcde", "xyz", "hello", "world", "seq", "two", "quick", "brown", "fox", "jumps"]


@pytest.fixture(scope="module")
def reversal_run(tmp_path_factory):
    """A --task reverse model trained long enough that its translations of SOURCES differ,
    and that some end before the default --max-len and some (with --beam 3) do not."""
    out = tmp_path_factory.mktemp("reverse")
    assert main(["seq2seq", "train", "--task", "reverse", "--arch", "transformer", "--out",
                 str(out), *TINY[:4], "--steps", "60", *TINY[6:]]) == 0
    return out


@functools.cache
def _reference(run, beam: int) -> tuple[list[str], list[str], list[list[int]]]:
    """(lines, notes, ids) of :func:`_translated`. Decoded once per run and beam (a beam of 3
    takes seconds): the tests read the module's run and never change it, and each asks for it
    before it patches the decoder."""
    from scratchgpt.checkpoints import load_model
    from scratchgpt.training.seq2seq import translate

    model, source = load_model(str(run))
    tokens = source.checkpoint.tokenizer("source"), source.checkpoint.tokenizer("target")
    texts, ids, _ = translate(model, SOURCES, *tokens, beam, 64, batch_size=4)
    eos = model.config.eos_id
    notes = []
    for printed in (0, 4, 8, 10):
        cut = [n for n, row in enumerate(ids[:printed], start=1) if row[-1] != eos]
        which = (f"translation {cut[0]} of 10 was" if len(cut) == 1 else
                 f"translations {', '.join(map(str, cut))} of 10 were")
        notes.append(f"note: {which} cut at --max-len 64, before <eos>\n" if cut else "")
    return [f"{text}\n" for text in texts], notes, ids


def _translated(run, beam: int) -> tuple[list[str], list[str]]:
    """(lines, notes) of translating SOURCES all at once, 4 sources a batch: the lines the
    command printed before it printed each batch as decoded, and the note (stderr) of the
    translations --max-len cut, once 0, 4, 8 and all 10 of them are printed."""
    lines, notes, _ = _reference(run, beam)
    return list(lines), list(notes)


def _decodes_seen(monkeypatch, capsys, stop_at: int, stop: type[BaseException]) -> list[str]:
    """translate decodes 4 sources a batch, and the model's decode of batch ``stop_at`` (from
    0) raises ``stop``; returns the stdout the command had written when each decode began
    (it is taken from capsys)."""
    from scratchgpt.commands import seq2seq as command
    from scratchgpt.models.seq2seq import TransformerSeq2Seq

    monkeypatch.setattr(command, "TRANSLATE_BATCH", 4)
    seen: list[str] = []
    for name in ("greedy_decode", "beam_decode"):
        real = getattr(TransformerSeq2Seq, name)

        def decode(self, *args, real=real, **kwargs):
            seen.append(capsys.readouterr().out)
            if len(seen) > stop_at:
                raise stop
            return real(self, *args, **kwargs)

        monkeypatch.setattr(TransformerSeq2Seq, name, decode)
    return seen


@pytest.mark.parametrize("beam", [1, 3])
def test_translate_prints_each_batch_once_it_is_decoded(cli_main, reversal_run, capsys,
                                                       monkeypatch, beam):
    """Sources of several batches are printed a batch at a time, each before the next is
    decoded, and the whole is what decoding them all at once gives, line for line (the lines
    were printed only once every batch was decoded)."""
    lines, notes = _translated(reversal_run, beam)
    assert len(set(lines)) > 5  # (the order of the lines shows)
    seen = _decodes_seen(monkeypatch, capsys, stop_at=99, stop=KeyboardInterrupt)
    assert cli_main(["seq2seq", "translate", "--checkpoint", str(reversal_run), "--beam",
                     str(beam), *(f"--source={s}" for s in SOURCES)]) == 0
    said = capsys.readouterr()
    assert "".join(seen) + said.out == "".join(lines)
    assert seen == ["", "".join(lines[:4]), "".join(lines[4:8])]  # one batch at a time
    assert said.err == notes[-1]


@pytest.mark.parametrize("beam", [1, 3])
@pytest.mark.parametrize(("stop", "code", "word"), [(KeyboardInterrupt, 130, "interrupted"),
                                                     ("Terminated", 143, "terminated")])
def test_translate_stopped_keeps_the_batches_it_printed(cli_main, reversal_run, capsys,
                                                        monkeypatch, beam, stop, code, word):
    """Ctrl-C or SIGTERM while batch k is decoded: the k batches before stay printed (nothing
    was: every translation was lost), the notes name the translations among them --max-len
    cut and how many of the sources were translated, and the command ends as sample does."""
    from scratchgpt.errors import Terminated

    stop = Terminated if stop == "Terminated" else stop
    lines, notes = _translated(reversal_run, beam)
    for k in range(3):
        with monkeypatch.context() as patch:
            seen = _decodes_seen(patch, capsys, stop_at=k, stop=stop)
            assert cli_main(["seq2seq", "translate", "--checkpoint", str(reversal_run),
                             "--beam", str(beam), *(f"--source={s}" for s in SOURCES)]) == code
        said = capsys.readouterr()
        assert "".join(seen) + said.out == "".join(lines[:4 * k]), k
        assert said.err == (f"{notes[k]}note: translated {4 * k} of 10 sources before the "
                            f"stop\nscratchgpt seq2seq translate: {word}\n")


def _stop_at_step(monkeypatch, batch: int, step: int, signum: int) -> None:
    """translate decodes 4 sources a batch, and ``signum`` comes (as a user's Ctrl-C or
    SIGTERM comes: the house's interrupt_at sends one to training) once batch ``batch``
    (from 0) has decoded ``step`` tokens."""
    import os

    from scratchgpt.commands import seq2seq as command
    from scratchgpt.models.seq2seq import TransformerSeq2Seq as Seq2Seq

    monkeypatch.setattr(command, "TRANSLATE_BATCH", 4)
    real_start, real_step = Seq2Seq.start, Seq2Seq.next_token_logp
    calls = {"batches": 0, "steps": 0}

    def start(self, *args):
        calls["batches"] += 1
        calls["steps"] = 0
        return real_start(self, *args)

    def next_token_logp(self, *args):
        if calls["batches"] == batch + 1 and calls["steps"] == step:
            os.kill(os.getpid(), signum)
        calls["steps"] += 1
        return real_step(self, *args)

    monkeypatch.setattr(Seq2Seq, "start", start)
    monkeypatch.setattr(Seq2Seq, "next_token_logp", next_token_logp)


def _a_step_where_one_has_ended(model, sources: list[str], checkpoint, beam: int) -> int:
    """The first step of decoding ``sources`` as one batch after which some of them have
    ended (greedy: reached <eos>; beam: their search is over) and some have not."""
    from scratchgpt.tokenizers.seq2seq import EOS_ID
    from scratchgpt.training.seq2seq import collate

    steps: list[list[bool]] = []

    class Steps(list):  # the decode's out=: what each step leaves, kept step by step
        def __setitem__(self, where, rows):
            steps.append([whole for _, whole in rows])
            super().__setitem__(where, rows)

    src_tok = checkpoint.tokenizer("source")
    src, lengths, _, _ = collate([(src_tok.encode(s) + [EOS_ID], []) for s in sources])
    if beam == 1:
        model.greedy_decode(src, lengths, 64, out=Steps())
    else:
        model.beam_decode(src, lengths, beam, 64, out=Steps())
    return next(n for n, whole in enumerate(steps, start=1) if any(whole) and not all(whole))


def _numbers_cut_by_the_stop(err: str) -> list[int]:
    """The translations the note of a stop names as cut by it (counted from 1)."""
    found = re.search(r"^note: translations? ([\d, ]+) of 10 (?:was|were) cut short by the "
                      r"stop$", err, re.M)
    return [int(n) for n in found.group(1).split(", ")] if found else []


@pytest.mark.parametrize("beam", [1, 3])
@pytest.mark.parametrize(("signum", "code"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_translate_stopped_in_a_batch_prints_what_it_had_decoded(
        cli_main, reversal_run, capsys, monkeypatch, beam, signum, code):
    """Ctrl-C while a batch was part-way lost all of its lines, those that had ended among
    them: they are printed, each as far as it was decoded (greedy: its tokens so far; beam:
    the hypothesis the search held), a note numbers the ones the stop cut, and each line
    stays the line of its source. The batches before stay printed as they were."""
    import signal

    from scratchgpt.checkpoints import load_model

    model, source = load_model(str(reversal_run))
    tgt_tok = source.checkpoint.tokenizer("target")
    lines, _, ids = _reference(reversal_run, beam)
    batch = 2  # the last batch, sources 9 and 10
    step = _a_step_where_one_has_ended(model, SOURCES[8:], source.checkpoint, beam)
    _stop_at_step(monkeypatch, batch, step, getattr(signal, signum))
    assert cli_main(["seq2seq", "translate", "--checkpoint", str(reversal_run), "--beam",
                     str(beam), *(f"--source={s}" for s in SOURCES)]) == code
    said = capsys.readouterr()
    printed = said.out.splitlines(keepends=True)
    stopped = _numbers_cut_by_the_stop(said.err)
    assert len(printed) == 10 and printed[:8] == lines[:8], said.out
    assert 1 <= len(stopped) < 2 and all(n > 8 for n in stopped), said.err  # (the case at hand)
    for n in (9, 10):
        if n not in stopped:  # ended: as the whole decode gives it
            assert printed[n - 1] == lines[n - 1], n
        elif beam == 1:  # the tokens it had
            assert printed[n - 1] == tgt_tok.decode(ids[n - 1][:step]) + "\n", n
    assert said.err.endswith(f"note: translated {10 - len(stopped)} of 10 sources before the "
                             f"stop\nscratchgpt seq2seq translate: "
                             f"{'interrupted' if signum == 'SIGINT' else 'terminated'}\n")


def test_eval_stopped_scores_the_pairs_it_had_decoded(cli_main, checkpoint, capsys,
                                                      monkeypatch):
    """Ctrl-C in eval lost every pair decoded (minutes of them with --eval-pairs 0 on 2,000):
    the batches decoded are scored and printed, with a line saying how many of the pairs,
    then the command ends as translate does."""
    import signal

    argv = ["seq2seq", "eval", "--checkpoint", str(checkpoint), "--show-errors", "0"]
    assert cli_main([*argv, "--eval-pairs", "8"]) == 0
    table = capsys.readouterr().out.splitlines()[:-1]  # (the last line: which 8 they are)
    _stop_at_step(monkeypatch, 2, 0, signal.SIGINT)  # as the third batch of 4 begins
    assert cli_main([*argv, "--eval-pairs", "0"]) == 130
    said = capsys.readouterr()
    assert said.out.splitlines() == [*table, "(the first 8 of the 40 held-out pairs, decoded "
                                              "before the stop)"], said.out
    assert said.err.endswith("scratchgpt seq2seq eval: interrupted\n"), said.err


def test_translate_reads_its_sources_from_a_file_or_standard_input(cli_main, checkpoint,
                                                                   tmp_path, capsys,
                                                                   monkeypatch):
    """Many sources could only be typed as as many --source flags: --source-file FILE (or -,
    standard input) translates every line, a line out for each line in, as the same
    --source flags do; an empty line, which would shift every later output off its source,
    is refused by its number before the model is read."""
    import io
    import sys

    sources = ["3 march 1999", "12/10/2001", "1 may 2000"]
    assert cli_main(["seq2seq", "translate", "--checkpoint", str(checkpoint),
                     *(f"--source={s}" for s in sources)]) == 0
    flags = capsys.readouterr().out
    assert len(flags.splitlines()) == 3
    listed = tmp_path / "sources.txt"
    listed.write_bytes("\r\n".join(sources).encode())  # (Windows line ends, no last one)
    assert cli_main(["seq2seq", "translate", "--checkpoint", str(checkpoint),
                     "--source-file", str(listed)]) == 0
    assert capsys.readouterr().out == flags
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(
        "\n".join(sources).encode() + b"\n")))
    assert cli_main(["seq2seq", "translate", "--checkpoint", str(checkpoint),
                     "--source-file", "-"]) == 0
    assert capsys.readouterr().out == flags
    listed.write_text("3 march 1999\n\n1 may 2000\n")
    blank = tmp_path / "blank.txt"
    blank.write_text("3 march 1999\n1 may 2000\n \t \n")  # (translated into junk, no word)
    for name, says in ((listed, f"source file {listed}, line 2: empty line; each line is a "
                                "source to translate (remove the empty and blank lines)"),
                       (blank, f"source file {blank}, line 3: blank line (whitespace only); "
                               "each line is a source to translate (remove the empty and "
                               "blank lines)"),
                       (tmp_path / "none.txt", f"source file {tmp_path / 'none.txt'} does not "
                                               "exist")):
        err = error_of(capsys, ["seq2seq", "translate", "--checkpoint", str(tmp_path / "no-run"),
                                "--source-file", str(name)])  # (refused before the model)
        assert err.endswith(says), err


def test_eval_says_how_many_mistakes_it_did_not_show(cli_main, checkpoint, capsys):
    """The list of mistakes stopped at --show-errors (5 unless given) with no word that
    there were more; the rest are now counted."""
    argv = ["seq2seq", "eval", "--checkpoint", str(checkpoint), "--eval-pairs", "12"]
    assert cli_main([*argv, "--show-errors", "100"]) == 0
    out = capsys.readouterr().out
    mistakes = [line for line in out.splitlines() if line.startswith("  '")]
    correct = int(re.search(r"^exact match \S+ \((\d+)/12\)$", out, re.M).group(1))
    assert len(mistakes) == 12 - correct >= 4  # (the case at hand: an untrained model)
    assert "more mistake" not in out  # every one shown
    assert cli_main([*argv, "--show-errors", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-3:] == [*mistakes[:2], f"  ... and {len(mistakes) - 2} more mistakes "
                                         "(--show-errors N shows more)"]
    assert cli_main([*argv, "--show-errors", "0"]) == 0
    assert "more mistake" not in capsys.readouterr().out  # none asked for, none counted


def test_a_bad_source_in_a_later_batch_is_refused_before_any_is_printed(cli_main, reversal_run,
                                                                        capsys, monkeypatch):
    """Every source is checked before the first batch is decoded: an empty one in the last
    batch is one error line, with no translation printed before it."""
    seen = _decodes_seen(monkeypatch, capsys, stop_at=0, stop=AssertionError)
    code = cli_main(["seq2seq", "translate", "--checkpoint", str(reversal_run),
                     *(f"--source={s}" for s in SOURCES), "--source="])
    said = capsys.readouterr()
    assert code == 2 and seen == [] and said.out == ""
    assert said.err == ("scratchgpt seq2seq translate: error: a source is empty; give text to "
                        "translate\n")


def test_translate_eval_and_attention(cli_main, checkpoint, tmp_path, capsys, monkeypatch):
    from scratchgpt.training import seq2seq as seq2seq_training

    capsys.readouterr()
    assert cli_main(["seq2seq", "translate", "--checkpoint", str(checkpoint),
                     "--source", "3 march 1999", "--source", "12/10/2001", "--beam", "2"]) == 0
    said = capsys.readouterr()
    assert len(said.out.splitlines()) == 2 and "never saw" not in said.err
    # characters no date was written with are read as <unk>: translated, with a note saying so
    assert cli_main(["seq2seq", "translate", "--checkpoint", str(checkpoint),
                     "--source", "3 march ☃ 1999 Ω☃"]) == 0
    said = capsys.readouterr()
    assert len(said.out.splitlines()) == 1
    assert said.err == ("note: 2 source characters the model never saw, read as <unk>: "
                        "'Ω' '☃'\n")

    assert cli_main(["seq2seq", "eval", "--checkpoint", str(checkpoint), "--limit", "20"]) == 0
    out = capsys.readouterr().out
    assert "exact match" in out and "/20)" in out and "source chars" in out
    penalties = []
    real = seq2seq_training.translate

    def spy(*args, length_penalty=1.0, **kwargs):
        penalties.append(length_penalty)
        return real(*args, length_penalty=length_penalty, **kwargs)

    monkeypatch.setattr(seq2seq_training, "translate", spy)
    assert cli_main(["seq2seq", "eval", "--checkpoint", str(checkpoint), "--limit", "4",
                     "--beam", "2", "--length-penalty", "0.5"]) == 0
    assert penalties == [0.5]  # eval decodes as translate does with the same flags
    capsys.readouterr()

    png = tmp_path / "heat.png"
    assert cli_main(["seq2seq", "attention", "--checkpoint", str(checkpoint),
                     "--source", "3 mar 99", "--out", str(png), "--layer", "0",
                     "--head", "1"]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    said = capsys.readouterr().out.splitlines()  # the translation, then the figure written
    assert said[0].startswith("'3 mar 99' -> ") and said[1].startswith(f"wrote {png}: ")
    drawn = png.read_bytes()  # a figure already there is replaced only with --overwrite
    assert cli_main(["seq2seq", "attention", "--checkpoint", str(checkpoint),
                     "--source", "x", "--out", str(png)]) == 2
    assert capsys.readouterr().err.endswith("already exists; pass --overwrite to replace it\n")
    assert png.read_bytes() == drawn

    assert cli_main(["seq2seq", "attention", "--checkpoint", str(checkpoint), "--overwrite",
                     "--source", "x", "--out", str(png), "--head", "9"]) == 2
    assert "--head must be in" in capsys.readouterr().err
    # negative indices count from the last, for heads as for layers (and as in `attention`)
    assert cli_main(["seq2seq", "attention", "--checkpoint", str(checkpoint), "--overwrite",
                     "--source", "3 mar 99", "--out", str(png), "--layer", "-1",
                     "--head", "-1"]) == 0
    capsys.readouterr()
    assert cli_main(["seq2seq", "attention", "--checkpoint", str(checkpoint), "--overwrite",
                     "--source", "x", "--out", str(png), "--layer", "-9"]) == 2
    assert "negative from the end" in capsys.readouterr().err
    # a character the figure's font lacks (in the title here) is noted once, not warned of
    assert cli_main(["seq2seq", "attention", "--checkpoint", str(checkpoint), "--overwrite",
                     "--source", "3 mar 99 你", "--out", str(png)]) == 0
    assert capsys.readouterr().err.endswith(
        f"note: 1 character has no glyph in the font of {png} and shows as boxes: 你\n")

    for action in (["translate", "--source", "x"], ["eval"]):
        with pytest.raises(SystemExit) as stop:
            cli_main(["seq2seq", *action, "--checkpoint", str(checkpoint), "--beam", "2",
                      "--length-penalty", "nan"])
        assert stop.value.code == 2 and "finite" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:  # a negative count would slice from the end
        cli_main(["seq2seq", "eval", "--checkpoint", str(checkpoint), "--show-errors", "-2"])
    assert stop.value.code == 2 and "--show-errors" in capsys.readouterr().err

    assert cli_main(["seq2seq", "attention", "--checkpoint", str(checkpoint),
                     "--source", "x", "--out", str(tmp_path / "heat.xyz")]) == 2
    assert "'.xyz' is not an image format" in capsys.readouterr().err


def test_tsv_error_is_one_line_with_file_and_line(cli_main, tmp_path, capsys):
    bad = tmp_path / "pairs.tsv"
    bad.write_text("one\tun\ntwo deux\n", encoding="utf-8")
    rc = cli_main(["seq2seq", "train", "--data", str(bad), "--arch", "lstm",
                   "--out", str(tmp_path / "o"), *TSV_TINY])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert f"{bad}:2:" in err and "TAB" in err


def test_pairs_of_few_sources_are_told_why_none_was_held_out(cli_main, tmp_path, capsys):
    """A label-first file (classify's, 'ham<TAB>text') was refused as holding out none of
    its 5,574 pairs, 'give more pairs': the split goes by source, and its two sources each
    keep all their pairs on one side, however many there are. The refusal says so."""
    pairs = tmp_path / "labels.tsv"
    pairs.write_text("".join(f"{'ab'[i % 2]}\tsome text {i}\n" for i in range(1200)))
    err = error_of(capsys, ["seq2seq", "train", "--data", str(pairs), "--out",
                            str(tmp_path / "run"), *TSV_TINY])
    assert err.endswith(f"{pairs}: --valid-fraction 0.1 held out none of its 1,200 pairs: they "
                        "have 2 distinct sources, and a hash of the source puts all the pairs "
                        "of a source on one side; give pairs of more sources (is the first "
                        "column the source, 'source<TAB>target'?) or a larger "
                        "--valid-fraction"), err
    assert not (tmp_path / "run").exists()
    pairs.write_text("abc\tcba\n")  # one pair, one source: the words of before, in the singular
    err = error_of(capsys, ["seq2seq", "train", "--data", str(pairs), "--valid-fraction",
                            "0.99", "--out", str(tmp_path / "run"), *TSV_TINY])
    assert err.endswith("held out all of its 1 pair, leaving none to train on (a hash of each "
                        "source picks them); give more pairs or a smaller --valid-fraction"), err


def test_train_on_tsv_then_eval_on_file(cli_main, tmp_path, capsys):
    pairs = tmp_path / "rev.tsv"
    pairs.write_text("".join(reversal_rows(4)))
    out = tmp_path / "ckpt"
    assert cli_main(["seq2seq", "train", "--data", str(pairs), "--arch", "lstm-attention",
                     "--valid-fraction", "0.3", "--out", str(out), *TSV_TINY]) == 0
    assert cli_main(["seq2seq", "eval", "--checkpoint", str(out), "--data", str(pairs)]) == 0
    out = capsys.readouterr().out
    assert "/40)" in out  # every line of the file was scored


def test_a_run_refuses_its_pairs_file_once_edited(cli_main, tmp_path, capsys):
    """A --data file edited after the run trained on it was read in silence by --resume (its
    new characters <unk> in the run's vocabularies) and by eval (a held-out split that was
    not the run's). The run records its pairs' sha256; the same pairs saved with other line
    endings pass."""
    from tests.reliability.conftest import snapshot

    pairs = tmp_path / "rev.tsv"
    pairs.write_text("".join(reversal_rows(4)))
    run = tmp_path / "run"
    assert cli_main(["seq2seq", "train", "--data", str(pairs), "--arch", "lstm",
                     "--valid-fraction", "0.3", "--out", str(run), *TSV_TINY]) == 0
    capsys.readouterr()
    assert cli_main(["seq2seq", "eval", "--checkpoint", str(run)]) == 0
    scored = capsys.readouterr().out
    pairs.write_bytes(pairs.read_bytes().replace(b"\n", b"\r\n"))  # the same pairs
    assert cli_main(["seq2seq", "eval", "--checkpoint", str(run)]) == 0
    assert capsys.readouterr().out == scored
    with pairs.open("a") as f:
        f.write("xyz\tzyx\r\n")
    before = snapshot(run)
    for argv in (["seq2seq", "eval", "--checkpoint", str(run)],
                 ["seq2seq", "train", "--out", str(run), "--resume", "--max-iters", "20"]):
        err = error_of(capsys, argv)
        assert f"the pairs of {pairs} have changed since the run was trained on them" in err
    assert snapshot(run) == before


@dataclass
class Decodes:
    """Each decode of a list of sources (a call of training.seq2seq.translate_batches, which
    translate, eval, attention and training's final check all go through): how many sources
    it decoded, to what max_len."""

    counts: list[int] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)


@pytest.fixture
def decodes(monkeypatch) -> Decodes:
    """The decodes of lists of sources from here on."""
    from scratchgpt.training import seq2seq as seq2seq_training

    seen = Decodes()
    real = seq2seq_training.translate_batches

    def spy(model, sources, src_tok, tgt_tok, beam=1, max_len=64, *args, **kwargs):
        seen.counts.append(len(sources))
        seen.lengths.append(max_len)
        return real(model, sources, src_tok, tgt_tok, beam, max_len, *args, **kwargs)

    monkeypatch.setattr(seq2seq_training, "translate_batches", spy)
    return seen


def test_eval_leaves_room_for_the_longest_target(cli_main, checkpoint, tmp_path, capsys,
                                                 decodes):
    """A target longer than translate's default --max-len can still be matched: eval decodes
    as far as its targets need unless --max-len says otherwise."""
    lengths = decodes.lengths
    pairs = tmp_path / "long.tsv"
    target = "1999-03-03 " * 8  # 88 characters, beyond translate's 64
    pairs.write_text(f"3 march 1999\t{target}\n", encoding="utf-8")
    assert cli_main(["seq2seq", "eval", "--checkpoint", str(checkpoint), "--data",
                     str(pairs)]) == 0
    assert cli_main(["seq2seq", "eval", "--checkpoint", str(checkpoint), "--data",
                     str(pairs), "--max-len", "20"]) == 0
    assert lengths[0] > len(target) and lengths[1] == 20
    capsys.readouterr()


def test_the_default_max_len_fits_a_small_position_table(cli_main, checkpoint, tmp_path,
                                                         capsys, decodes):
    """translate and attention without --max-len decode 64 tokens, or as many as a
    transformer's --max-positions holds where fewer: a model trained with --max-positions 8
    was refused by both unless the user found a --max-len it takes ('--max-len 64 exceeds
    the 8 positions this model can write')."""
    lengths = decodes.lengths
    words = WORDS * 2
    (tmp_path / "rev.tsv").write_text("".join(f"{w}\t{w[::-1]}\n" for w in words))
    run = tmp_path / "run"
    assert cli_main(["seq2seq", "train", "--data", str(tmp_path / "rev.tsv"), "--arch",
                     "transformer", "--max-positions", "8", "--valid-fraction", "0.3",
                     "--out", str(run), *TSV_TINY]) == 0
    lengths.clear()  # (training's own final check decodes too)
    capsys.readouterr()
    assert cli_main(["seq2seq", "translate", "--checkpoint", str(run), "--source", "abc"]) == 0
    assert cli_main(["seq2seq", "attention", "--checkpoint", str(run), "--source", "abc",
                     "--out", str(tmp_path / "a.png")]) == 0
    assert lengths == [8, 8]
    assert "--max-len 64" not in capsys.readouterr().err
    assert cli_main(["seq2seq", "translate", "--checkpoint", str(run), "--source", "abc",
                     "--max-len", "9"]) == 2  # a --max-len typed is the user's: refused
    assert "--max-len 9 exceeds the 8 positions" in capsys.readouterr().err
    # a model with room for more keeps the default of 64
    assert cli_main(["seq2seq", "translate", "--checkpoint", str(checkpoint), "--source",
                     "3 mar 99"]) == 0
    assert lengths[-1] == 64
    capsys.readouterr()


def test_eval_which_last_gives_the_training_report_again(cli_main, tmp_path, capsys):
    """train reports on its final model; eval, translate and attention read best.pt, an
    earlier model where the held-out loss rose at the end (arbitrary targets, learned by
    heart), so eval gave other figures than the run's, with no flag to give them again. The
    run now says so, and --which last reads the final model."""
    import random

    rng = random.Random(1)
    pairs = ["".join(rng.choices("abcdef", k=5)) + "\t" + "".join(rng.choices("abcdef", k=3))
             for _ in range(120)]
    (tmp_path / "rand.tsv").write_text("\n".join(pairs) + "\n")
    run = tmp_path / "run"
    capsys.readouterr()
    assert cli_main(["seq2seq", "train", "--data", str(tmp_path / "rand.tsv"), "--out",
                     str(run), "--max-iters", "60", "--eval-interval", "10", "--lr", "0.01",
                     "--warmup-iters", "2", "--batch-size", "32", "--d-model", "32",
                     "--valid-fraction", "0.3", "--no-progress", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    best = load_checkpoint(run / "best.pt").state
    assert best.step < 60  # the case at hand: the loss rose after best.pt was written
    assert out.splitlines()[-1] == (
        "note: these are the final model's figures (last.pt); best.pt, which translate, eval "
        "and attention read unless --which last, is an earlier one (held-out loss "
        f"{best.val_loss:.4f} when saved)")
    report = out[:out.index("\n60 steps in ")]  # the exact-match table, by source length

    said = {}
    for which in ("best", "last"):
        assert cli_main(["seq2seq", "eval", "--checkpoint", str(run), "--which", which,
                         "--show-errors", "100"]) == 0
        said[which] = capsys.readouterr().out
    assert said["last"].startswith(report + "\n")
    assert said["best"] != said["last"]  # the two models decode differently
    assert cli_main(["seq2seq", "eval", "--checkpoint", str(run), "--show-errors", "100"]) == 0
    assert capsys.readouterr().out == said["best"]  # best.pt stays the default


def test_a_run_on_a_relative_tsv_path_is_evaluated_from_anywhere(cli_main, tmp_path, capsys,
                                                                  monkeypatch):
    (tmp_path / "here").mkdir()
    (tmp_path / "elsewhere").mkdir()
    words = WORDS * 2
    (tmp_path / "here" / "rev.tsv").write_text("".join(f"{w}\t{w[::-1]}\n" for w in words))
    monkeypatch.chdir(tmp_path / "here")
    assert cli_main(["seq2seq", "train", "--data", "rev.tsv", "--arch", "lstm",
                     "--valid-fraction", "0.3", "--out", str(tmp_path / "run"),
                     *TSV_TINY]) == 0
    monkeypatch.chdir(tmp_path / "elsewhere")
    capsys.readouterr()
    assert cli_main(["seq2seq", "eval", "--checkpoint", str(tmp_path / "run")]) == 0
    assert "exact match" in capsys.readouterr().out
    (tmp_path / "here" / "rev.tsv").unlink()  # gone: eval says what to do
    assert cli_main(["seq2seq", "eval", "--checkpoint", str(tmp_path / "run")]) == 2
    assert "no longer there; pass --data" in capsys.readouterr().err


def test_missing_checkpoint(cli_main, tmp_path, capsys):
    assert cli_main(["seq2seq", "translate", "--checkpoint", str(tmp_path),
                     "--source", "x"]) == 2
    assert "no checkpoint" in capsys.readouterr().err


def test_a_checkpoint_that_is_no_seq2seq_run_says_how_to_make_one(cli_main, tmp_path, capsys,
                                                                   monkeypatch):
    """--checkpoint hf:gpt2 was downloaded before it was refused (a GPT-2 is no seq2seq
    model), a path that does not exist was told 'a Hugging Face model is hf:NAME', and a
    prepared dataset 'train one with scratchgpt train --dataset': none of them makes a model
    seq2seq reads. Each refusal says how one is made."""
    from scratchgpt.checkpoints import hub

    def never(*args, **kwargs):
        raise AssertionError("a hub model was downloaded for seq2seq")

    monkeypatch.setattr(hub, "download", never)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.bin").write_bytes(b"")
    made = "(train one with 'scratchgpt seq2seq train --out DIR')"
    for given, says in (("hf:gpt2", "hf:gpt2 is a Hugging Face model, a GPT-2 language model; "
                                    f"seq2seq reads a run of 'scratchgpt seq2seq train' {made}"),
                        ("nowhere", f"checkpoint nowhere does not exist {made}"),
                        (str(tmp_path / "data"), "data holds a prepared dataset, not a model; "
                         f"seq2seq trains on pairs, --task or --data FILE.tsv {made}")):
        for action in (["translate", "--source", "x"], ["eval"],
                       ["attention", "--source", "x", "--out", str(tmp_path / "a.png")]):
            err = error_of(capsys, ["seq2seq", *action, "--checkpoint", given])
            assert err.endswith(says), err
    assert not (tmp_path / "a.png").exists()


def test_bad_flags_are_refused_before_the_pairs_are_made(cli_main, tmp_path, capsys,
                                                        monkeypatch):
    from scratchgpt.training.seq2seq import Seq2SeqTask

    def never(*args, **kwargs):
        raise AssertionError("the pairs were made before the flags were checked")

    monkeypatch.setattr(Seq2SeqTask, "from_spec", never)
    for flags, reason in ((["--time-budget", "ten minutes"], "cannot read duration"),
                          # no budget and no --max-iters: 10^12 updates, for ever
                          (["--time-budget", ""], "--time-budget '' leaves this run no end"),
                          (["--learning-rate", "-1"], "--learning-rate must be > 0"),
                          # named by the flags as typed (it said "d_model 10 is not
                          # divisible by n_head 3")
                          (["--arch", "transformer", "--d-model", "10", "--heads", "3"],
                           "--d-model (10) must be divisible by --heads (3)"),
                          (["--n-head", "3"], "d_model (64) must be divisible by --n-head (3)"),
                          (["--n-train", str(10**12)], "pairs needs about"),  # a petabyte
                          (["--valid-fraction", "0.2"], "a --data file only"),
                          (["--data", "x.tsv", "--n-test", "9"], "generated tasks only"),
                          (["--data", "x.tsv", "--valid-fraction", "1"],
                           "--valid-fraction must be in (0, 1), got 1.0"),
                          # a setting of another architecture would change nothing
                          (["--arch", "lstm", "--n-head", "3", "--d-ff", "64"],
                           "--arch lstm does not take --d-ff, --n-head"),
                          (["--bidirectional"], "--arch transformer does not take "
                                                "--bidirectional"),
                          # named as given: it said --bidirectional of --no-bidirectional
                          (["--no-bidirectional"], "--arch transformer does not take "
                                                   "--no-bidirectional")):
        assert cli_main(["seq2seq", "train", "--out", str(tmp_path), *flags]) == 2
        err = capsys.readouterr().err
        assert reason in err and len(err.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())


def test_memory_quick_writes_csv_and_png(cli_main, tmp_path):
    assert cli_main(["experiment", "memory", "--quick", "--out", str(tmp_path),
                     "--max-len", "8"]) == 0
    rows = list(csv.reader((tmp_path / "memory.csv").open()))
    assert rows[0] == ["length", "rnn", "lstm"]
    assert [int(r[0]) for r in rows[1:]] == list(range(4, 9))
    assert all(0.0 <= float(x) <= 1.0 for r in rows[1:] for x in r[1:])
    assert (tmp_path / "memory.png").read_bytes()[:4] == b"\x89PNG"
    before = (tmp_path / "memory.csv").read_bytes()
    assert cli_main(["experiment", "memory", "--quick", "--out", str(tmp_path),
                     "--cells", "rnn"]) == 2  # results there already: kept
    assert (tmp_path / "memory.csv").read_bytes() == before
    assert cli_main(["experiment", "memory", "--quick", "--out", str(tmp_path),
                     "--cells", "rnn", "--max-len", "5", "--overwrite"]) == 0
    assert next(csv.reader((tmp_path / "memory.csv").open())) == ["length", "rnn"]


@pytest.mark.parametrize("experiment, task", [("memory", "memory.FirstSymbolTask"),
                                              ("count", "count.CountingTask")])
def test_an_experiment_stopped_by_ctrl_c_ends_with_130_and_writes_nothing(
        experiment, task, tmp_path, capsys, monkeypatch):
    """It read the final figures the stopped training never made: a KeyError traceback."""
    import importlib
    import signal

    module, name = task.split(".")
    cls = getattr(importlib.import_module(f"scratchgpt.experiments.{module}"), name)
    real = cls.train_batch

    def interrupted(self, *args, **kwargs):
        signal.raise_signal(signal.SIGINT)  # the trainer stops after this step
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cls, "train_batch", interrupted)
    extra = ["--quick"] if experiment == "memory" else []
    assert main(["experiment", experiment, "--out", str(tmp_path / "x"), *extra]) == 130
    assert capsys.readouterr().err.endswith(f"scratchgpt experiment {experiment}: interrupted\n")
    assert not (tmp_path / "x").exists()


def test_count_learns_to_count(cli_main, tmp_path, capsys):
    assert cli_main(["experiment", "count", "--out", str(tmp_path), "--steps", "150",
                     "--modulus", "10", "--prompt", "7 8"]) == 0
    res = json.loads((tmp_path / "count.json").read_text())
    assert res["next_number_accuracy"] > 0.9
    assert res["generated"][:4] == [9, 0, 1, 2]
    assert cli_main(["experiment", "count", "--out", str(tmp_path), "--prompt", "a b"]) == 2
    capsys.readouterr()
    for flags, says in ((["--modulus", "1"], "--modulus must be at least 2"),
                        (["--steps", "3"], "holds count.json; pass --overwrite to replace it"),
                        (["--prompt", " "], "--prompt is empty; give the numbers"),
                        (["--out", str(tmp_path / "count.json"), "--steps", "3"], "is a file")):
        assert cli_main(["experiment", "count", "--out", str(tmp_path), *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err
    assert json.loads((tmp_path / "count.json").read_text()) == res  # kept each time


def test_resumed_run_equals_an_uninterrupted_one(tmp_path, capsys):
    """Label smoothing included: a resumed run keeps the run's own, as it keeps its model and
    pairs, and a resume that names another of any of them is refused."""
    common = ["seq2seq", "train", "--task", "dates", "--arch", "lstm-attention",
              "--lr-decay-iters", "24", "--eval-interval", "8", "--dropout", "0.1",
              "--label-smoothing", "0.2", *TINY]
    assert main([*common, "--max-iters", "24", "--out", str(tmp_path / "a")]) == 0
    assert main([*common, "--max-iters", "12", "--out", str(tmp_path / "b")]) == 0
    resume = ["seq2seq", "train", "--out", str(tmp_path / "b"), "--resume", "--max-iters", "24",
              "--no-progress"]
    capsys.readouterr()
    for flags, named in ((["--arch", "transformer"], "--arch"),
                         (["--label-smoothing", "0"], "--label-smoothing"),
                         (["--task", "numbers", "--n-train", "50"], "--task --n-train")):
        assert main([*resume, *flags]) == 2
        err = capsys.readouterr().err
        assert named in err and len(err.strip().splitlines()) == 1, err
    assert load_checkpoint(tmp_path / "b" / "last.pt").state.step == 12
    assert main(resume) == 0
    a = load_checkpoint(tmp_path / "a" / "last.pt")
    b = load_checkpoint(tmp_path / "b" / "last.pt")
    assert b.state.step == 24 and b.state.val_loss == a.state.val_loss
    assert all(torch.equal(a.model[k], b.model[k]) for k in a.model)
    assert main([*resume, "--label-smoothing", "0.2", "--arch", "lstm-attention"]) == 0


def test_attention_of_a_model_without_attention_is_refused(tmp_path, capsys):
    """A plain lstm has no cross-attention: the map it drew was made up."""
    out = tmp_path / "lstm"
    assert main(["seq2seq", "train", "--task", "dates", "--arch", "lstm", "--out", str(out),
                 *TINY]) == 0
    png = tmp_path / "a.png"
    assert main(["seq2seq", "attention", "--checkpoint", str(out), "--source", "March 3",
                 "--out", str(png)]) == 2
    err = capsys.readouterr().err
    assert "no attention" in err and err.count("\n") == 1 and not png.exists()


def test_train_help_states_seq2seq_defaults_per_arch(capsys):
    from scratchgpt.models.seq2seq import ARCH_DEFAULTS
    from scratchgpt.training.seq2seq import TRAIN_DEFAULTS

    with pytest.raises(SystemExit):
        main(["seq2seq", "train", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert f"--batch-size BATCH_SIZE (source, target) pairs per optimizer micro-step " \
           f"(default: {TRAIN_DEFAULTS['batch_size']})" in text
    assert f"(default: {ARCH_DEFAULTS['transformer']['n_head']} (transformer only))" in text
    assert "--nproc" not in text and "--windows" not in text  # a seq2seq run has neither


def test_seq2seq_runs_on_one_thread_unless_told(cli_main, checkpoint, tmp_path, monkeypatch):
    """A new run, translate, eval and attention took torch's default threads, one per core:
    on a busy 2-core machine the dates task's lstm-attention trained 20 updates in 96-115 s
    where one thread took 7-13 s. They now take one, as bench seq2seq and the experiments do;
    --threads 0 still gives torch's choice."""
    from scratchgpt.training import seq2seq as seq2seq_training

    assert seq2seq_training.train_config({}).threads == 1
    assert seq2seq_training.train_config({"threads": 0}).threads == 0
    set_to = []
    monkeypatch.setattr(torch, "set_num_threads", set_to.append)
    for action in (["translate", "--source", "3 mar 99"], ["eval", "--eval-pairs", "2"],
                   ["attention", "--source", "3 mar 99", "--out", str(tmp_path / "a.png")]):
        set_to.clear()
        assert cli_main(["seq2seq", *action, "--checkpoint", str(checkpoint)]) == 0
        assert set_to == [1], action
        assert cli_main(["seq2seq", *action, "--checkpoint", str(checkpoint), "--threads", "0",
                         *(["--overwrite"] if action[0] == "attention" else [])]) == 0
        assert set_to == [1], action  # (0: torch's own number, left as it is)


def _long_pair_tsv(path, long_source: int = 20_000):
    """Thirty short pairs and one of ``long_source`` characters."""
    rows = reversal_rows(3)
    rows.append(f"{'abc' * (long_source // 3)}\tabc\n")
    path.write_text("".join(rows))
    return path


@pytest.mark.parametrize("limit, remedy", [
    ("8GiB", "one such pair alone does not fit: drop the pairs longer than about"),
    ("200GiB", "every pair of a batch is padded to its longest: give --batch-size"),
])
def test_a_pair_whose_attention_cannot_fit_is_refused_before_anything(
        cli_main, tmp_path, capsys, monkeypatch, limit, remedy):
    """'give --max-positions 20001 or more' for a pair of 20,000 characters was followed by
    a failed allocation of some 77 GB and a traceback: the estimate counted no attention.
    The refusal counts it from the longest pair and the batch, and says what to do."""
    monkeypatch.setenv("SCRATCHGPT_MEMORY_LIMIT", limit)
    pairs = _long_pair_tsv(tmp_path / "long.tsv")
    out = tmp_path / "run"
    err = error_of(capsys, ["seq2seq", "train", "--data", str(pairs), "--out", str(out),
                            "--max-positions", "20001", *TSV_TINY])
    assert re.search(r"training on these pairs, 2\d to a batch, needs about [\d,.]+ GiB", err)
    assert "attention" in err and "the longest source has 19,998 characters" in err
    assert remedy in err
    assert not out.exists()


def test_a_batch_larger_than_the_pairs_is_all_of_them(cli_main, tmp_path, capsys):
    """--batch-size 100000000 with a few dozen pairs was refused as needing some 790,000 GiB,
    while 'bench seq2seq' trained on the same settings: the batch is every training pair, as
    the batches are drawn, and a note says so once."""
    pairs = tmp_path / "rev.tsv"
    pairs.write_text("".join(reversal_rows(4)))
    out = tmp_path / "run"
    argv = ["seq2seq", "train", "--data", str(pairs), "--out", str(out), *TSV_TINY]
    argv[argv.index("--batch-size") + 1] = "100000000"
    assert cli_main(argv) == 0
    err = capsys.readouterr().err
    n = load_checkpoint(out / "last.pt").train_config.batch_size
    assert 20 < n < 40  # the training pairs: all but the held-out ones
    assert err.count("note: --batch-size") == 1
    assert f"note: --batch-size 100,000,000 is more than the {n} training pairs; each batch is " \
           "all of them" in err
    pairs.write_text("source\ttarget\nabc\tcba\nbcd\tdcb\n")  # one trains, two are held out
    assert cli_main([*argv, "--valid-fraction", "0.5", "--overwrite"]) == 0
    assert "more than the 1 training pair; each batch is that one" in capsys.readouterr().err



def test_the_final_check_decodes_the_first_eval_pairs(cli_main, tmp_path, capsys, decodes):
    """The end of a run decoded every held-out pair (2,000 by default, minutes after a run of
    seconds): it decodes the first --eval-pairs (256 unless given; 0 is all of them), says
    so, and gives the figures 'seq2seq eval --which last' gives."""
    decoded = decodes.counts
    argv = ["seq2seq", "train", "--task", "dates", *TINY]
    argv[argv.index("--n-test") + 1] = "300"
    reports = {}
    for given, n in (([], 256), (["--eval-pairs", "12"], 12), (["--eval-pairs", "0"], 300)):
        decoded.clear()
        assert cli_main([*argv, "--out", str(tmp_path / f"run{n}"), *given]) == 0
        reports[n] = capsys.readouterr().out
        assert decoded == [n] and re.search(rf"^exact match \S+ \(\d+/{n}\)$", reports[n], re.M)
        subset = f"(the first {n} of the 300 held-out pairs, --eval-pairs;"
        assert (subset in reports[n]) == (n < 300), reports[n]
    assert cli_main(["seq2seq", "eval", "--checkpoint", str(tmp_path / "run12"), "--which",
                     "last", "--show-errors", "0"]) == 0
    table = capsys.readouterr().out.splitlines()[:-1]  # (the last line: whose 12 they are)
    assert reports[12].startswith("\n".join(table) + "\n(the first 12 of the 300")


@pytest.fixture(scope="module")
def run_of_12(tmp_path_factory):
    """A run trained with --eval-pairs 12, for the tests below to copy (each changes its
    copy)."""
    out = tmp_path_factory.mktemp("eval-pairs") / "run"
    assert main(["seq2seq", "train", "--task", "dates", "--out", str(out), *TINY,
                 "--eval-pairs", "12"]) == 0
    return out


def test_eval_scores_as_many_pairs_as_the_run_recorded(cli_main, run_of_12, tmp_path, capsys,
                                                       decodes):
    """A run trained with --eval-pairs 12 records it, yet 'seq2seq eval' scored every held-out
    pair: other figures than the run's report, and minutes for 2,000. It scores the run's
    number unless --eval-pairs says otherwise (0: all), says so under the table, and scores
    every pair of a --data file."""
    run = shutil.copytree(run_of_12, tmp_path / "run")
    capsys.readouterr()
    for given, n in (([], 12), (["--eval-pairs", "5"], 5), (["--eval-pairs", "0"], 40),
                     (["--limit", "7"], 7)):  # (--limit: the flag's earlier spelling)
        decodes.counts.clear()
        assert cli_main(["seq2seq", "eval", "--checkpoint", str(run), "--show-errors", "0",
                         *given]) == 0
        out = capsys.readouterr().out
        assert decodes.counts == [n], given
        assert re.search(rf"^exact match \S+ \(\d+/{n}\)$", out, re.M), out
        whose = ("as many as the run's final check scored ('train --eval-pairs 12'); "
                 "--eval-pairs 0 scores them all" if not given else "--eval-pairs")
        note = f"(the first {n} of the 40 held-out pairs, {whose})"
        assert out.splitlines()[-1] == note if n < 40 else "(the first" not in out, out
    pairs = tmp_path / "rev.tsv"
    pairs.write_text("".join(f"{i} may 2000\t2000-05-0{i}\n" for i in range(1, 10)))
    decodes.counts.clear()
    assert cli_main(["seq2seq", "eval", "--checkpoint", str(run), "--data", str(pairs),
                     "--show-errors", "0"]) == 0
    assert decodes.counts == [9] and "(the first" not in capsys.readouterr().out


def test_a_resumed_run_decodes_as_many_pairs_as_it_recorded(cli_main, run_of_12, tmp_path,
                                                            capsys, decodes):
    """--eval-pairs was not recorded: the end of a resumed run made with --eval-pairs 12
    decoded 256 (all 40 here), and eval could not tell what the run had scored. The run
    records it; a resume keeps it, and one that gives --eval-pairs again decodes as many,
    and records them, as it takes a new --eval-iters."""
    run = shutil.copytree(run_of_12, tmp_path / "run")
    assert json.loads((run / "config.json").read_text())["data"]["eval_pairs"] == 12
    resume = ["seq2seq", "train", "--out", str(run), "--resume", "--no-progress"]
    for steps, given, decoded, recorded in ((20, [], 12, 12),
                                            (25, ["--eval-pairs", "0"], 40, 0),
                                            (30, [], 40, 0),
                                            (35, ["--eval-pairs", "5"], 5, 5)):
        decodes.counts.clear()
        assert cli_main([*resume, "--max-iters", str(steps), *given]) == 0
        assert decodes.counts == [decoded], (steps, given)
        ckpt = load_checkpoint(run / "last.pt")
        assert (ckpt.state.step, ckpt.data["eval_pairs"]) == (steps, recorded)
    capsys.readouterr()


def test_a_run_that_never_recorded_its_eval_pairs_resumes_with_the_default(
        cli_main, tmp_path, capsys, decodes):
    """A run from before runs recorded --eval-pairs resumes, decoding the default's 256 of
    its 300 held-out pairs, and records them from then on."""
    from scratchgpt.checkpoints import save_checkpoint
    from scratchgpt.training.seq2seq_defaults import DEFAULT_EVAL_PAIRS

    run = tmp_path / "run"
    argv = ["seq2seq", "train", "--task", "dates", "--out", str(run), *TINY]
    argv[argv.index("--n-test") + 1] = "300"
    assert cli_main([*argv, "--eval-pairs", "12"]) == 0
    old = load_checkpoint(run / "last.pt")
    del old.data["eval_pairs"]
    save_checkpoint(run / "last.pt", old)
    decodes.counts.clear()
    assert cli_main(["seq2seq", "train", "--out", str(run), "--resume", "--max-iters", "20",
                     "--no-progress"]) == 0
    assert decodes.counts == [DEFAULT_EVAL_PAIRS] and DEFAULT_EVAL_PAIRS < 300
    assert load_checkpoint(run / "last.pt").data["eval_pairs"] == DEFAULT_EVAL_PAIRS
    capsys.readouterr()


@pytest.mark.parametrize("task", ["dates", "tsv"])
def test_a_run_makes_its_pairs_once(cli_main, tmp_path, capsys, monkeypatch, task):
    """A new or resumed run made and encoded its pairs twice, once to check the run (its
    batch and memory) and again to train: seconds again for dates' 200,000. The training
    takes the task the checks built."""
    from scratchgpt.data.translation import DataSpec

    made = []
    real = DataSpec.load

    def spy(self):
        made.append(self.task)
        return real(self)

    monkeypatch.setattr(DataSpec, "load", spy)
    run = tmp_path / "run"
    if task == "tsv":
        (tmp_path / "rev.tsv").write_text("".join(reversal_rows(4)))
        data = ["--data", str(tmp_path / "rev.tsv"), *TSV_TINY]
    else:
        data = ["--task", "dates", *TINY]
    assert cli_main(["seq2seq", "train", "--out", str(run), *data]) == 0
    assert len(made) == 1
    assert cli_main(["seq2seq", "train", "--out", str(run), "--resume", "--max-iters", "20",
                     "--no-progress"]) == 0
    assert len(made) == 2 and load_checkpoint(run / "last.pt").state.step == 20
    capsys.readouterr()
