"""``scratchgpt sample --draft`` and ``scratchgpt bench speculative`` through ``main([...])``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from scratchgpt.cli import main
from scratchgpt.models.compiled import compile_available
from tests.commands.sampling import assert_seeded_and_stops

TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
        "--batch-size", "4", "--eval-iters", "2", "--no-progress", "--dtype", "fp32"]


def train(dataset: Path, out: Path, *extra: str) -> Path:
    assert main(["train", "--dataset", str(dataset), "--out", str(out), "--max-iters", "20",
                 "--eval-interval", "10", *TINY, *extra]) == 0
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory, small_dataset) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("spec-runs")
    other = tmp_path_factory.mktemp("other-data") / "text.txt"
    other.write_text("abc abd abe " * 2000)
    assert main(["prepare", "--data", str(other), "--out", str(root / "other-data")]) == 0
    return {"target": train(small_dataset, root / "target", "--n-layer", "2"),
            "draft": train(small_dataset, root / "draft", "--seed", "7"),
            "foreign": train(root / "other-data", root / "foreign")}


def test_greedy_speculative_cli_equals_target_greedy(runs, capsys):
    base = ["sample", "--checkpoint", str(runs["target"]), "--prompt", "Th", "--temperature",
            "0", "--max-new-tokens", "40"]
    assert main(base) == 0
    greedy = capsys.readouterr().out
    for extra in (["--speculate", "3"], ["--no-stream"]):
        assert main([*base, "--draft", str(runs["draft"]), *extra]) == 0
        captured = capsys.readouterr()
        assert captured.out == greedy
        assert "acceptance rate" in captured.err


def test_speculative_cli_seeded_and_stops(runs, capsys):
    args = ["sample", "--checkpoint", str(runs["target"]), "--draft", str(runs["draft"]),
            "--max-new-tokens", "60", "--seed", "4", "--temperature", "0.8"]
    assert_seeded_and_stops(args, capsys)


@pytest.mark.parametrize("flags, needle", [
    (["--speculate", "2"], "--speculate needs --draft"),
    (["--draft", "FOREIGN"], "different tokenizers"),
    (["--draft", "DRAFT", "--speculate", "0"], "--speculate must be >= 1"),
    (["--draft", "DRAFT", "--num-samples", "2"], "does not combine"),
    # (it said "checkpoint X does not exist": which of the two?)
    (["--draft", "MISSING"], "error: --draft: checkpoint MISSING does not exist"),
])
def test_speculative_cli_errors(runs, capsys, flags, needle):
    missing = str(runs["draft"].parent / "no-such-run")
    flags = [str(runs["foreign"]) if f == "FOREIGN" else str(runs["draft"]) if f == "DRAFT"
             else missing if f == "MISSING" else f for f in flags]
    needle = needle.replace("MISSING", missing)
    code = main(["sample", "--checkpoint", str(runs["target"]), "--max-new-tokens", "5", *flags])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and "Traceback" not in err, err


def test_bench_speculative_json(runs, capsys):
    assert main(["bench", "speculative", "--checkpoint", str(runs["target"]), "--draft",
                 str(runs["draft"]), "--k", "1,3", "--tokens", "12", "--repeats", "2",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["k"] for r in report["results"]] == [1, 3]
    assert report["target_params"] > report["draft_params"] > 0  # as trained, not as packed
    for row in report["results"]:
        assert 0 < row["acceptance_rate"] <= 1 and row["speedup_measured"] > 0
        assert 0 <= row["mean_accepted"] <= row["k"]


@pytest.mark.parametrize("extra", [["--draft", "ngram"], ["--draft", "ngram", "--speculate",
                                                           "auto"], ["--speculate", "auto"]])
def test_prompt_lookup_and_auto_k_cli_equal_target_greedy(runs, capsys, extra):
    base = ["sample", "--checkpoint", str(runs["target"]), "--prompt", "the the the th",
            "--temperature", "0", "--max-new-tokens", "40"]
    assert main(base) == 0
    greedy = capsys.readouterr().out
    extra = extra if "--draft" in extra else ["--draft", str(runs["draft"]), *extra]
    assert main([*base, *extra]) == 0
    captured = capsys.readouterr()
    assert captured.out == greedy
    assert "acceptance rate" in captured.err
    assert ("K picked" in captured.err) == ("auto" in extra)
    # what was proposed beside what was taken: a lookup that finds nothing proposes nothing
    proposed, accepted = re.search(r"([\d.]+) draft tokens proposed and ([\d.]+) accepted",
                                   captured.err).groups()
    assert float(proposed) >= float(accepted)


def test_speculate_takes_a_number_or_auto(runs, capsys):
    code = main(["sample", "--checkpoint", str(runs["target"]), "--draft", "ngram",
                 "--speculate", "many"])
    err = capsys.readouterr().err
    assert code == 2 and "a number or 'auto'" in err and "Traceback" not in err


def test_bench_speculative_ngram_and_auto(runs, tmp_path, capsys):
    passage = tmp_path / "passage.txt"
    passage.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n")
    assert main(["bench", "speculative", "--checkpoint", str(runs["target"]), "--draft",
                 "ngram", "--prompt-file", str(passage), "--copy-task", "--k", "2,auto",
                 "--tokens", "12", "--repeats", "1", "--temperature", "0", "--json"]) == 0
    out = capsys.readouterr().out
    assert "NaN" not in out  # one run has no standard error: null, valid JSON
    report = json.loads(out)
    assert report["draft"] == "ngram" and report["draft_params"] == 0
    fixed, auto = report["results"]
    assert fixed["k"] == 2 and auto["k"] == "auto"
    assert sum(auto["k_picked"]["counts"].values()) >= 1
    for row in (fixed, auto):
        assert 0 < row["acceptance_rate"] <= 1 and row["t_target_score_ms"] > 0
        assert row["nll_speculative"][0] == pytest.approx(row["nll_target_only"][0])  # greedy
        assert row["nll_speculative"][1] is None


def test_bench_speculative_prompt_file_it_cannot_read_is_one_line(runs, tmp_path, capsys):
    """A file that is not UTF-8 was a UnicodeDecodeError traceback, and was read only after
    the models were loaded."""
    from tests.cli_errors import error_of

    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    assert "latin1.txt is not valid UTF-8 text (byte 3)" in error_of(capsys, [
        "bench", "speculative", "--checkpoint", str(runs["target"]), "--draft", "ngram",
        "--prompt-file", str(tmp_path / "latin1.txt"), "--k", "1", "--tokens", "2"])


@pytest.mark.parametrize("mixed", [["--random-target", "1,1,8", "--checkpoint", "TARGET"],
                                   ["--random-target", "1,1,8", "--draft", "TARGET"],
                                   ["--checkpoint", "TARGET", "--draft", "ngram",
                                    "--random-draft", "1,1,8"]])
def test_bench_speculative_random_and_checkpoint_flags_do_not_mix(runs, mixed, capsys):
    """One side's flags were silently ignored: the random models were timed instead of the
    checkpoint, or the checkpoint's draft instead of the random one."""
    from tests.cli_errors import error_of

    argv = [str(runs["target"]) if a == "TARGET" else a for a in mixed]
    assert "--random-" in error_of(capsys, ["bench", "speculative", *argv, "--k", "1",
                                            "--tokens", "2", "--repeats", "1"])


@pytest.mark.parametrize("ignored, needle", [
    (["--random-target", "1,1,8", "--prompt", "hi"], "--prompt or --prompt-file"),
    (["--checkpoint", "TARGET", "--draft", "ngram", "--prompt-len", "5"],
     "--prompt-len shape random models"),
    (["--checkpoint", "TARGET", "--draft", "ngram", "--vocab-size", "50", "--block-size", "8"],
     "--vocab-size, --block-size shape random models"),
    (["--random-target", "1,1,8", "--random-draft", "1,1,8", "--draft", "ngram"],
     "two drafters"),
])
def test_bench_speculative_refuses_a_flag_its_models_ignore(runs, ignored, needle, capsys):
    """Random models have no tokenizer, so --prompt was dropped for 64 random tokens; a
    checkpoint has its own shape, so --prompt-len, --vocab-size and --block-size were dropped;
    --draft ngram won over --random-draft. Each ran and reported, as if the flag had counted."""
    from tests.cli_errors import error_of

    argv = [str(runs["target"]) if a == "TARGET" else a for a in ignored]
    assert needle in error_of(capsys, ["bench", "speculative", *argv, "--k", "1",
                                       "--tokens", "2", "--repeats", "1"])


def test_bench_speculative_prompt_and_prompt_file_exclude_each_other(runs, tmp_path, capsys):
    """--prompt-file won and --prompt was dropped, as sample refuses the pair."""
    from tests.cli_errors import error_of

    (tmp_path / "p.txt").write_text("abc")
    assert "not allowed with argument --prompt" in error_of(capsys, [
        "bench", "speculative", "--checkpoint", str(runs["target"]), "--draft", "ngram",
        "--prompt", "a", "--prompt-file", str(tmp_path / "p.txt"), "--k", "1"])


def test_bench_speculative_names_the_draft_it_refuses(runs, capsys):
    """Two checkpoints on one line: a missing draft was 'checkpoint X does not exist', as a
    missing target is, and the user had to guess which (sample says '--draft: ...' too)."""
    from tests.cli_errors import error_of

    missing = runs["draft"].parent / "no-such-run"
    assert error_of(capsys, ["bench", "speculative", "--checkpoint", str(runs["target"]),
                             "--draft", str(missing), "--k", "1"]).startswith(
        f"scratchgpt bench speculative: error: --draft: checkpoint {missing} does not exist")


def test_bench_speculative_random_gpt_shapes(capsys):
    """The way to time a GPT-2-shaped target with a small random draft, at toy size."""
    assert main(["bench", "speculative", "--random-target", "2,2,32", "--random-draft",
                 "1,2,16", "--vocab-size", "50", "--block-size", "64", "--prompt-len", "10",
                 "--k", "3", "--tokens", "10", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "random GPT 2,2,32" in out and "theory" in out


@pytest.fixture
def small_compile_limit(runs, monkeypatch):
    """A --compile size limit between the draft's weights and the target's (2 layers to 1),
    as for a large target and its small draft."""
    import scratchgpt.models.compiled as compiled
    from scratchgpt.checkpoints import load_model
    from scratchgpt.models.fast_decode import weight_bytes

    sizes = [weight_bytes(load_model(runs[name])[0]) for name in ("draft", "target")]
    assert sizes[0] < sizes[1]
    monkeypatch.setattr(compiled, "COMPILE_MAX_BYTES", sizes[0])
    return sizes[0]


@pytest.mark.skipif(compile_available() is not None, reason=str(compile_available()))
def test_compile_with_a_draft_compiles_the_draft_only(runs, capsys, small_compile_limit):
    base = ["sample", "--checkpoint", str(runs["target"]), "--prompt", "Th", "--temperature",
            "0", "--max-new-tokens", "40"]
    assert main(base) == 0
    greedy = capsys.readouterr().out
    assert main([*base, "--draft", str(runs["draft"]), "--compile"]) == 0
    captured = capsys.readouterr()
    assert captured.out == greedy
    assert "the target's stay eager" in captured.err and "small models" in captured.err
    assert main(["bench", "speculative", "--checkpoint", str(runs["target"]), "--draft",
                 str(runs["draft"]), "--k", "2", "--tokens", "12", "--repeats", "1",
                 "--compile", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["compiled"] == ["draft"] and report["draft_dtype"] == "fp32"


def test_compile_needs_one_model_of_the_pair_that_can(runs, capsys, monkeypatch):
    import scratchgpt.models.compiled as compiled

    monkeypatch.setattr(compiled, "COMPILE_MAX_BYTES", 1)
    code = main(["sample", "--checkpoint", str(runs["target"]), "--draft", str(runs["draft"]),
                 "--compile", "--max-new-tokens", "5"])
    err = capsys.readouterr().err
    assert code == 2 and "neither model can decode compiled" in err and "Traceback" not in err


def test_draft_dtype_needs_a_draft_model(runs, capsys):
    for extra in ([], ["--draft", "ngram"]):
        code = main(["sample", "--checkpoint", str(runs["target"]), "--draft-dtype", "bf16",
                     "--max-new-tokens", "5", *extra])
        err = capsys.readouterr().err
        assert code == 2 and "--draft-dtype needs --draft" in err, err


def test_bench_speculative_without_a_prompt_starts_where_sample_does(runs, capsys):
    """Its default prompt was a newline: on a vocabulary without one (the foreign model is
    trained on text with no newline) the run failed with "'\\n' not in the vocabulary", of a
    prompt nobody typed, where sample starts from a space."""
    assert main(["bench", "speculative", "--checkpoint", str(runs["foreign"]), "--draft",
                 "ngram", "--k", "1", "--tokens", "4", "--repeats", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["prompt_tokens"] == 1
    from scratchgpt.bench.speculative import prompt_ids
    from scratchgpt.tokenizers.char import CharTokenizer

    prose, lines = CharTokenizer(list("ab c")), CharTokenizer(list("ab\n c"))
    assert prompt_ids(prose, None, False) == prose.encode(" ")
    assert prompt_ids(lines, None, False) == lines.encode("\n")
    assert prompt_ids(lines, "ab c", True) == lines.encode("ab c\n\na")
    # the copy task's blank line was "'\n' not in the vocabulary", of a character not typed
    assert prompt_ids(prose, "ab c", True) == prose.encode("ab c a")
    assert prompt_ids(CharTokenizer(list("abc")), "abc", True) == [0, 1, 2, 0]


def test_bench_speculative_copy_task_needs_a_prompt(runs, capsys):
    """--copy-task without a prompt timed a copy of the default newline: nothing to look up,
    reported as a copy task."""
    from tests.cli_errors import error_of

    line = error_of(capsys, ["bench", "speculative", "--checkpoint", str(runs["target"]),
                             "--draft", "ngram", "--copy-task", "--k", "1", "--tokens", "2"])
    assert "--copy-task repeats the prompt's text: give --prompt or --prompt-file" in line
