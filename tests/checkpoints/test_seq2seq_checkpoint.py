"""Seq2seq checkpoints round-trip weights, config and tokenizers."""

import pytest
import torch

from scratchgpt.checkpoints.seq2seq import load_seq2seq, save_seq2seq
from scratchgpt.data.translation import Seq2SeqTokenizer
from scratchgpt.errors import ScratchGPTError
from scratchgpt.models.seq2seq import build_seq2seq, default_config


@pytest.mark.parametrize("arch", ["transformer", "lstm-attention"])
def test_roundtrip(tmp_path, arch):
    src_tok, tgt_tok = Seq2SeqTokenizer.train(["abc"]), Seq2SeqTokenizer.train(["xy"])
    torch.manual_seed(0)
    m = build_seq2seq(default_config(arch, src_tok.vocab_size, tgt_tok.vocab_size,
                                     d_model=16)).eval()
    save_seq2seq(tmp_path, m, src_tok, tgt_tok, {"note": 1})
    m2, s2, t2, meta = load_seq2seq(tmp_path)
    src, lengths, tgt = torch.tensor([[4, 5, 6, 2]]), torch.tensor([4]), torch.tensor([[1, 4]])
    torch.testing.assert_close(m2(src, lengths, tgt), m(src, lengths, tgt))
    assert s2.chars == src_tok.chars and t2.chars == tgt_tok.chars and meta == {"note": 1}


def test_corrupt_checkpoint_is_a_user_error(tmp_path):
    (tmp_path / "seq2seq.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ScratchGPTError, match="not a valid seq2seq checkpoint"):
        load_seq2seq(tmp_path)
