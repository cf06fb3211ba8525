"""``scratchgpt attention`` (a GPT's attention weights as heatmaps) and ``scratchgpt inspect``
(next-token probabilities under sampling settings), on tiny models built here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from scratchgpt.checkpoints import Checkpoint, save_checkpoint
from scratchgpt.cli import main
from scratchgpt.models import build_model, model_config
from scratchgpt.tokenizers import CharTokenizer
from tests.cli_errors import error_of

CHARS = list("abcdefghijklmnopqrstuvwxyz .,\n")
PNG = b"\x89PNG"
SHAPES = {
    "gpt": dict(block_size=16, n_layer=2, n_head=3, n_embd=12),
    "bigram": dict(block_size=16),
    "lstm": dict(n_layer=1, hidden=8, block_size=16),
    "rnn-classifier": dict(n_classes=2, hidden=8, embed_dim=4),  # no next-token prediction
}


def save_run(directory: Path, model_type: str) -> Path:
    torch.manual_seed(0)
    settings = {"vocab_size": len(CHARS), **SHAPES[model_type]}
    model = build_model(model_config(model_type, **settings))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))  # far from uniform: distinct, readable probabilities
    CharTokenizer(CHARS).save(directory)
    save_checkpoint(directory / "best.pt", Checkpoint(model_type, model.config,
                                                      model.state_dict()))
    return directory


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("runs")
    return {t: save_run(base / t, t) for t in SHAPES}


def load(run: Path):
    from scratchgpt.checkpoints import load_model

    return load_model(run)[0]


def ids(text: str) -> list[int]:
    return CharTokenizer(CHARS).encode(text)


# ---- attention


def test_attention_grid_of_every_layer_and_head(runs, tmp_path, capsys):
    out = tmp_path / "a.png"
    assert main(["attention", "--checkpoint", str(runs["gpt"]), "--text", "the cat\nsat",
                 "--out", str(out)]) == 0
    assert out.read_bytes().startswith(PNG)
    assert "2 layers x 3 heads over 11 tokens" in capsys.readouterr().out


def test_attention_replaces_a_figure_only_with_overwrite(runs, tmp_path, capsys):
    out = tmp_path / "a.png"
    out.write_bytes(b"an earlier figure")
    args = ["attention", "--checkpoint", str(runs["gpt"]), "--text", "the cat", "--out", str(out)]
    assert main(args) == 2
    assert capsys.readouterr().err == (f"scratchgpt attention: error: {out} already exists; "
                                       "pass --overwrite to replace it\n")
    assert out.read_bytes() == b"an earlier figure"
    assert main([*args, "--overwrite"]) == 0
    assert out.read_bytes().startswith(PNG)


def test_attention_plots_the_chosen_head(runs, tmp_path, monkeypatch):
    """What reaches the figure is the model's own attention of that layer and head."""
    from scratchgpt import viz

    seen = {}
    real = viz.attention_figure

    def spy(weights, labels, layers, heads, title=""):
        seen.update(weights=weights, labels=labels, layers=layers, heads=heads)
        return real(weights, labels, layers, heads, title)

    monkeypatch.setattr(viz, "attention_figure", spy)
    assert main(["attention", "--checkpoint", str(runs["gpt"]), "--text", "a cat",
                 "--layer", "-1", "--head", "2", "--out", str(tmp_path / "h.svg")]) == 0
    _, per_layer = load(runs["gpt"]).forward_with_attention(torch.tensor([ids("a cat")]))
    assert seen["layers"] == [1] and seen["heads"] == [2]
    assert seen["labels"] == ["a", "␣", "c", "a", "t"]
    w = torch.from_numpy(seen["weights"])
    assert w.shape == (1, 1, 5, 5)
    torch.testing.assert_close(w[0, 0], per_layer[1][0, 2])
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 1, 5))  # rows are distributions
    assert torch.all(w[0, 0].triu(1) == 0)  # and nothing comes from the future
    assert (tmp_path / "h.svg").read_text().lstrip().startswith("<?xml")


def test_attention_cuts_text_longer_than_the_context(runs, tmp_path, capsys):
    assert main(["attention", "--checkpoint", str(runs["gpt"]), "--text", "abc " * 10,
                 "--head", "0", "--out", str(tmp_path / "a.png")]) == 0
    captured = capsys.readouterr()
    assert "plotting the first 16" in captured.err
    assert "over 16 tokens" in captured.out


@pytest.mark.parametrize("text, shown", [
    ("abc " * 10, "'abc abc abc abc '"),  # cut to the context of 16: the tokens plotted
    ("a cat", "'a cat'"),
])
def test_attention_title_quotes_the_text_plotted(runs, tmp_path, monkeypatch, text, shown):
    """The title quoted the whole text (up to 60 characters, with no sign of a cut) over a
    figure of the context's first tokens alone."""
    from scratchgpt import viz

    titles = []
    real = viz.attention_figure

    def spy(weights, labels, layers, heads, title=""):
        titles.append(title)
        return real(weights, labels, layers, heads, title)

    monkeypatch.setattr(viz, "attention_figure", spy)
    assert main(["attention", "--checkpoint", str(runs["gpt"]), "--text", text, "--head", "0",
                 "--out", str(tmp_path / "a.png")]) == 0
    assert titles == [f"{runs['gpt'].name}: {shown}"]


def test_a_title_marks_the_text_it_leaves_out():
    from scratchgpt.commands.attention import TITLE_CHARS, quoted

    assert quoted("x" * TITLE_CHARS) == repr("x" * TITLE_CHARS)
    assert quoted("x" * (TITLE_CHARS + 1)) == repr("x" * TITLE_CHARS) + "..."


@pytest.mark.parametrize("text, out, extra, message", [
    ("abc", "a.png", ["--layer", "2"], "--layer must be in [0, 1]"),
    ("abc", "a.png", ["--head", "-4"], "--head must be in [0, 2]"),
    ("ABC", "a.png", [], "not in the vocabulary: 'A', 'B', 'C'"),
    ("abc", "a.unknownformat", [], "is not an image format"),
    # (it said "the text is empty after tokenization", once the model had loaded)
    ("", "a.png", [], "error: --text is empty; give the text whose attention to plot"),
])
def test_attention_bad_input(runs, tmp_path, capsys, text, out, extra, message):
    line = error_of(capsys, ["attention", "--checkpoint", str(runs["gpt"]), "--text", text,
                                   "--out", str(tmp_path / out), *extra])
    assert message in line
    assert not (tmp_path / out).exists()


def test_attention_unknown_replace(runs, tmp_path, capsys):
    assert main(["attention", "--checkpoint", str(runs["gpt"]), "--text", "aBc", "--out",
                 str(tmp_path / "a.png"), "--unknown", "replace"]) == 0
    assert "over 3 tokens" in capsys.readouterr().out


def test_characters_missing_from_the_font_are_one_note_not_a_warning_each(runs, tmp_path):
    """matplotlib warns of each character its font lacks (CJK in DejaVu Sans), from each place
    that lays the text out; the command says it once, in words, and nothing else on stderr."""
    import subprocess
    import sys

    out = tmp_path / "a.png"
    said = subprocess.run(
        [sys.executable, "-m", "scratchgpt", "attention", "--checkpoint", str(runs["gpt"]),
         "--text", "ab你好😀你", "--unknown", "replace", "--out", str(out)],
        capture_output=True, text=True, timeout=120, check=False)
    assert said.returncode == 0 and out.read_bytes().startswith(PNG)
    assert "Warning" not in said.stderr
    # 😀 is one DejaVu Sans draws; 你 is named once though the text has it twice
    assert said.stderr == (f"note: 2 characters have no glyph in the font of {out} and "
                           "show as boxes: 你 好\n")


def test_missing_glyphs_are_the_visible_texts_characters_no_font_has():
    from scratchgpt.viz import missing_glyphs, pyplot

    fig, ax = pyplot().subplots()
    ax.set_title("é 😀 你")
    ax.set_xticks([0, 1], ["好", "ab"])
    ax.text(0, 0, "猫", visible=False)  # not drawn: no box to explain
    try:
        assert sorted(missing_glyphs(fig)) == ["你", "好"]
    finally:
        pyplot().close(fig)


def test_attention_refuses_a_model_without_attention(runs, tmp_path, capsys):
    line = error_of(capsys, ["attention", "--checkpoint", str(runs["lstm"]), "--text",
                                   "abc", "--out", str(tmp_path / "a.png")])
    assert "holds an lstm model" in line and "GPT" in line  # (it said 'a lstm model')
    assert not (tmp_path / "a.png").exists()


# ---- inspect


def inspect_json(capsys, run: Path, prompt: str, *extra: str) -> dict:
    assert main(["inspect", "--checkpoint", str(run), "--prompt", prompt, "--json",
                 *extra]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("model_type", ["gpt", "bigram", "lstm"])
def test_inspect_lists_the_models_own_probabilities(runs, capsys, model_type):
    rep = inspect_json(capsys, runs[model_type], "the ca", "--top", "5")
    probs = torch.softmax(load(runs[model_type])(torch.tensor([ids("the ca")]))[0, -1], -1)
    expected = probs.topk(5)
    assert [r["id"] for r in rep["top"]] == expected.indices.tolist()
    got = torch.tensor([r["probs"]["model"] for r in rep["top"]])
    torch.testing.assert_close(got, expected.values)
    assert rep["model_type"] == model_type and rep["kept"]["model"] == len(CHARS)


def test_the_same_setting_twice_is_one_column(runs, capsys):
    """T=0 is greedy and k=0 leaves T=1: each distribution once, in the order first given."""
    rep = inspect_json(capsys, runs["gpt"], "a b", "--setting", "T=0", "--setting", "k=3",
                       "--setting", "greedy", "--setting", "k=0", "--setting", "T=1")
    assert rep["settings"] == ["model", "greedy", "top-k=3", "T=1"]
    assert all(set(r["probs"]) == set(rep["settings"]) for r in rep["top"])


def test_inspect_settings_reshape_as_sampling_does(runs, capsys):
    rep = inspect_json(capsys, runs["gpt"], "a b", "--top", str(len(CHARS)), "--setting", "k=3",
                       "--setting", "greedy", "--setting", "T=0.5", "--setting", "p=0.5")
    assert rep["settings"] == ["model", "top-k=3", "greedy", "T=0.5", "top-p=0.5"]
    model = torch.tensor([r["probs"]["model"] for r in rep["top"]])
    top_k = torch.tensor([r["probs"]["top-k=3"] for r in rep["top"]])
    # top-k: the three most likely tokens, in their old proportions, renormalised
    assert rep["kept"]["top-k=3"] == 3 and torch.all(top_k[3:] == 0)
    torch.testing.assert_close(top_k[:3], model[:3] / model[:3].sum())
    greedy = [r["probs"]["greedy"] for r in rep["top"]]
    assert greedy[0] == 1.0 and sum(greedy) == 1.0
    # temperature 0.5 squares the probabilities (up to normalisation): p^2 / sum p^2
    cool = torch.tensor([r["probs"]["T=0.5"] for r in rep["top"]])
    torch.testing.assert_close(cool, model.double().square().div(model.double().square().sum())
                               .float(), atol=1e-5, rtol=1e-4)
    assert rep["entropy"]["T=0.5"] < rep["entropy"]["model"] and rep["entropy"]["greedy"] == 0
    # top-p: the fewest most likely tokens whose mass reaches 0.5
    kept = rep["kept"]["top-p=0.5"]
    assert model[:kept].sum() >= 0.5 > model[:kept - 1].sum()


def test_inspect_reads_only_the_gpt_context(runs, capsys):
    long = "abcdefghij" * 3
    assert main(["inspect", "--checkpoint", str(runs["gpt"]), "--prompt", long, "--json"]) == 0
    captured = capsys.readouterr()
    assert "reads the last 16" in captured.err
    rep = json.loads(captured.out)
    assert rep["tokens_read"] == 16
    assert rep == {**inspect_json(capsys, runs["gpt"], long[-16:]), "prompt": long}


def test_an_empty_prompt_shows_the_first_token_sample_draws_without_one(runs, capsys):
    """sample without a prompt starts a character model from a newline; inspect --prompt ''
    shows that distribution (it was refused as empty), and says what it read."""
    rep = inspect_json(capsys, runs["gpt"], "")
    assert rep == {**inspect_json(capsys, runs["gpt"], "\n"), "prompt": ""}
    assert main(["inspect", "--checkpoint", str(runs["gpt"]), "--prompt", ""]) == 0
    assert capsys.readouterr().out.startswith("next token after '\\n' (gpt, 1 token read)")


def test_inspect_table_and_figure(runs, tmp_path, capsys):
    out = tmp_path / "d.png"
    assert main(["inspect", "--checkpoint", str(runs["lstm"]), "--prompt", "ab", "--out",
                 str(out), "--top", "4"]) == 0
    text = capsys.readouterr().out
    assert "top-k=10" in text and "(all others)" in text and "entropy" in text
    assert len([line for line in text.splitlines() if line.strip()[:1].isdigit()]) == 4
    assert out.read_bytes().startswith(PNG)
    # --top of every token leaves no others: the row of 0.0000s said there were some
    assert main(["inspect", "--checkpoint", str(runs["lstm"]), "--prompt", "ab", "--top",
                 str(len(CHARS))]) == 0
    assert "(all others)" not in capsys.readouterr().out
    drawn = out.read_bytes()  # drawn again only with --overwrite
    args = ["inspect", "--checkpoint", str(runs["lstm"]), "--prompt", "b", "--out", str(out)]
    assert main(args) == 2 and "already exists" in capsys.readouterr().err
    assert out.read_bytes() == drawn
    assert main([*args, "--overwrite"]) == 0 and out.read_bytes() != drawn
    assert main(["inspect", "--checkpoint", str(runs["lstm"]), "--prompt", "b",
                 "--overwrite"]) == 2  # with nothing to replace
    assert "--overwrite replaces the --out file" in capsys.readouterr().err


def test_inspect_refuses_a_model_that_predicts_no_next_token(runs, tmp_path, capsys):
    out = tmp_path / "d.png"
    line = error_of(capsys, ["inspect", "--checkpoint", str(runs["rnn-classifier"]),
                             "--prompt", "ab", "--out", str(out)])
    assert "holds an rnn-classifier model" in line and "language model" in line
    assert not out.exists()


@pytest.mark.parametrize("setting, message", [
    ("T=warm", "not a number"), ("x=1", "cannot read sampling setting"),
    # a number, but no count of tokens: it said '2.5' "is not a number"
    ("k=2.5", "'2.5' is not a whole number (k counts tokens)"),
    ("top-k=1e3", "'1e3' is not a whole number (top-k counts tokens)"),
    ("k=many", "'many' is not a number"),
    # a value out of range is named by the key typed, not the field it sets (top_k)
    ("p=1.5", "sampling setting 'p=1.5': p must be in (0, 1]"),
    ("T=-1", "sampling setting 'T=-1': T must be >= 0"),
    ("k=-1", "sampling setting 'k=-1': k must be >= 0, got -1"),
    ("T=0.5,top-k=-2", "sampling setting 'T=0.5,top-k=-2': top-k must be >= 0"),
])
def test_inspect_bad_settings(runs, capsys, setting, message):
    line = error_of(capsys, ["inspect", "--checkpoint", str(runs["bigram"]), "--prompt",
                                   "a", "--setting", setting])
    assert message in line


def test_distribution_figure_draws_the_given_probabilities():
    from scratchgpt.viz import distribution_figure

    fig = distribution_figure(["a", "␣"], [("model", [0.5, 0.25]), ("top-k=1", [1.0, 0.0])])
    first, second = (ax.patches for ax in fig.axes)
    assert [round(b.get_height(), 6) for b in first] == [0.5, 0.25, 0.25]  # last: "other"
    assert [round(b.get_height(), 6) for b in second] == [1.0, 0.0, 0.0]
    assert [t.get_text() for t in fig.axes[1].texts] == ["1.00", "×", "×"]


def test_the_other_bar_is_crossed_only_where_a_setting_cut_every_other_token():
    """A distribution whose tokens past the listed ones hold a sliver of mass (1e-8, below
    float round-off of 1 - the listed sum): nothing was cut, so its "other" bar reads 0.00, not
    ×, the mark of a cut; top-k=1 cuts them all. A bar at 1.0 keeps its label in its panel."""
    from scratchgpt.commands.inspect import draw, report
    from scratchgpt.generation.next_token import parse_setting

    tok = CharTokenizer(list("abcdefgh"))
    logits = torch.tensor([20.0, 2.0] + [0.0] * 6)
    rep = report(tok, logits, [parse_setting("k=1")], top=2)
    assert rep["kept"] == {"model": 8, "top-k=1": 1}
    assert 0 < rep["others"]["model"] < 1e-6 and rep["others"]["top-k=1"] == 0
    figures = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("scratchgpt.viz.save_figure", lambda fig, out: figures.append(fig))
        draw(rep, "next.png")
    model, top_k = figures[0].axes
    assert [t.get_text() for t in model.texts][-1] == "0.00"  # "other": a sliver, not cut
    assert [t.get_text() for t in top_k.texts] == ["1.00", "×", "×"]
    assert top_k.get_ylim()[1] > 1.0 and max(top_k.get_yticks()) <= 1.0


def test_visible_labels():
    from scratchgpt.tokenizers import BPETokenizer
    from scratchgpt.viz import token_labels, visible

    assert visible(" a\n\tb\r") == "␣a↵⇥b\\r" and visible("") == "∅"
    bytes_only = BPETokenizer.train("héllo wörld " * 20, 258)  # 1 merge: é stays two bytes
    assert token_labels(bytes_only, bytes_only.encode(" hé")) == ["␣", "h", "\\xc3", "\\xa9"]
    merged = BPETokenizer.train("héllo wörld " * 20, 300)
    assert token_labels(merged, merged.encode(" héllo")) == ["␣héllo"]


def test_running_mean_keeps_the_length_and_start():
    from scratchgpt.viz import running_mean

    assert running_mean([1, 3, 5, 7], 2) == [1.0, 2.0, 4.0, 6.0]
    assert running_mean([2, 4], 10) == [2.0, 3.0]
    values = [0.5 * i * i for i in range(30)]
    assert running_mean(values, 1) == values
    assert running_mean(values, 7)[-1] == pytest.approx(sum(values[-7:]) / 7)


def test_time_curves_figure_draws_each_run_in_one_colour():
    from scratchgpt.viz import time_curves_figure

    fig = time_curves_figure({"a": ([0, 1, 2], [3.0, 2.0, 1.5]), "b": ([0, 2], [4.0, 2.5])},
                             {"a": (2.0, 1.4), "c": (1.0, 2.0)}, "bits/char")
    (ax,) = fig.axes
    line_a, dot_a, line_b, dot_c = ax.lines
    assert list(line_a.get_ydata()) == [3.0, 2.0, 1.5] and list(dot_a.get_xdata()) == [2.0]
    assert line_a.get_color() == dot_a.get_color() != line_b.get_color() != dot_c.get_color()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["a: 1.4000", "b", "c: 2.0000"]


def test_figures_draw_dollar_signs_as_written(tmp_path):
    """Tokens, class labels and titles are the user's text: between two "$" matplotlib read
    math, and "$$" or "$\\frac$" (a LaTeX corpus's tokens) were a ParseException when the
    figure was laid out."""
    from matplotlib.text import Text

    from scratchgpt.training.metrics import plot_losses
    from scratchgpt.viz import attention_figure, confusion_figure, distribution_figure, save_figure

    labels = ["$$", "$\\frac$", "$x$"]
    weights = torch.full((1, 1, 3, 3), 1 / 3).numpy()
    figures = [attention_figure(weights, labels, [0], [0], title="$$"),
               distribution_figure(labels, [("$$", [0.5, 0.3, 0.2])]),
               confusion_figure([[1, 0, 0], [0, 1, 0], [0, 0, 1]], labels, title="$$")]
    for i, fig in enumerate(figures):
        save_figure(fig, tmp_path / f"f{i}.png")
        texts = fig.findobj(Text)
        assert set(labels) <= {t.get_text() for t in texts}
        assert not any(t.get_parse_math() for t in texts)
    run = tmp_path / "run $$"
    run.mkdir()
    (run / "metrics.csv").write_text("step,loss,train_loss,val_loss\n1,2.0,,\n2,1.5,1.6,1.7\n")
    plot_losses(run / "metrics.csv", run / "loss.png")  # titled with the folder's name
    assert (run / "loss.png").stat().st_size > 0
