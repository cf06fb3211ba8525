"""Fixtures of the server's tests: a tiny chat-tuned GPT (trained once per session) and a
server on 127.0.0.1 running it in a background thread."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.requires import optional
from tests.serve.models import save_run, train_chat_gpt


@pytest.fixture(scope="session")
def chat_model():
    """(model, tokenizer) of the tiny chat GPT."""
    return train_chat_gpt()


@pytest.fixture(scope="session")
def chat_run(tmp_path_factory, chat_model) -> Path:
    """A run directory whose checkpoint names the chat template."""
    return save_run(*chat_model, tmp_path_factory.mktemp("runs") / "chatty")


@pytest.fixture(scope="session")
def plain_run(tmp_path_factory, chat_model) -> Path:
    """The same weights without a chat template."""
    return save_run(*chat_model, tmp_path_factory.mktemp("runs") / "plain", chat=False)


def start_server(run: Path, api_key: str | None = None, grace_s: float = 5.0, **config):
    """A BackgroundServer (a context manager) for ``run``; stopping, it lets running requests
    finish for ``grace_s`` seconds."""
    for name in ("starlette", "uvicorn", "httpx"):
        optional(name)
    from scratchgpt.serve.server import BackgroundServer, ServeConfig, load_service

    return BackgroundServer(load_service(ServeConfig(str(run), api_key=api_key, **config)),
                            api_key=api_key, grace_s=grace_s)


@pytest.fixture(scope="module")
def server(chat_run):
    with start_server(chat_run, max_batch=16, timeout_s=120) as s:
        yield s


@pytest.fixture
def client(server):
    import httpx

    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c
