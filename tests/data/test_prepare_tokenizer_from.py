"""prepare --tokenizer-from takes another dataset's or model's tokenizer whole: a --tokenizer or
--vocab-size beside it is refused by naming the flag given, whatever kind that tokenizer is."""

from __future__ import annotations

import pytest

from scratchgpt.cli import main
from scratchgpt.data.prepare import prepare_text
from tests.cli_errors import error_of
from tests.corpus import play_text


@pytest.mark.parametrize(("flags", "dropped"), [
    (["--vocab-size", "300"], "drop --vocab-size"),
    (["--tokenizer", "bpe"], "drop --tokenizer"),
    (["--tokenizer", "bpe", "--vocab-size", "300"], "drop --tokenizer and --vocab-size"),
])
def test_tokenizer_from_a_bpe_dataset_refuses_its_own_settings(tmp_path, capsys, flags,
                                                                dropped):
    """A --vocab-size given with a BPE dataset's tokenizer was refused as applying 'to
    --tokenizer bpe only', though the tokenizer taken was BPE."""
    text = play_text(6_000)
    prepare_text(text, tmp_path / "bpe", "bpe", vocab_size=300, source="test")
    source = tmp_path / "more.txt"
    source.write_text(text[:2_000])
    line = error_of(capsys, ["prepare", "--data", str(source), "--tokenizer-from",
                             str(tmp_path / "bpe"), *flags, "--out", str(tmp_path / "out")])
    assert "--tokenizer-from takes" in line and line.endswith(dropped), line
    assert not (tmp_path / "out").exists()
    assert main(["prepare", "--data", str(source), "--tokenizer-from", str(tmp_path / "bpe"),
                 "--out", str(tmp_path / "out"), "--no-progress"]) == 0
