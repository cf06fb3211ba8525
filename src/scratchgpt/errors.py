"""The errors scratchgpt raises for bad input, one type per layer.

Every one of them means "the input is wrong, and the message says what to change": the
command line prints such an error as one line and exits with code 2, without a traceback.
Anything else that escapes is a bug in scratchgpt.

    ScratchGPTError
    ├── ConfigError      a setting or hyperparameter out of range, or settings that conflict
    ├── DataError        text, a prepared dataset or a data file that cannot be used
    ├── TokenizerError   text a tokenizer cannot encode, or a damaged tokenizer file
    ├── CheckpointError  a missing, damaged, foreign or incompatible checkpoint or run
    │   └── RunInUseError  another process is writing the run directory
    ├── GenerationError  a prompt or generation request that cannot be served
    └── StorageError     a file that cannot be written or read: a full disk, a read-only or
                         missing directory, no permission (what was written before is intact)

Library code raises these; only ``scratchgpt.cli`` turns them into exit codes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class ScratchGPTError(Exception):
    """Bad input detected by scratchgpt; the message is one line saying what to change."""


class ConfigError(ScratchGPTError):
    """A setting or hyperparameter is out of range, or two settings conflict."""


class DataError(ScratchGPTError):
    """Text, a prepared dataset or a data file cannot be used."""


class TokenizerError(ScratchGPTError):
    """Text a tokenizer cannot encode, or a tokenizer file that is damaged."""


class CheckpointError(ScratchGPTError):
    """A checkpoint or run directory is missing, damaged, foreign or incompatible."""


class RunInUseError(CheckpointError):
    """Another process holds the run directory's lock."""


class GenerationError(ScratchGPTError):
    """A prompt or generation request that cannot be served (empty, too long, ...)."""


class StorageError(ScratchGPTError):
    """A file cannot be written or read: a full disk, a read-only directory, no permission.
    Writes are atomic, so what was there before is intact."""


class Terminated(KeyboardInterrupt):
    """Not an input error: SIGTERM (``kill``, a scheduler) arriving where no training loop can
    stop cleanly, raised like Ctrl-C's KeyboardInterrupt so that the same clean-up runs. The
    command line exits with code 143 (training loops stop after the step and save instead:
    training/stopping.py)."""


@contextlib.contextmanager
def naming(flag: str | None) -> Iterator[None]:
    """A refusal raised in the block, said of ``flag``, the flag (or keyword) that gave what
    it refuses: where two checkpoints are on one command line, "checkpoint X does not exist"
    leaves the user to guess which. None: raised as it is.

    >>> try:
    ...     with naming("--draft"):
    ...         raise CheckpointError("checkpoint runs/x does not exist")
    ... except CheckpointError as e:
    ...     print(e)
    --draft: checkpoint runs/x does not exist
    """
    try:
        yield
    except ScratchGPTError as e:
        if flag is None:
            raise
        raise type(e)(f"{flag}: {e}") from None
