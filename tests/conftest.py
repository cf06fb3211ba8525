"""Shared fixtures: text built here (no file outside the repository, no network) and a small
prepared dataset built from it.

Every test runs offline: a connection to anything but this machine's loopback fails as it
would without a network, and ``$SCRATCHGPT_DATA_DIR`` and the user's cache are never read.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from pathlib import Path

import pytest
import torch

from tests.corpus import play_text

# Test tensors are small: one thread is faster than two, and far faster on a shared CPU.
torch.set_num_threads(1)


def _is_loopback(sock: socket.socket, address) -> bool:
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return True  # Unix sockets and the like never leave the machine
    host = address[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it would be resolved and reached over the network


@pytest.fixture(scope="session", autouse=True)
def _no_network():
    """Connections leave the machine only over loopback: a test that needs the network fails
    here as it would on a machine without one."""
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def refuse(sock, address):
        if not _is_loopback(sock, address):
            raise OSError(errno.ENETUNREACH, f"tests run offline: no connection to {address}")

    def connect(sock, address):
        refuse(sock, address)
        return real_connect(sock, address)

    def connect_ex(sock, address):
        refuse(sock, address)
        return real_connect_ex(sock, address)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", connect)
        mp.setattr(socket.socket, "connect_ex", connect_ex)
        yield


@pytest.fixture(scope="session")
def english_text() -> str:
    """300,000 characters of a generated English-like play (``tests/corpus.py``): speaker
    names, punctuation, newlines; ASCII letters only."""
    return play_text(300_000)


@pytest.fixture(scope="session")
def stdlib_text() -> str:
    """The offline default corpus (this Python's standard library sources): diverse text with
    code, long whitespace runs and some non-ASCII characters. Its bytes depend on the Python
    version, so tests compare implementations on it, never against recorded numbers."""
    from scratchgpt.data import sources

    return sources.read_files(sources.default_corpus_files())


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory, english_text: str) -> Path:
    """The first 200k characters of the generated play, char-tokenized."""
    from scratchgpt.data.prepare import prepare_text

    out = tmp_path_factory.mktemp("data") / "play-small"
    prepare_text(english_text[:200_000], out, "char", source="test")
    return out


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch, tmp_path_factory):
    """Never touch the user's cache or data folder; seed torch."""
    monkeypatch.setenv("SCRATCHGPT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    monkeypatch.delenv("SCRATCHGPT_DATA_DIR", raising=False)
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _figures_closed():
    """Close the figures a test leaves open (a test of a function that returns its figure):
    from the 21st open figure on, matplotlib warns on stderr, in a later test whose stderr is
    asserted, so that test passed alone and failed in the suite."""
    yield
    import sys

    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")


@pytest.fixture
def cli_main():
    """The CLI entry point, ``scratchgpt.cli.main``."""
    from scratchgpt.cli import main

    return main
