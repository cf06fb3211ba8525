"""``scratchgpt sample --beam`` stopped by Ctrl-C part-way through its search."""

from __future__ import annotations

import pytest
import torch

from scratchgpt.cli import main


def _interrupted_after(monkeypatch, k: int) -> list:
    """Ctrl-C in the model's feed after the search's k-th step; returns the list the model
    fed is appended to, once a feed."""
    from scratchgpt.generation import beam

    real, models = beam.prefill, []

    def prefill(model, *args):
        models.append(model)
        if len(models) > k:  # the prompt's feed, then one a step
            raise KeyboardInterrupt
        return real(model, *args)

    monkeypatch.setattr(beam, "prefill", prefill)
    return models


@pytest.mark.parametrize("m", [1, 3])
def test_ctrl_c_mid_search_prints_the_best_hypotheses_so_far(run_dir, capsys, monkeypatch, m):
    """Interrupted after k steps, ``--beam 3 --num-samples M`` prints the M hypotheses a search
    of exactly k steps has, ranked as its ended ones (cut before the --stop string) best first,
    then its live beams best first, each noted on stderr with its score, as the uninterrupted
    command prints them, and the live ones as cut off; then it says it was interrupted and
    exits 130, as sampling does (it printed nothing: the search was lost)."""
    from scratchgpt.checkpoints import checkpoint_tokenizer
    from scratchgpt.checkpoints.io import load_for_generation
    from scratchgpt.generation import beam
    from scratchgpt.generation.stopping import StopRule

    tok = checkpoint_tokenizer(load_for_generation(run_dir)[1])
    seen = {"ended": 0, "live": 0, "both": 0}
    for stop in "eoa t":
        for k in (1, 3, 5):
            with monkeypatch.context() as patch:
                models = _interrupted_after(patch, k)
                code = main(["sample", "--checkpoint", str(run_dir), "--prompt", "A",
                             "--beam", "3", "--num-samples", str(m), "--max-new-tokens",
                             "12", "--stop", stop])
            out, err = capsys.readouterr()
            if code == 0:
                continue  # three hypotheses ended before step k: the search was over
            rule = StopRule(k, tok.eot_id, (stop,), tok.decode)
            hyps = beam.beam_search(models[0], torch.tensor([tok.encode("A")]), 3, rule)
            ended = [h for h in hyps if rule.ends(h[0])]
            shown = (ended + [h for h in hyps if not rule.ends(h[0])])[:m]
            assert code == 130 and len(shown) == m, (stop, k)
            assert out == "\n\n---------------\n".join(
                "A" + rule.text(tokens) for tokens, _ in shown) + "\n", (stop, k)
            cut = f", cut off after {k} new token{'s' * (k > 1)}"
            assert err.splitlines() == [
                f"--- beam score {score:.4f}, the {'next ' * (i > 0)}best so far"
                f"{'' if rule.ends(tokens) else cut}"
                for i, (tokens, score) in enumerate(shown)] + \
                ["scratchgpt sample: interrupted"], (stop, k)
            seen["ended" if ended else "live"] += 1
            seen["both"] += 0 < len([h for h in shown if rule.ends(h[0])]) < len(shown)
    assert seen["ended"] and seen["live"] and (m == 1 or seen["both"]), seen  # (cases arose)


def test_ctrl_c_before_the_first_step_prints_nothing(run_dir, capsys, monkeypatch):
    """Stopped while the prompt is read, the search has no hypothesis yet: no text at all."""
    _interrupted_after(monkeypatch, 0)
    code = main(["sample", "--checkpoint", str(run_dir), "--prompt", "A", "--beam", "3"])
    out, err = capsys.readouterr()
    assert code == 130 and out == "" and err == "scratchgpt sample: interrupted\n"
