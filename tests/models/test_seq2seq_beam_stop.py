"""When beam search stops: not as soon as ``beam`` unlikely endings have closed, while the
likely hypothesis is still being written."""

from types import SimpleNamespace

import pytest
import torch

from scratchgpt.models.seq2seq import Seq2Seq

PAD, BOS, EOS, UNK, A, B = range(6)
LENGTH = 5  # the likely output: A written LENGTH times, then <eos>


class Scripted(Seq2Seq):
    """A decoder whose next-token distribution depends on the step alone: A is likely for
    LENGTH steps with <eos> the runner-up at every one of them, then <eos> is all but sure."""

    def __init__(self):
        super().__init__()
        self.config = SimpleNamespace(pad_id=PAD, bos_id=BOS, eos_id=EOS, unk_id=UNK)

    def start(self, src, src_lengths):
        return {"t": torch.zeros(src.size(0), dtype=torch.long)}

    def step(self, state, prev):
        t = state["t"]
        early = torch.tensor([1e-9, 1e-9, 0.06, 1e-9, 0.9, 0.04])
        late = torch.tensor([1e-9, 1e-9, 0.99, 1e-9, 0.005, 0.005])
        probs = torch.where((t < LENGTH)[:, None], early, late)
        state["t"] = t + 1
        return probs.log(), torch.zeros(t.size(0), 1)


@pytest.mark.parametrize("beam", [2, 3, 4])
@pytest.mark.parametrize("penalty", [0.0, 1.0])
def test_beam_search_keeps_writing_the_likely_output_after_unlikely_endings_close(beam,
                                                                                    penalty):
    """Each step's runner-up <eos> closes a hypothesis; once ``beam`` of them had, the search
    stopped and returned one of them ([A, <eos>], probability 0.05) over the greedy output
    (A x 5, <eos>: probability 0.58), which the beam was still writing. A trained dates model
    answered '2041-03-' for '2041-03-24' so, at --beam 3, where greedy was right."""
    m = Scripted()
    src, lengths = torch.zeros(1, 1, dtype=torch.long), torch.tensor([1])
    greedy, _ = m.greedy_decode(src, lengths, max_len=10)
    assert greedy == [[A] * LENGTH + [EOS]]
    found, attn = m.beam_decode(src, lengths, beam=beam, max_len=10, length_penalty=penalty)
    assert found == greedy
    assert attn[0].shape == (LENGTH + 1, 1)


def test_the_search_still_ends_once_no_live_beam_beats_what_closed():
    """Beam search does not run on to --max-len: with the likely output closed (at step
    LENGTH + 1), it ends on the step after, when no live beam scores as well."""
    m = Scripted()
    steps = []
    step = m.step
    m.step = lambda state, prev: (steps.append(1), step(state, prev))[1]
    src, lengths = torch.zeros(1, 1, dtype=torch.long), torch.tensor([1])
    so_far = []
    found, _ = m.beam_decode(src, lengths, beam=2, max_len=50, out=so_far)
    assert found == [[A] * LENGTH + [EOS]] and so_far[0][1]  # (settled: the search is over)
    assert len(steps) <= LENGTH + 2


C, D = 6, 7


class Climbing(Seq2Seq):
    """A decoder whose next token depends on the previous one: <eos> is likeliest first
    ([<eos>]: mean log-probability -0.69), while A, C, <eos> starts less likely and gets all
    but sure (mean -0.58), and B, <eos> closes in between (-0.98)."""

    NEXT = {BOS: {EOS: 0.5, A: 0.3, B: 0.2}, A: {C: 0.6, D: 0.39, EOS: 0.01},
            B: {EOS: 0.7, A: 0.3}, C: {EOS: 0.99, A: 0.01}, D: {EOS: 0.5, A: 0.5},
            EOS: {EOS: 1.0}}

    def __init__(self):
        super().__init__()
        self.config = SimpleNamespace(pad_id=PAD, bos_id=BOS, eos_id=EOS, unk_id=UNK)
        self.table = torch.full((8, 8), 1e-9)
        for prev, nxt in self.NEXT.items():
            for tok, p in nxt.items():
                self.table[prev, tok] = p

    def start(self, src, src_lengths):
        return {}

    def step(self, state, prev):
        return self.table[prev].log(), torch.zeros(prev.size(0), 1)


def test_the_search_goes_on_while_a_live_beam_beats_the_worst_kept_ending():
    """Hugging Face's rule compares the best live beam with the worst of the ``beam`` best
    endings, not the best: after step 2, [<eos>] (-0.69) and [B, <eos>] (-0.98) have closed
    and the live A, C stands at -0.86. Stopped there (it does not beat the best ending), the
    search returned [<eos>]; going on, A, C, <eos> closes at -0.58 and wins."""
    m = Climbing()
    src, lengths = torch.zeros(1, 1, dtype=torch.long), torch.tensor([1])
    found, _ = m.beam_decode(src, lengths, beam=2, max_len=6, length_penalty=1.0)
    assert found == [[A, C, EOS]]
