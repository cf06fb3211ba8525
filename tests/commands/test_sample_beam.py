"""``scratchgpt sample --beam`` stopped by Ctrl-C part-way through its search."""

from __future__ import annotations

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


def test_ctrl_c_mid_search_prints_the_best_hypothesis_so_far(run_dir, capsys, monkeypatch):
    """Interrupted after k steps, the command prints what a search of exactly k steps ranks
    best: its best ended hypothesis (cut before the --stop string), or, when none has ended,
    its best live beam, with a note on stderr that it was cut off; then it says it was
    interrupted and exits 130, as sampling does (it printed nothing: the search was lost)."""
    from scratchgpt.checkpoints import checkpoint_tokenizer
    from scratchgpt.checkpoints.io import load_for_generation
    from scratchgpt.generation import beam
    from scratchgpt.generation.stopping import StopRule

    tok = checkpoint_tokenizer(load_for_generation(run_dir)[1])
    seen = {"ended": 0, "live": 0}
    for stop in "eoa t":
        for k in (1, 3, 5):
            with monkeypatch.context() as patch:
                models = _interrupted_after(patch, k)
                code = main(["sample", "--checkpoint", str(run_dir), "--prompt", "A",
                             "--beam", "3", "--max-new-tokens", "12", "--stop", stop])
            out, err = capsys.readouterr()
            if code == 0:
                continue  # three hypotheses ended before step k: the search was over
            rule = StopRule(k, tok.eot_id, (stop,), tok.decode)
            hyps = beam.beam_search(models[0], torch.tensor([tok.encode("A")]), 3, rule)
            ended = [h for h in hyps if rule.ends(h[0])]
            tokens, score = (ended or hyps)[0]
            cut = "" if ended else f", cut off after {k} new token{'s' * (k > 1)}"
            assert code == 130 and out == "A" + rule.text(tokens) + "\n", (stop, k)
            assert err == f"--- beam score {score:.4f}, the best so far{cut}\n" \
                "scratchgpt sample: interrupted\n"
            seen["ended" if ended else "live"] += 1
    assert all(seen.values()), seen  # (both cases arose)


def test_ctrl_c_before_the_first_step_prints_nothing(run_dir, capsys, monkeypatch):
    """Stopped while the prompt is read, the search has no hypothesis yet: no text at all."""
    _interrupted_after(monkeypatch, 0)
    code = main(["sample", "--checkpoint", str(run_dir), "--prompt", "A", "--beam", "3"])
    out, err = capsys.readouterr()
    assert code == 130 and out == "" and err == "scratchgpt sample: interrupted\n"
