"""The command line as a user runs it, through ``main([...])``: flows and every bad input."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from scratchgpt.checkpoints import load_checkpoint
from scratchgpt.cli import build_parser, main
from scratchgpt.models.compiled import compile_available
from tests.cli_errors import error_of
from tests.commands.sampling import assert_seeded_and_stops

TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
        "--batch-size", "4", "--eval-iters", "2", "--no-progress", "--dtype", "fp32"]


def test_prepare_train_sample_eval(tmp_path, english_text, capsys):
    text = tmp_path / "in.txt"
    text.write_text(english_text[:30_000])
    assert main(["prepare", "--data", str(text), "--out", str(tmp_path / "d")]) == 0
    assert main(["train", "--dataset", str(tmp_path / "d"), "--out", str(tmp_path / "r"),
                 "--max-iters", "10", "--eval-interval", "5", *TINY]) == 0
    capsys.readouterr()
    assert main(["sample", "--checkpoint", str(tmp_path / "r"), "--prompt", "ROMEO:",
                 "--max-new-tokens", "40", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ROMEO:") and len(out) >= len("ROMEO:") + 40
    assert main(["eval", "--checkpoint", str(tmp_path / "r"), "--json"]) == 0
    assert '"val_loss"' in capsys.readouterr().out


def test_a_run_of_one_step_says_so_in_the_singular(small_dataset, tmp_path, capsys):
    """'done: 1 steps in ...' read as a typo."""
    assert main(["train", "--dataset", str(small_dataset), "--out", str(tmp_path / "r"),
                 "--max-iters", "1", "--eval-interval", "1", *TINY]) == 0
    assert "done: 1 step in " in capsys.readouterr().out


def test_a_run_that_ends_inside_its_warmup_says_so(small_dataset, tmp_path, capsys):
    """--max-iters 5 with the default 100-update warmup trained at a twentieth of the rate
    asked for, the schedule never reached, without a word: the metrics' rate only rose."""
    import csv

    assert main(["train", "--dataset", str(small_dataset), "--out", str(tmp_path / "r"),
                 "--max-iters", "5", "--eval-interval", "5", *TINY]) == 0
    out = capsys.readouterr().out
    assert out.startswith("note: --warmup-iters 100 is not below --max-iters 5: the learning "
                          "rate rises for the whole run, to 5% of --learning-rate 0.001, and "
                          "the cosine schedule never starts; pass a smaller --warmup-iters\n"), out
    with open(tmp_path / "r" / "metrics.csv") as f:
        rates = [float(row["lr"]) for row in csv.DictReader(f) if row["lr"]]
    assert rates == sorted(rates) and rates[-1] == pytest.approx(0.001 * 5 / 101, rel=1e-3)
    assert main(["train", "--dataset", str(small_dataset), "--out", str(tmp_path / "r2"),
                 "--max-iters", "5", "--eval-interval", "5", "--warmup-iters", "4",
                 *TINY]) == 0
    assert "note:" not in capsys.readouterr().out


def test_a_run_refused_late_says_no_start_of_run_note(small_dataset, tmp_path, capsys):
    """The notes said before training (a warmup longer than the run, a resume with nothing
    left to train) were printed before the checks that come last, so a refused run first
    spoke as if it were starting: an optimizer with nothing to train in the model (found
    once the model is built), a run another process is writing (found at its lock)."""
    from scratchgpt.checkpoints.rundir import RunDir

    out = tmp_path / "r"
    lstm = ["train", "--dataset", str(small_dataset), "--out", str(out), "--model", "lstm",
            "--n-layer", "1", "--hidden", "16", "--block-size", "16", "--batch-size", "4",
            "--eval-iters", "1", "--max-iters", "2", "--no-progress"]
    code = main([*lstm, "--optimizer", "muon"])
    said = capsys.readouterr()
    assert code == 2 and "has nothing to train" in said.err and said.out == "", said
    assert not out.exists()
    assert main(lstm) == 0  # the same run with AdamW: said, then trained
    assert capsys.readouterr().out.startswith("note: --warmup-iters 100 is not below")
    with RunDir(out).lock():  # (another process writing the run)
        code = main(["train", "--out", str(out), "--resume", "--no-progress"])
    said = capsys.readouterr()
    assert code == 2 and "is in use by process" in said.err and said.out == "", said
    assert main(["train", "--out", str(out), "--resume", "--no-progress"]) == 0
    assert capsys.readouterr().out.startswith(f"note: {out} is already at step 2")


def test_out_naming_the_current_directory_trains_there(small_dataset, tmp_path, capsys,
                                                       monkeypatch):
    """--out . (or /) has no folder above it to check for a file: the check raised
    StopIteration, a traceback, before anything was read."""
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--dataset", str(small_dataset), "--out", ".", "--max-iters", "2",
                 "--eval-interval", "2", *TINY]) == 0, capsys.readouterr().err
    assert load_checkpoint(tmp_path / "last.pt").state.step == 2
    assert main(["train", "--out", ".", "--resume", "--max-iters", "3", "--no-progress"]) == 0
    assert load_checkpoint(tmp_path / "last.pt").state.step == 3


def test_prepare_folder_of_txt(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("hello world " * 100)
    (tmp_path / "src" / "b.txt").write_text("goodbye moon " * 100)
    assert main(["prepare", "--data", str(tmp_path / "src"), "--out", str(tmp_path / "d")]) == 0
    assert (tmp_path / "d" / "train.bin").stat().st_size > 0


def test_a_bpe_vocabulary_short_of_the_size_asked_for_is_noted(tmp_path, capsys):
    """A small text runs out of pairs to merge: the note says so, with the size reached as
    meta.json records it; a size it does reach gets no note."""
    import json

    (tmp_path / "in.txt").write_text("hello world " * 200)
    for size, out in ((4000, "short"), (262, "reached")):
        assert main(["prepare", "--data", str(tmp_path / "in.txt"), "--tokenizer", "bpe",
                     "--vocab-size", str(size), "--out", str(tmp_path / out)]) == 0
        printed = capsys.readouterr().out
        learned = json.loads((tmp_path / out / "meta.json").read_text())["vocab_size"]
        if out == "short":
            assert f"vocabulary of {learned:,}, short of the 4,000 asked for" in printed
        else:
            assert learned == 262 and "pairs to merge" not in printed, printed


def test_sample_is_reproducible_with_seed_and_respects_stop(run_dir, capsys):
    args = ["sample", "--checkpoint", str(run_dir), "--max-new-tokens", "60", "--seed", "5",
            "--temperature", "1.0", "--top-k", "20", "--top-p", "0.95"]
    assert_seeded_and_stops(args, capsys)


def test_num_samples_and_beam(run_dir, capsys):
    assert main(["sample", "--checkpoint", str(run_dir), "--max-new-tokens", "10",
                 "--num-samples", "3", "--seed", "1"]) == 0
    assert capsys.readouterr().out.count("---------------") == 2
    assert main(["sample", "--checkpoint", str(run_dir), "--prompt", "A", "--beam", "3",
                 "--max-new-tokens", "10"]) == 0
    assert capsys.readouterr().out.startswith("A")
    # several hypotheses are told apart as samples are, whatever lines they hold
    assert main(["sample", "--checkpoint", str(run_dir), "--prompt", "A", "--beam", "3",
                 "--num-samples", "3", "--max-new-tokens", "10"]) == 0
    out, err = capsys.readouterr()
    assert out.count("---------------") == 2 and err.count("--- beam score") == 3
    assert all(text.startswith("A") for text in out.split("\n---------------\n"))


def test_several_greedy_samples_are_said_to_be_the_same_text(run_dir, capsys, tmp_path):
    """--temperature 0 --num-samples 3 printed three copies of one text without a word; a
    note says why they are alike, alone and with --batch-prompts, and none for one sample."""
    args = ["sample", "--checkpoint", str(run_dir), "--max-new-tokens", "8", "--temperature",
            "0"]
    assert main([*args, "--num-samples", "3"]) == 0
    out, err = capsys.readouterr()
    assert len(set(out.split("\n---------------\n"))) == 1
    assert "note: --temperature 0 decodes greedily: the 3 samples of a prompt are the same " \
           "text" in err
    (tmp_path / "p.txt").write_text("A\nB\n")
    assert main([*args, "--num-samples", "2", "--prompt-file", str(tmp_path / "p.txt"),
                 "--batch-prompts"]) == 0
    assert "the 2 samples of a prompt are the same text" in capsys.readouterr().err
    assert main(args) == 0
    assert "greedily" not in capsys.readouterr().err


def test_a_top_k_beyond_the_vocabulary_keeps_every_token_and_says_so(run_dir, capsys):
    """--top-k more than the model's tokens is clamped, as Hugging Face's is (one flag can
    serve models of any vocabulary): the sample is --top-k 0's, and a note names the
    vocabulary; a --top-k of exactly the vocabulary is no surprise and gets no note."""
    from scratchgpt.checkpoints.io import load_model

    vocab = load_model(run_dir)[0].config.vocab_size
    outs = []
    for k in (0, vocab + 1, vocab):
        assert main(["sample", "--checkpoint", str(run_dir), "--max-new-tokens", "30",
                     "--seed", "4", "--temperature", "1.0", "--top-k", str(k)]) == 0
        outs.append(capsys.readouterr())
    assert outs[1].out == outs[0].out == outs[2].out
    assert f"note: --top-k {vocab + 1} is more than the model's vocabulary of {vocab} " \
        "tokens: it keeps every token" in outs[1].err
    assert "note" not in outs[0].err + outs[2].err


def test_a_beam_wider_than_the_vocabulary_finds_every_hypothesis_and_says_when_too_few(
        run_dir, capsys):
    """--beam V + 10 over one new token: the vocabulary's V continuations are all there is,
    each printed once, and a note says why --num-samples V + 5 got fewer; over two tokens
    there are V * V, and the V + 5 asked for are printed without a note."""
    from scratchgpt.checkpoints.io import load_model

    vocab = load_model(run_dir)[0].config.vocab_size
    beam = ["sample", "--checkpoint", str(run_dir), "--prompt", "A", "--beam", str(vocab + 10),
            "--num-samples", str(vocab + 5)]
    assert main([*beam, "--max-new-tokens", "1"]) == 0
    out, err = capsys.readouterr()
    assert err.count("--- beam score") == vocab
    assert out.count("\n---------------\n") == vocab - 1
    assert f"found {vocab} hypotheses, fewer than --num-samples {vocab + 5}: a vocabulary of " \
        f"{vocab} tokens has only {vocab} continuations of 1 token" in err
    assert main([*beam, "--max-new-tokens", "2"]) == 0
    out, err = capsys.readouterr()
    assert err.count("--- beam score") == vocab + 5 and "note" not in err


def test_greedy_cli_equals_beam_one(run_dir, capsys):
    main(["sample", "--checkpoint", str(run_dir), "--prompt", "Th", "--temperature", "0",
          "--max-new-tokens", "12"])
    greedy = capsys.readouterr().out
    main(["sample", "--checkpoint", str(run_dir), "--prompt", "Th", "--beam", "1",
          "--max-new-tokens", "12"])
    assert capsys.readouterr().out == greedy


def test_a_prompt_longer_than_the_context_is_read_from_its_end_with_a_note(run_dir, capsys):
    """The model (context 16) reads the prompt's last 16 characters, and says so; the whole
    prompt is printed, followed by what those 16 characters continue with."""
    long = "the quick brown fox jumps over"  # 30 characters
    argv = ["sample", "--checkpoint", str(run_dir), "--temperature", "0",
            "--max-new-tokens", "8"]
    assert main([*argv, "--prompt", long]) == 0
    out, err = capsys.readouterr()
    assert "prompt has 30 tokens, the model's context 16: it reads the last 16" in err
    assert main([*argv, "--prompt", long[-16:]]) == 0
    tail = capsys.readouterr()
    assert tail.err == "" and out == long + tail.out[16:]


def test_beam_search_notes_a_prompt_longer_than_the_context_as_sampling_does(run_dir, capsys):
    """Beam search, too, reads the last 16 characters of a longer prompt: it says so."""
    long = "the quick brown fox jumps over"  # 30 characters
    argv = ["sample", "--checkpoint", str(run_dir), "--beam", "2", "--max-new-tokens", "4"]
    assert main([*argv, "--prompt", long]) == 0
    out, err = capsys.readouterr()
    assert "prompt has 30 tokens, the model's context 16: it reads the last 16" in err
    assert main([*argv, "--prompt", long[-16:]]) == 0
    tail = capsys.readouterr()
    assert "prompt has" not in tail.err and out == long + tail.out[16:]


def test_a_prompt_file_it_cannot_read_is_refused_before_the_model_is_loaded(tmp_path, capsys,
                                                                           monkeypatch):
    from scratchgpt.commands import sample

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded before the prompt file was read")

    monkeypatch.setattr(sample, "load_source_for_decoding", never)
    line = error_of(capsys, ["sample", "--checkpoint", str(tmp_path), "--prompt-file",
                             str(tmp_path / "missing.txt")])
    assert "does not exist" in line


def test_batch_prompts_name_the_line_with_unknown_characters(run_dir, tmp_path, capsys):
    (tmp_path / "p.txt").write_text("Th\n\nhéllo\n", encoding="utf-8")
    argv = ["sample", "--checkpoint", str(run_dir), "--prompt-file", str(tmp_path / "p.txt"),
            "--batch-prompts", "--max-new-tokens", "3"]
    line = error_of(capsys, argv)
    assert "line 3" in line and "'é'" in line and "--unknown replace" in line
    assert main([*argv, "--unknown", "replace", "--num-samples", "2"]) == 0
    texts = capsys.readouterr().out.split("\n---------------\n")
    assert [t[:2] for t in texts] == ["Th", "Th", "hé", "hé"]  # each line, twice, in order


def test_batch_prompts_are_the_lines_an_editor_shows(run_dir, tmp_path, capsys):
    """--batch-prompts splits its file where an editor ends a line (\\n, \\r\\n, \\r), as every
    reader of a user's lines does: a form feed or U+2028 inside a line made two prompts."""
    (tmp_path / "p.txt").write_text("Th\x0cKI\r\nQU\u2028EEN\rKING\n", encoding="utf-8")
    assert main(["sample", "--checkpoint", str(run_dir), "--prompt-file",
                 str(tmp_path / "p.txt"), "--batch-prompts", "--max-new-tokens", "2",
                 "--unknown", "replace", "--temperature", "0"]) == 0
    texts = capsys.readouterr().out.split("\n---------------\n")
    assert [t[:2] for t in texts] == ["Th", "QU", "KI"]


def test_prompt_from_file(run_dir, tmp_path, capsys):
    (tmp_path / "p.txt").write_text("KING:")
    assert main(["sample", "--checkpoint", str(run_dir), "--prompt-file", str(tmp_path / "p.txt"),
                 "--max-new-tokens", "5", "--no-stream"]) == 0
    assert capsys.readouterr().out.startswith("KING:")


def test_prompt_file_dash_reads_standard_input(run_dir, capsys, monkeypatch):
    """--prompt-file - reads the prompt from standard input (as classify --file - reads its
    texts): it was refused as 'prompt file - does not exist'; --batch-prompts reads its lines
    there too, and a refusal names standard input, not a file called '-'."""
    import io

    def stdin(raw: bytes) -> io.TextIOWrapper:
        return io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8")

    argv = ["sample", "--checkpoint", str(run_dir), "--temperature", "0",
            "--max-new-tokens", "5"]
    assert main([*argv, "--prompt", "KING:"]) == 0
    typed = capsys.readouterr().out
    monkeypatch.setattr("sys.stdin", stdin(b"KING:"))
    assert main([*argv, "--prompt-file", "-"]) == 0
    assert capsys.readouterr().out == typed
    monkeypatch.setattr("sys.stdin", stdin(b"KING:\n\nKING:\n"))
    assert main([*argv, "--prompt-file", "-", "--batch-prompts"]) == 0
    assert capsys.readouterr().out.split("\n---------------\n") == [typed, typed]
    monkeypatch.setattr("sys.stdin", stdin(b"\n\n"))
    line = error_of(capsys, [*argv, "--prompt-file", "-", "--batch-prompts"])
    assert "standard input has no non-empty line" in line


def _tokenizer(run_dir: Path):
    from scratchgpt.checkpoints import checkpoint_tokenizer
    from scratchgpt.checkpoints.io import load_for_generation

    return checkpoint_tokenizer(load_for_generation(run_dir)[1])


def _stopped_after(monkeypatch, ids: list[int], rows: int = 1) -> None:
    """Every way sample generates yields ``ids`` (in each of ``rows`` rows), then Ctrl-C."""
    from scratchgpt.generation import generate, speculative

    def tokens(*args, **kwargs):
        yield from ids
        raise KeyboardInterrupt

    def steps(*args, **kwargs):
        for t in tokens():
            yield list(range(rows)), torch.tensor([t] * rows)

    monkeypatch.setattr(generate, "stream", lambda *a, **k: (torch.tensor([t]) for t in tokens()))
    monkeypatch.setattr(generate, "decode", steps)  # (what generate_batch calls)
    monkeypatch.setattr(speculative.SpeculativeDecoder, "stream", tokens)


@pytest.mark.parametrize("draft", [[], ["--draft", "ngram"]])
def test_ctrl_c_mid_stream_ends_the_line_before_saying_interrupted(run_dir, capsys,
                                                                   monkeypatch, draft):
    """The text streamed so far keeps its line: 'interrupted' was written on after the last
    token (at a terminal, on the same line), and a file it went to lacked its newline."""
    _stopped_after(monkeypatch, _tokenizer(run_dir).encode("ab"))
    code = main(["sample", "--checkpoint", str(run_dir), "--prompt", "KING:", *draft])
    out, err = capsys.readouterr()
    assert code == 130 and err.endswith("scratchgpt sample: interrupted\n")
    assert out == "KING:ab\n"


@pytest.mark.parametrize("draft", [[], ["--draft", "ngram"]])
def test_ctrl_c_prints_the_text_held_back_for_a_stop_string(run_dir, capsys, monkeypatch,
                                                            draft):
    """What could have begun a --stop string is held back while the text streams; once Ctrl-C
    ends it, it did not, and it is text the model generated: it is printed before the line
    ends (it was lost, up to the stop string's length less one characters)."""
    _stopped_after(monkeypatch, _tokenizer(run_dir).encode("KING"))
    code = main(["sample", "--checkpoint", str(run_dir), "--prompt", "A:", "--stop", "KING:",
                 *draft])
    out, err = capsys.readouterr()
    assert code == 130 and err.endswith("scratchgpt sample: interrupted\n")
    assert out == "A:KING\n"


@pytest.mark.parametrize("flags", [["--no-stream"], ["--no-stream", "--draft", "ngram"],
                                   ["--num-samples", "2"]])
def test_ctrl_c_of_a_sample_printed_at_the_end_prints_it_as_far_as_it_got(run_dir, capsys,
                                                                          monkeypatch, flags):
    """--no-stream and --num-samples print once every sample has ended: Ctrl-C lost every
    token generated. Each sample is printed as far as it got, a note on stderr that it was
    cut off, before the command says it was interrupted."""
    n = 2 if "--num-samples" in flags else 1
    _stopped_after(monkeypatch, _tokenizer(run_dir).encode("ab"), rows=n)
    code = main(["sample", "--checkpoint", str(run_dir), "--prompt", "KING:", *flags])
    out, err = capsys.readouterr()
    assert code == 130 and err.endswith("scratchgpt sample: interrupted\n")
    assert out.split("\n---------------\n") == ["KING:ab\n"] * n
    assert err.count("--- cut off after 2 new tokens\n") == n


def test_ctrl_c_prints_finished_samples_as_they_are(run_dir, tmp_path, capsys, monkeypatch):
    """Of a batch, a sample that had ended (here on its --stop string) is printed whole and
    without a note; one still generating is cut off, and so noted."""
    from scratchgpt.generation import generate

    tok = _tokenizer(run_dir)
    a, b = tok.encode("x."), tok.encode("yz")

    def steps(*args, **kwargs):
        yield [0, 1], torch.tensor([a[0], b[0]])
        yield [0, 1], torch.tensor([a[1], b[1]])  # row 0 completes its stop string
        raise KeyboardInterrupt

    monkeypatch.setattr(generate, "decode", steps)  # (what generate_batch calls)
    (tmp_path / "p.txt").write_text("A\nB\n")
    code = main(["sample", "--checkpoint", str(run_dir), "--prompt-file",
                 str(tmp_path / "p.txt"), "--batch-prompts", "--stop", "."])
    out, err = capsys.readouterr()
    assert code == 130 and out.split("\n---------------\n") == ["Ax\n", "Byz\n"]
    assert err.count("cut off") == 1 and "--- cut off after 2 new tokens\n" in err


def test_ctrl_c_before_any_token_prints_no_sample(run_dir, capsys, monkeypatch):
    """Interrupted before its first token, a batch has nothing to show: no copies of the
    prompt, each noted as cut off after 0 tokens."""
    _stopped_after(monkeypatch, [], rows=3)
    code = main(["sample", "--checkpoint", str(run_dir), "--prompt", "KING:",
                 "--num-samples", "3"])
    out, err = capsys.readouterr()
    assert code == 130 and out == "" and "cut off" not in err


# ---- bad input: one line, exit code 2, nothing lost ----

def test_missing_data(tmp_path, capsys):
    assert "does not exist" in error_of(capsys, ["prepare", "--data", str(tmp_path / "nope.txt"),
                                                 "--out", str(tmp_path / "d")])


def test_empty_data(tmp_path, capsys):
    (tmp_path / "e.txt").write_text("  \n")
    assert "empty" in error_of(capsys, ["prepare", "--data", str(tmp_path / "e.txt"), "--out",
                                        str(tmp_path / "d")])


def test_non_utf8_data(tmp_path, capsys):
    (tmp_path / "b.txt").write_bytes(b"hello \xff\xfe world")
    assert "UTF-8" in error_of(capsys, ["prepare", "--data", str(tmp_path / "b.txt"), "--out",
                                        str(tmp_path / "d")])


def test_data_shorter_than_context(tmp_path, capsys):
    (tmp_path / "s.txt").write_text("short text, a few words only. " * 3)
    main(["prepare", "--data", str(tmp_path / "s.txt"), "--out", str(tmp_path / "d")])
    msg = error_of(capsys, ["train", "--dataset", str(tmp_path / "d"), "--out",
                            str(tmp_path / "r"), "--block-size", "64", "--no-progress"])
    assert "context window" in msg


def test_unknown_prompt_characters(run_dir, capsys):
    msg = error_of(capsys, ["sample", "--checkpoint", str(run_dir), "--prompt", "héllo ☃"])
    assert "'☃'" in msg and "--unknown replace" in msg
    assert main(["sample", "--checkpoint", str(run_dir), "--prompt", "h☃", "--unknown", "replace",
                 "--max-new-tokens", "3"]) == 0


def test_characters_the_models_vocabulary_lacks_are_reported_as_the_models(run_dir, tmp_path,
                                                                           capsys):
    """With --tokenizer-from nothing is learned from the training split: the note about
    substituted characters must not say the vocabulary was."""
    (tmp_path / "t.txt").write_text("snow ☃ and more snow ☃ " * 20)
    assert main(["prepare", "--data", str(tmp_path / "t.txt"), "--tokenizer-from", str(run_dir),
                 "--out", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert "train characters are not in the model's vocabulary" in out
    assert "learned from the training split" not in out


@pytest.mark.parametrize("flags, message", [
    (["--data", ""], "--data is empty"),
    (["--dataset", ""], "--dataset is empty"),
    (["--dataset", "shakespeare", "--tokenizer-from", ""], "--tokenizer-from is empty"),
])
def test_an_empty_flag_is_refused_not_taken_for_the_default(tmp_path, capsys, flags, message):
    """--data "$UNSET" is a mistake to report: it quietly prepared the standard library (and
    an empty --tokenizer-from learned a tokenizer of the text instead of taking a model's)."""
    assert message in error_of(capsys, ["prepare", *flags, "--out", str(tmp_path / "d")])
    assert not (tmp_path / "d").exists()


def test_a_prompt_file_opening_with_a_byte_order_mark(run_dir, tmp_path, capsys):
    """A prompt saved by a Windows editor opens with a byte-order mark, which is no character
    of the prompt: it was refused as a character the vocabulary lacks."""
    (tmp_path / "p.txt").write_bytes(b"\xef\xbb\xbfthe ")
    args = ["sample", "--checkpoint", str(run_dir), "--max-new-tokens", "3", "--seed", "0"]
    assert main([*args, "--prompt-file", str(tmp_path / "p.txt")]) == 0
    from_file = capsys.readouterr().out
    assert main([*args, "--prompt", "the "]) == 0
    assert capsys.readouterr().out == from_file


@pytest.mark.parametrize("encoding, says", [
    ("utf-16", "is not valid UTF-8 text (byte 0): it is UTF-16 text; save it as UTF-8"),
    ("utf-16-le", "is 50% NUL characters: UTF-16 text saved without a byte-order mark")])
def test_a_prompt_file_saved_as_utf16_is_named_as_such(run_dir, tmp_path, capsys, encoding,
                                                       says):
    """A prompt file saved as UTF-16 was 'not UTF-8 text' (with its byte-order mark) or, without
    one, valid UTF-8 with a NUL after every letter, sampled from in silence by a byte-level
    tokenizer. Both are named as every text file a user gives is; Windows line endings read as
    they did."""
    (tmp_path / "p.txt").write_bytes("the cat\r\nsat".encode(encoding))
    line = error_of(capsys, ["sample", "--checkpoint", str(run_dir), "--prompt-file",
                             str(tmp_path / "p.txt")])
    assert f"prompt file {tmp_path / 'p.txt'} {says}" in line
    from scratchgpt.commands.prompts import read_prompt

    (tmp_path / "p.txt").write_bytes(b"the cat\r\nsat\rdown")
    assert read_prompt(argparse.Namespace(prompt_file=str(tmp_path / "p.txt"))) == \
        "the cat\nsat\ndown"


def test_missing_checkpoint(tmp_path, capsys):
    msg = error_of(capsys, ["sample", "--checkpoint", str(tmp_path / "x.pt")])
    assert msg.endswith(f"checkpoint {tmp_path / 'x.pt'} does not exist"), msg  # a path: no hf:


def test_a_bare_name_that_is_no_checkpoint_is_told_the_hub_spelling(tmp_path, monkeypatch,
                                                                      capsys):
    """`train --init-from gpt2` was "checkpoint gpt2 does not exist", no word of hf:gpt2."""
    monkeypatch.chdir(tmp_path)
    msg = error_of(capsys, ["train", "--init-from", "gpt2", "--dataset", "d", "--out", "r"])
    assert msg.endswith("--init-from: checkpoint gpt2 does not exist (a Hugging Face model "
                        "is hf:gpt2)"), msg
    msg = error_of(capsys, ["sample", "--checkpoint", "distilgpt2"])
    assert msg.endswith("(a Hugging Face model is hf:distilgpt2)"), msg
    assert sorted(tmp_path.iterdir()) == []


def test_truncated_checkpoint(run_dir, tmp_path, capsys):
    data = (run_dir / "last.pt").read_bytes()
    (tmp_path / "t.pt").write_bytes(data[: len(data) // 2])
    assert "truncated or corrupt" in error_of(capsys, ["sample", "--checkpoint",
                                                       str(tmp_path / "t.pt")])


@pytest.mark.parametrize("content", [b"hello\n", b"a", bytes(range(256))])
def test_a_file_that_torch_save_did_not_write(tmp_path, capsys, content):
    """Any bytes under a .pt name: one line, the file named, not the unpickler's traceback."""
    (tmp_path / "t.pt").write_bytes(content)
    msg = error_of(capsys, ["sample", "--checkpoint", str(tmp_path / "t.pt")])
    assert "t.pt is not a readable checkpoint" in msg


def test_a_corrupt_checkpoints_reason_is_cut_at_a_sentence():
    """torch's reason for an archive it cannot read runs on for several sentences; the line
    keeps the first, whole."""
    from scratchgpt.checkpoints.io import _load_failure

    text = ("PytorchStreamReader failed reading file data/0: invalid header or archive is "
            "corrupted. This is an internal miniz error. If you are seeing this error, there "
            "is a high likelihood that your checkpoint file is corrupted.")
    reason = _load_failure(RuntimeError(text))
    assert reason.endswith("invalid header or archive is corrupted.")
    assert "miniz" not in reason


def test_foreign_checkpoint(tmp_path, capsys):
    torch.save({"state_dict": {"w": torch.zeros(2)}}, tmp_path / "f.pt")
    assert "not a scratchgpt checkpoint" in error_of(capsys, ["sample", "--checkpoint",
                                                              str(tmp_path / "f.pt")])


def test_incompatible_checkpoint_version(run_dir, tmp_path, capsys):
    state = torch.load(run_dir / "last.pt", weights_only=True)
    state["version"] = 999
    torch.save(state, tmp_path / "v.pt")
    assert "version 999" in error_of(capsys, ["sample", "--checkpoint", str(tmp_path / "v.pt")])


@pytest.mark.parametrize("flags,needle", [
    (["--n-embd", "30", "--n-head", "4"], "divisible"),
    (["--learning-rate", "-1"], "--learning-rate must be > 0"),
    (["--time-budget", "later"], "duration"),
])
def test_invalid_hyperparameters(small_dataset, tmp_path, capsys, flags, needle):
    msg = error_of(capsys, ["train", "--dataset", str(small_dataset), "--out", str(tmp_path / "r"),
                            "--no-progress", *flags])
    assert needle in msg


@pytest.mark.parametrize("flags,needle", [
    (["--top-p", "0"], "--top-p"), (["--top-p", "1.2"], "--top-p"),
    (["--temperature", "-1"], "temperature"),
    (["--max-new-tokens", "200", "--max-new-tokens-limit", "100"], "exceeds the allowed"),
    (["--max-new-tokens", "0"], "max-new-tokens"),
    (["--beam", "2", "--length-penalty", "nan"], "finite"),
    (["--beam", "2", "--length-penalty", "inf"], "finite"),
    (["--length-penalty", "2"], "goes with --beam"),  # no beams to score: it would do nothing
    (["--stop", "\n", "--stop", "☃"], "'☃' can never be generated"),  # not in the vocabulary
    # a limit no count can meet (it said '--max-new-tokens 500 exceeds the allowed -5')
    (["--max-new-tokens-limit", "-5"], "--max-new-tokens-limit: expected a positive integer"),
    (["--num-samples-limit", "0"], "--num-samples-limit: expected a positive integer"),
])
def test_invalid_sampling_flags(run_dir, capsys, flags, needle):
    assert needle in error_of(capsys, ["sample", "--checkpoint", str(run_dir), *flags])


@pytest.mark.parametrize("argv", [
    ["sample", "--seed", str(2**64)], ["sample", "--seed", "-1"], ["chat", "--seed", "x"],
    ["sample", "--threads", "-1"], ["attention", "--text", "hi", "--threads", "-2"],
    ["serve", "--threads", "-1"], ["train", "--seed", str(2**64)],
    ["train", "--threads", "99999"], ["sample", "--threads", "5000"],
])
def test_seeds_and_thread_counts_out_of_range(run_dir, tmp_path, capsys, argv):
    """A seed a generator cannot take, fewer than 0 threads or thousands (which can hang
    OpenMP): one line naming the flag, before any model is loaded or trained."""
    where = ["--checkpoint", str(run_dir)] if argv[0] != "train" else \
        ["--dataset", "shakespeare", "--out", str(tmp_path / "r"), "--no-progress"]
    flag = argv[-2]
    assert flag.lstrip("-") in error_of(capsys, [*argv, *where])


@pytest.mark.parametrize("command, flag", [
    (["experiment", "count", "--out", "x"], "--generate"), (["bench", "sample"], "--tokens"),
    (["bench", "speculative"], "--tokens"), (["bench", "recurrent"], "--decode-tokens"),
])
def test_token_counts_beyond_the_generation_limit(capsys, command, flag):
    """A count of new tokens past MAX_NEW_TOKENS ran for ever (10^30 steps of generation)."""
    from scratchgpt.generation.stopping import MAX_NEW_TOKENS

    err = error_of(capsys, [*command, flag, str(MAX_NEW_TOKENS + 1)])
    assert f"{flag}: expected 1 to {MAX_NEW_TOKENS} new tokens" in err


def test_flag_that_does_not_apply_to_model(small_dataset, tmp_path, capsys):
    msg = error_of(capsys, ["train", "--dataset", str(small_dataset), "--model", "bigram",
                            "--n-head", "4", "--out", str(tmp_path / "r")])
    assert "--n-head" in msg


def test_output_dir_holding_another_run(run_dir, small_dataset, capsys):
    before = (run_dir / "last.pt").read_bytes()
    msg = error_of(capsys, ["train", "--dataset", str(small_dataset), "--out", str(run_dir),
                            *TINY])
    assert "--resume" in msg and "--overwrite" in msg
    assert (run_dir / "last.pt").read_bytes() == before


def test_config_file_layers_under_flags(small_dataset, tmp_path):
    conf = tmp_path / "c.toml"
    conf.write_text('[train]\nmax_iters = 7\neval_interval = 7\n[model]\nn_embd = 24\n')
    assert main(["train", "--dataset", str(small_dataset), "--out", str(tmp_path / "r"),
                 "--config", str(conf), "--preset", "cpu-small", "--n-embd", "16", "--n-head",
                 "2", "--n-layer", "1", "--block-size", "16", "--no-progress"]) == 0
    import json

    resolved = json.loads((tmp_path / "r" / "config.json").read_text())
    assert resolved["train"]["max_iters"] == 7  # file beat preset
    assert resolved["model"]["n_embd"] == 16  # flag beat file
    from scratchgpt.training.config import PRESETS, TrainConfig

    preset_lr = PRESETS["cpu-small"]["learning_rate"]
    assert preset_lr != TrainConfig.learning_rate
    assert resolved["train"]["learning_rate"] == preset_lr  # preset beat default


def test_bigram_model_trains(small_dataset, tmp_path):
    assert main(["train", "--dataset", str(small_dataset), "--model", "bigram", "--out",
                 str(tmp_path / "r"), "--max-iters", "20", "--eval-interval", "10",
                 "--block-size", "8", "--no-progress"]) == 0


@pytest.mark.parametrize("argv,hint", [
    # no prefix of a flag stands for it: --lr-decay is not --lr-decay-iters ...
    (["train", "--lr-decay", "3"], "did you mean --lr-decay-iters?"),
    # ... and a nanoGPT spelling is pointed at ours, in the subcommand that was asked for
    (["bench", "train", "--max_iters", "3"], None),
    (["train", "--max_iters", "3"], "did you mean --max-iters?"),
])
def test_unknown_flag_is_one_line_naming_what_was_meant(capsys, argv, hint):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"scratchgpt {' '.join(argv[:-2])}: error: unrecognized")
    assert hint is None or hint in lines[0]


@pytest.mark.parametrize("command,is_dir,hint", [
    ("prepare", False, "--data"),      # a text file is prepare's --data
    ("prepare", True, "--data"),       # ... and so is a folder of them
    ("sample", True, "--checkpoint"),  # a run directory is what sample reads
    ("classify", False, "--file"),     # classify reads its texts from --file
    ("classify", True, "--checkpoint"),
])
def test_a_bare_path_is_pointed_at_the_flag_that_reads_it(capsys, tmp_path, command, is_dir,
                                                          hint):
    path = tmp_path / "given"
    path.mkdir() if is_dir else path.write_text("some text\n")
    # (sample and classify are missing their --checkpoint, which argparse says first)
    with pytest.raises(SystemExit) as stop:
        main([command, str(path)] + (["--out", str(tmp_path / "out")] if command == "prepare"
                                     else []))
    lines = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(lines) == 1, lines
    assert lines[0].endswith(f"did you mean {hint} {path}? (see 'scratchgpt {command} --help')")


def test_a_bare_word_that_is_no_path_gets_no_flag_guessed(capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(["prepare", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "out")])
    assert "did you mean" not in capsys.readouterr().err


@pytest.mark.parametrize("argv,hint", [
    (["trian"], "did you mean 'train'?"),
    (["bench", "decode-stp"], "did you mean 'decode-step'?"),
    (["seq2seq", "train", "--arch", "lstm-atention"], "did you mean 'lstm-attention'?"),
    (["zzz"], None),  # nothing near it: no guess
])
def test_a_mistyped_choice_is_one_line_naming_what_was_meant(capsys, argv, hint):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(lines) == 1 and "invalid choice" in lines[0], lines
    assert (hint in lines[0]) if hint else "did you mean" not in lines[0]


def test_a_mistyped_dataset_name_gets_a_guess(tmp_path, capsys):
    err = error_of(capsys, ["train", "--dataset", "shakespere", "--out", str(tmp_path / "r")])
    assert "not a named dataset" in err and err.endswith("did you mean 'shakespeare'?")


@pytest.mark.parametrize("argv,reason", [
    (["train", "--time-budget", "-5s"], "duration '-5s'"),
    (["train", "--learning-rate", "-1e-3"], "--learning-rate must be > 0"),
])
def test_a_negative_value_meets_its_flags_check(capsys, argv, reason):
    """A value that starts with a minus and a digit is the flag's value, refused by the
    flag's own check, not argparse's "expected one argument"."""
    line = error_of(capsys, argv)
    assert reason in line and "expected one argument" not in line, line


def test_lr_is_the_learning_rate_not_an_abbreviation():
    """--lr names --learning-rate itself (with abbreviations allowed it used to be taken as
    the only flag starting with it, --lr-decay-iters)."""
    args = build_parser().parse_args(["train", "--dataset", "d", "--out", "o", "--lr", "0.03"])
    assert args.learning_rate == 0.03 and args.lr_decay_iters is None


def test_bare_command_shows_the_commands(capsys):
    assert main([]) == 2
    err = capsys.readouterr().err
    assert all(cmd in err for cmd in ("prepare", "train", "sample", "bench"))


def test_help_lists_commands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for cmd in ("prepare", "train", "sample", "eval", "bench"):
        assert cmd in out


def test_resume_needs_no_flags_but_the_ones_it_changes(small_dataset, tmp_path):
    """--resume takes the run's own settings from its config.json; --max-iters extends it."""
    args = ["--dataset", str(small_dataset), "--lr-decay-iters", "20", "--eval-interval", "10",
            "--learning-rate", "5e-3", "--optimizer", "muon", *TINY]
    assert main(["train", *args, "--max-iters", "20", "--out", str(tmp_path / "a")]) == 0
    assert main(["train", *args, "--max-iters", "10", "--out", str(tmp_path / "b")]) == 0
    assert main(["train", "--out", str(tmp_path / "b"), "--resume", "--max-iters", "20",
                 "--no-progress"]) == 0
    a = torch.load(tmp_path / "a" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "b" / "last.pt", weights_only=True)
    assert b["state"]["step"] == 20 and b["train_config"]["batch_size"] == 4
    for k, v in a["model"].items():
        assert torch.allclose(v, b["model"][k], atol=1e-6), k


def test_numpy_engine_prints_the_torch_greedy_text(run_dir, capsys):
    args = ["sample", "--checkpoint", str(run_dir), "--prompt", "Th", "--temperature", "0",
            "--max-new-tokens", "20"]
    main(args)
    torch_text = capsys.readouterr().out
    assert main([*args, "--engine", "numpy"]) == 0
    assert capsys.readouterr().out == torch_text
    assert "--dtype" in error_of(capsys, [*args, "--engine", "numpy", "--dtype", "bf16"])


@pytest.mark.skipif(compile_available() is not None, reason=str(compile_available()))
def test_compiled_sample_prints_the_eager_text(run_dir, capsys):
    args = ["sample", "--checkpoint", str(run_dir), "--prompt", "Th", "--seed", "4",
            "--max-new-tokens", "40"]
    main(args)
    eager_text = capsys.readouterr().out
    assert main([*args, "--compile"]) == 0
    out = capsys.readouterr()
    assert out.out == eager_text and "compiling the decode step" in out.err
    assert "--engine numpy" in error_of(capsys, [*args, "--compile", "--engine", "numpy"])
    assert "fp32" in error_of(capsys, [*args, "--compile", "--dtype", "int8"])
    assert "batch 1" in error_of(capsys, [*args, "--compile", "--num-samples", "2"])


def test_no_prompt_is_unconditional_generation(run_dir, capsys):
    """A character model starts from a newline: no prompt, an empty one and "\\n" agree."""
    base = ["sample", "--checkpoint", str(run_dir), "--temperature", "0", "--max-new-tokens", "15"]
    outs = []
    for extra in ([], ["--prompt", ""], ["--prompt", "\n"]):
        assert main([*base, *extra]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] == outs[2] and outs[0].startswith("\n") and len(outs[0]) > 10


@pytest.mark.parametrize("flags, message", [
    (["--tokenizer", "char", "--bpe-dropout", "0.1"], "needs a BPE tokenizer"),
    (["--tokenizer", "bpe", "--bpe-dropout", "1"], "must be in [0, 1)"),
    (["--tokenizer", "bpe", "--train-copies", "4"], "with --bpe-dropout only"),
    (["--tokenizer", "bpe", "--bpe-dropout", "0.1", "--train-copies", "0"], "at least 1"),
])
def test_bad_bpe_dropout_flags(tmp_path, capsys, flags, message):
    (tmp_path / "t.txt").write_text("some text to tokenize. " * 50)
    assert message in error_of(capsys, ["prepare", "--data", str(tmp_path / "t.txt"), *flags,
                                        "--out", str(tmp_path / "d")])
    assert not (tmp_path / "d").exists()


def test_a_bad_tokenizer_flag_is_refused_before_a_download(tmp_path, capsys):
    """--tokenizer, --vocab-size and --val-fraction are checked with the flags, not after the
    text was fetched and read: the refusal names the flag even where the dataset could not be
    had."""
    assert "above 256" in error_of(capsys, ["prepare", "--dataset", "warandpeace", "--tokenizer",
                                            "bpe", "--vocab-size", "256", "--out",
                                            str(tmp_path / "d")])
    # 4096.0 is above 256: what it is not is a whole number, which the refusal asks for
    assert "expected a whole number above 256 (the byte tokens), got '4096.0'" in error_of(
        capsys, ["prepare", "--dataset", "warandpeace", "--tokenizer", "bpe", "--vocab-size",
                 "4096.0", "--out", str(tmp_path / "d")])
    assert "--tokenizer bpe2: choose one of" in error_of(
        capsys, ["prepare", "--dataset", "warandpeace", "--tokenizer", "bpe2", "--out",
                 str(tmp_path / "d")])
    for fraction in ("1", "0", "nan"):
        assert "--val-fraction must be between 0 and 1" in error_of(
            capsys, ["prepare", "--dataset", "warandpeace", "--val-fraction", fraction, "--out",
                     str(tmp_path / "d")])
    for flags in (["--vocab-size", "100"], ["--repeat", "0"], ["--train-repeat", "0"]):
        error_of(capsys, ["bench", "tokenize", "--data", str(tmp_path / "none.txt"), *flags])


def test_prepare_help_names_every_dataset_it_takes(capsys):
    """--dataset takes only names, which the refusal of a wrong one was the only place to
    learn; and not every one is pinned by a sha256, as the help said."""
    from scratchgpt.data.sources import DATASET_NAMES

    with pytest.raises(SystemExit):
        main(["prepare", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert all(name in text for name in DATASET_NAMES) and "where one is pinned" in text


def _entry(code: str, *argv: str) -> list[str]:
    """Run ``code`` in a fresh interpreter (the process entry must not freeze this one)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                         timeout=120, check=False)
    return out.stdout.split()


def test_the_process_entry_returns_mains_code_and_leaves_shutdown_no_garbage_to_search():
    code = ("import gc, sys; from scratchgpt.cli import run; sys.argv[0] = 'scratchgpt'\n"
            "c = run(); print(c, gc.get_freeze_count() > 0, gc.isenabled())")
    # a bad flag: exit 2 through argparse (before torch is imported)
    caught = "c = 0\ntry: run()\nexcept SystemExit as e: c = e.code"
    assert _entry(code.replace("c = run()", caught), "train", "--no-such-flag") == [
        "2", "True", "True"]
    # a command that returns its code: main's, with every object frozen out of the search
    assert _entry(code, "train", "--dataset", "no/such/dir") == ["2", "True", "True"]


def test_the_process_entry_runs_its_command_with_start_up_frozen_and_the_collector_on():
    # the command sees the modules start-up imported (torch's hundreds of thousands of
    # objects) frozen out of its collections, and collections still on for what it makes
    code = ("import gc, sys\nfrom scratchgpt.commands import train\n"
            "train.run = lambda args: print(gc.get_freeze_count() > 100_000, gc.isenabled())"
            " or 3\nfrom scratchgpt.cli import run; sys.argv[0] = 'scratchgpt'\n"
            "print(run())")
    assert _entry(code, "train") == ["True", "True", "3"]


def test_main_leaves_the_collector_as_it_found_it():
    import gc

    was = gc.isenabled()
    try:
        gc.disable()
        assert main(["train", "--dataset", "no/such/dir"]) == 2
        assert not gc.isenabled()  # a program that turned it off keeps it off
        gc.enable()
        assert main(["train", "--dataset", "no/such/dir"]) == 2
        assert gc.isenabled() and gc.get_freeze_count() == 0  # main itself freezes nothing
    finally:
        (gc.enable if was else gc.disable)()


def test_the_script_and_python_m_enter_through_run():
    import tomllib

    root = Path(__file__).resolve().parents[2]
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["scratchgpt"] == "scratchgpt.cli:run"
    assert "SystemExit(run())" in (root / "src" / "scratchgpt" / "__main__.py").read_text()


def test_resuming_a_finished_run_says_so_and_how_to_extend_it(small_dataset, tmp_path, capsys):
    out = tmp_path / "r"
    shape = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
             "--batch-size", "2", "--eval-iters", "1", "--no-progress"]
    assert main(["train", "--dataset", str(small_dataset), "--out", str(out), "--max-iters",
                 "3", *shape]) == 0
    capsys.readouterr()
    assert main(["train", "--out", str(out), "--resume", "--no-progress"]) == 0
    said = capsys.readouterr().out
    assert "already at step 3 of --max-iters 3" in said and "larger --max-iters" in said
    assert main(["train", "--out", str(out), "--resume", "--max-iters", "4",
                 "--no-progress"]) == 0
    assert "already at step" not in capsys.readouterr().out


@pytest.mark.parametrize("extra", [[], ["--resume"], ["--overwrite"]])
def test_out_naming_a_file_says_it_is_a_file(small_dataset, tmp_path, capsys, extra):
    (tmp_path / "afile").write_text("mine")
    dataset = [] if extra == ["--resume"] else ["--dataset", str(small_dataset)]
    msg = error_of(capsys, ["train", *dataset, "--out", str(tmp_path / "afile"),
                            "--no-progress", *extra])
    assert "is a file" in msg
    assert (tmp_path / "afile").read_text() == "mine"


def test_a_refused_run_leaves_nothing_in_a_dataset_directory(tmp_path, capsys):
    """Not even its lock file: that would be a file prepare did not write, and stop the next
    prepare --overwrite of the dataset."""
    from scratchgpt.data.prepare import prepare_text

    data = tmp_path / "data"
    prepare_text("some text to train on. " * 40, data, "char")
    before = sorted(p.name for p in data.iterdir())
    assert "prepared dataset" in error_of(capsys, ["train", "--dataset", str(data), "--out",
                                                   str(data), "--overwrite", "--no-progress",
                                                   "--block-size", "8"])
    assert sorted(p.name for p in data.iterdir()) == before
    prepare_text("other text to train on. " * 40, data, "char", overwrite=True)


def test_no_help_shows_a_doctest(capsys):
    """Each bench's --help is its module's docstring, less the examples that test it."""
    from scratchgpt.commands.bench import BENCHMARKS

    for name in BENCHMARKS:
        with pytest.raises(SystemExit):
            main(["bench", name, "--help"])
        assert ">>>" not in capsys.readouterr().out, name


def test_a_resume_refuses_another_seed_and_names_the_preset_it_came_from(small_dataset,
                                                                         tmp_path, capsys):
    """A new --seed would change only which batches the evaluations draw (the batches and
    dropout continue from the saved generators): refused. A preset's model settings are
    named as the preset's, not as flags the user never typed."""
    out = str(tmp_path / "r")
    base = ["--dataset", str(small_dataset), "--out", out, "--eval-interval", "10", *TINY]
    assert main(["train", *base, "--max-iters", "10"]) == 0
    line = error_of(capsys, ["train", "--out", out, "--resume", "--seed", "7"])
    assert "--seed 1337" in line and "drop --seed" in line
    line = error_of(capsys, ["train", "--out", out, "--resume", "--preset", "cpu-small",
                             "--max-iters", "20"])
    assert "drop --preset" in line and "--n-embd " not in line.split("drop")[1]


def test_a_time_budget_in_a_config_file_may_be_a_number_of_seconds(small_dataset, tmp_path):
    from scratchgpt.checkpoints import load_checkpoint

    (tmp_path / "c.toml").write_text("time_budget = 30\nmax_iters = 3\n")
    assert main(["train", "--dataset", str(small_dataset), "--config", str(tmp_path / "c.toml"),
                 "--out", str(tmp_path / "r"), *TINY]) == 0
    assert load_checkpoint(tmp_path / "r" / "last.pt").train_config.time_budget == "30s"


def test_a_prompt_reads_end_of_text_as_the_training_text_did(tmp_path, english_text, capsys):
    """prepare encodes a literal <|endoftext|> in the text as the special token; a prompt
    quoting such text is read the same way, not refused with advice for Python callers."""
    from scratchgpt.commands.argtypes import encode
    from scratchgpt.data.dataset import TokenDataset
    from scratchgpt.data.prepare import prepare_text

    doc = english_text[:2_000]
    prepare_text(f"{doc}<|endoftext|>" * 5, tmp_path / "d", "bpe", vocab_size=300)
    data = TokenDataset(tmp_path / "d")
    tok = data.tokenizer()
    val_text = (f"{doc}<|endoftext|>" * 5)[data.meta["train_chars"]:]
    assert encode(tok, val_text, "error") == data.splits["val"].tolist()
    assert tok.eot_id in encode(tok, val_text, "error")
    assert main(["train", "--dataset", str(tmp_path / "d"), "--out", str(tmp_path / "r"),
                 "--max-iters", "1", *TINY]) == 0
    capsys.readouterr()
    assert main(["sample", "--checkpoint", str(tmp_path / "r"), "--prompt",
                 "the end.<|endoftext|>", "--max-new-tokens", "3", "--seed", "0"]) == 0


def test_a_file_where_a_folder_must_be_is_named(tmp_path, capsys):
    """An --out under a file: mkdir says 'File exists', open 'Not a directory', each of some
    path; the one line says which file stands in the way."""
    from scratchgpt.checkpoints import Checkpoint, save_checkpoint
    from scratchgpt.models.gpt import GPT, GPTConfig
    from tests.cli_errors import error_of

    model = GPT(GPTConfig(vocab_size=8, block_size=8, n_layer=1, n_head=1, n_embd=8))
    save_checkpoint(tmp_path / "run" / "best.pt", Checkpoint("gpt", model.config,
                                                             model.state_dict()))
    (tmp_path / "afile").write_text("mine")
    for out in (tmp_path / "afile" / "export", tmp_path / "afile" / "deeper" / "export"):
        line = error_of(capsys, ["convert", "--to", "hf", "--checkpoint", str(tmp_path / "run"),
                                 "--out", str(out)])
        assert f"is below {tmp_path / 'afile'}, a file, not a folder" in line, line
    assert (tmp_path / "afile").read_text() == "mine"


@pytest.fixture
def padded_model(tmp_path) -> Path:
    """A GPT of 70 ids whose tokenizer has 65, saved as an imported model is (no training
    state): its logits favour the 5 padded ids (the 65 real rows of its head are zero, the
    padded ones opposite pairs, one of which beats zero wherever the state is not orthogonal)."""
    from scratchgpt.checkpoints import Checkpoint, save_checkpoint
    from scratchgpt.models.gpt import GPT, GPTConfig
    from scratchgpt.tokenizers import CharTokenizer

    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=70, block_size=16, n_layer=1, n_head=1, n_embd=8,
                    tie_weights=False)
    model = GPT(cfg)
    with torch.no_grad():
        model.lm_head.weight[:65] = 0
        v = torch.randn(2, 8)
        model.lm_head.weight[65:69] = torch.cat([v, -v])
    CharTokenizer([chr(c) for c in range(48, 48 + 65)]).save(tmp_path)
    save_checkpoint(tmp_path / "padded.pt", Checkpoint("gpt", cfg, model.state_dict()))
    return tmp_path / "padded.pt"


def test_a_padded_vocabulary_never_samples_an_id_the_tokenizer_lacks(padded_model, capsys):
    """The padded ids are cut before decoding: they were picked, then 'token ids out of
    range' stopped the stream."""
    for extra in (["--temperature", "0"], ["--temperature", "2", "--seed", "1"],
                  ["--beam", "2"], ["--engine", "numpy", "--temperature", "0"]):
        assert main(["sample", "--checkpoint", str(padded_model), "--prompt", "0",
                     "--max-new-tokens", "12", *extra]) == 0, extra
        assert len(capsys.readouterr().out.strip()) >= 12
    assert main(["inspect", "--checkpoint", str(padded_model), "--prompt", "0", "--top",
                 "70"]) == 0


@pytest.mark.parametrize("argv, flag", [
    (["train", "--out", "", "--max-iters", "1"], "--out"),
    (["train", "--dataset", "", "--out", "x"], "--dataset"),
    (["seq2seq", "train", "--out", ""], "--out"),
    (["experiment", "count", "--out", ""], "--out"),
    (["experiment", "memory", "--out", " "], "--out"),
    (["sample", "--checkpoint", ""], "--checkpoint"),
    (["convert", "--from", "hf", "", "--out", "x"], "--from's PATH"),
    (["convert", "--from", "hf", "y", "--out", ""], "--out"),
    (["bench", "tokenize", "--data", ""], "--data"),  # (a Path("") once: the folder itself)
    (["train", "--dataset", "shakespeare", "--init-from", ""], "--init-from"),  # (from scratch)
    (["sample", "--checkpoint", "x", "--prompt-file", ""], "--prompt-file"),
    (["classify", "--checkpoint", "x", "--eval", ""], "--eval"),
])
def test_an_empty_path_is_refused(tmp_path, monkeypatch, capsys, argv, flag):
    """Path("") is the current directory: an empty --out (an unset shell variable) wrote
    there, or fell back to the default run directory; an empty --from PATH read '.'."""
    monkeypatch.chdir(tmp_path)
    assert f"{flag} is empty (an unset shell variable?)" in error_of(capsys, argv)
    assert not any(tmp_path.iterdir())


def test_config_files_with_a_byte_order_mark_read_and_odd_ones_are_one_line(tmp_path):
    """A BOM (some editors write one) made the first line unreadable; a TOML file nested
    deeply was a RecursionError traceback; a folder or /dev/null was said not to exist."""
    from scratchgpt.errors import ConfigError
    from scratchgpt.training.config import load_config_file

    for name, text in (("c.toml", "max_iters = 7\n"), ("c.json", '{"max_iters": 7}')):
        (tmp_path / name).write_bytes(b"\xef\xbb\xbf" + text.encode())
        assert load_config_file(tmp_path / name) == {"max_iters": 7}
    (tmp_path / "deep.toml").write_text("a = " + "[" * 3000 + "]" * 3000)
    (tmp_path / "dir.toml").mkdir()
    for path, says in ((tmp_path / "deep.toml", "nested too deeply"),
                       (tmp_path / "dir.toml", "is not a plain file"),
                       (tmp_path / "none.toml", "does not exist")):
        with pytest.raises(ConfigError, match=says):
            load_config_file(path)


def test_a_setting_given_twice_in_a_config_file_is_refused(tmp_path):
    """At the top and in a [model] table (or in both tables), one of the two values used to
    win silently, depending on the order of the file."""
    from scratchgpt.errors import ConfigError
    from scratchgpt.training.config import load_config_file

    for text in ("n_layer = 2\n[model]\nn_layer = 3\n",
                 "[train]\nmax_iters = 7\n[model]\nmax_iters = 8\n"):
        (tmp_path / "c.toml").write_text(text)
        with pytest.raises(ConfigError, match=r"sets (n_layer|max_iters) twice"):
            load_config_file(tmp_path / "c.toml")
    (tmp_path / "c.toml").write_text("n_layer = 2\n[model]\nn_embd = 32\n")
    assert load_config_file(tmp_path / "c.toml") == {"n_layer": 2, "n_embd": 32}


def test_range_errors_name_the_flag_typed_and_no_int64_bound(capsys, small_dataset, tmp_path):
    """The configs name settings by field (batch_size); a user who typed --batch-size reads
    that name back, and a count's upper bound (2**63 - 1) is not spelled out below it."""
    base = ["train", "--dataset", str(small_dataset), "--out", str(tmp_path / "r")]
    assert error_of(capsys, [*base, "--batch-size", "0"]).endswith(
        "error: --batch-size must be >= 1, got 0")
    msg = error_of(capsys, [*base, "--grad-accum", "99999999999999999999"])
    assert "error: --grad-accum must be at most 9223372036854775807" in msg
    assert "error: --time-budget: cannot read" in error_of(capsys, [*base, "--time-budget",
                                                                     "5x"])
    conf = tmp_path / "c.toml"
    conf.write_text("warmup_iters = -1\n")  # a file's key is named with the file
    assert f"error: warmup_iters in {conf} must be >= 0" in error_of(capsys, [*base, "--config",
                                                                          str(conf)])
    assert not (tmp_path / "r").exists()


def test_a_config_files_model_setting_is_not_blamed_on_a_flag(capsys, small_dataset,
                                                              tmp_path):
    conf = tmp_path / "c.toml"
    conf.write_text('model = "lstm"\nn_embd = 32\n')
    base = ["train", "--dataset", str(small_dataset), "--out", str(tmp_path / "r")]
    assert error_of(capsys, [*base, "--config", str(conf)]).endswith(
        f"error: the lstm model does not take n_embd in {conf}")
    assert error_of(capsys, [*base, "--model", "lstm", "--n-embd", "32"]).endswith(
        "error: the lstm model does not take --n-embd")


def test_an_error_names_the_subcommand_run(capsys, tmp_path):
    assert error_of(capsys, ["seq2seq", "train", "--out", str(tmp_path / "s"), "--batch-size",
                             "0"]).startswith("scratchgpt seq2seq train: error: --batch-size")


def test_dataset_dot_names_its_folder_for_the_default_run_directory(small_dataset, monkeypatch,
                                                                     tmp_path):
    """`--dataset .` inside a dataset: its short name was "", so the run went to runs/ itself
    (and a second dataset's run into the same folder)."""
    from scratchgpt.data.resolve import resolve_dataset

    monkeypatch.chdir(small_dataset)
    assert resolve_dataset(".", log=None)[1] == small_dataset.name
    monkeypatch.chdir(small_dataset / "..")
    assert resolve_dataset(f"{small_dataset.name}/.", log=None)[1] == small_dataset.name


def test_a_resume_keeps_what_config_json_says_of_how_the_run_began(small_dataset, tmp_path):
    """config.json records the preset and config file a run began with; a resume that names
    neither rewrote them as null (the checkpoints do not keep them)."""
    import json

    conf = tmp_path / "c.toml"
    conf.write_text("eval_interval = 5\n")
    out = tmp_path / "r"
    assert main(["train", "--dataset", str(small_dataset), "--out", str(out), "--preset",
                 "cpu-small", "--config", str(conf), "--max-iters", "5", "--batch-size", "4",
                 *TINY, "--no-progress"]) == 0
    began = json.loads((out / "config.json").read_text())
    assert began["preset"] == "cpu-small" and began["config_file"] == str(conf)
    assert main(["train", "--out", str(out), "--resume", "--max-iters", "10",
                 "--no-progress"]) == 0
    resumed = json.loads((out / "config.json").read_text())
    assert (resumed["preset"], resumed["config_file"]) == ("cpu-small", str(conf))
    assert resumed["train"]["max_iters"] == 10


def test_a_run_started_without_out_is_resumed_by_the_same_command(small_dataset, tmp_path,
                                                                  monkeypatch, capsys):
    """Without --out a run goes to runs/<dataset name>, and the same command with --resume
    continues it there (it was refused: '--resume needs --out'); the dataset spelt as another
    path to the same folder names the same run. Where no such run is, the refusal says
    where it looked and writes nothing."""
    monkeypatch.chdir(tmp_path)
    start = ["train", "--dataset", str(small_dataset), "--max-iters", "4", *TINY]
    assert main(start) == 0
    run = Path("runs") / small_dataset.name
    assert main([*start[:-len(TINY)], "--max-iters", "6", "--resume", "--no-progress"]) == 0
    assert torch.load(run / "last.pt", weights_only=True)["state"]["step"] == 6
    assert f"in {run}\n" in capsys.readouterr().out
    assert main(["train", "--dataset", f"{small_dataset}/.", "--max-iters", "8", "--resume",
                 "--no-progress"]) == 0
    assert torch.load(run / "last.pt", weights_only=True)["state"]["step"] == 8
    capsys.readouterr()
    msg = error_of(capsys, ["train", "--resume", "--max-iters", "9"])
    assert f"--resume without --out continues {Path('runs', 'python-stdlib')} " in msg
    assert "give --out DIR" in msg
    assert sorted(p.name for p in Path("runs").iterdir()) == [small_dataset.name]


def test_a_refusal_naming_two_settings_names_each_as_the_user_gave_it(small_dataset, tmp_path,
                                                                      capsys):
    """The GPT's "n_embd (30) must be divisible by n_head (4)" named neither flag: each
    setting in it now reads as typed (a flag), and the one a config file gave as the file's
    key; a refusal of the file itself keeps naming its keys."""
    out = str(tmp_path / "run")
    base = ["train", "--dataset", str(small_dataset), "--max-iters", "1", "--out", out]
    msg = error_of(capsys, [*base, "--n-embd", "30", "--n-head", "4"])
    assert msg.endswith("error: --n-embd (30) must be divisible by --n-head (4)"), msg
    (tmp_path / "c.toml").write_text("n_embd = 30\n")
    msg = error_of(capsys, [*base, "--config", str(tmp_path / "c.toml"), "--n-head", "4"])
    assert f"n_embd in {tmp_path / 'c.toml'} (30) must be divisible by n_head (4)" in msg
    assert not (tmp_path / "run").exists()


def test_a_gpt_option_refusal_names_the_flags_typed(small_dataset, tmp_path, capsys):
    """"pos_encoding rope rotates pairs ..." and "unet_skips needs n_layer >= 2" named the
    config's fields, not the flags that gave them."""
    out = str(tmp_path / "run")
    base = ["train", "--dataset", str(small_dataset), "--max-iters", "1", "--out", out]
    msg = error_of(capsys, [*base, "--n-embd", "30", "--n-head", "6", "--pos-encoding", "rope"])
    assert msg.endswith("error: --pos-encoding (rope) needs an even head width, as it rotates "
                        "pairs of features: --n-embd / --n-head = 5"), msg
    msg = error_of(capsys, [*base, "--n-layer", "1", "--unet-skips"])
    assert msg.endswith("error: --unet-skips needs --n-layer >= 2 (it joins first-half blocks "
                        "to second-half ones)"), msg
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("rank, world, says", [("1", "2", False), ("0", "2", True),
                                               ("1", "1", True), (None, None, True)])
def test_a_ctrl_c_is_told_once_under_torchrun(monkeypatch, capsys, rank, world, says):
    """torchrun sends a Ctrl-C to every process: one still importing torch, before any
    process group, printed its own 'interrupted' line, one line per rank. Rank 0 alone (or a
    process of no torchrun job) says it; every one exits 130."""
    from scratchgpt.commands import eval as eval_command

    for name, value in (("RANK", rank), ("WORLD_SIZE", world)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(eval_command, "run", interrupted)
    assert main(["eval", "--checkpoint", "runs/x"]) == 130
    assert capsys.readouterr().err == ("scratchgpt eval: interrupted\n" if says else "")


def test_dtype_help_says_what_auto_picks_and_where_a_run_records_it(small_dataset, tmp_path,
                                                                    capsys):
    """--dtype's help listed 'auto' among the precisions without saying what it picks, so
    whether a run trained in bf16 could not be told from the command line; it says, and
    names the config.json entry that records what the run used."""
    import json

    from scratchgpt.training.precision import resolve_dtype

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    words = " ".join(capsys.readouterr().out.split())
    dtype = words[words.index("--dtype DTYPE compute precision"):]
    dtype = dtype[:dtype.index("--device DEVICE")]
    assert "auto (bf16 where the device runs it fast" in dtype and "else fp32" in dtype
    key = "dtype_resolved"
    assert key in dtype
    assert main(["train", "--dataset", str(small_dataset), *TINY, "--dtype", "auto",
                 "--max-iters", "1", "--out", str(tmp_path / "r")]) == 0
    recorded = json.loads((tmp_path / "r" / "config.json").read_text())
    assert recorded[key] == resolve_dtype("auto", torch.device("cpu"))
