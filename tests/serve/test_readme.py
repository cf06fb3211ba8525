"""The README's curl examples, run with curl against a server of the tiny chat model: each must
succeed, and the streamed one must end with ``data: [DONE]``; and its Python example, run as
it is written against the servers it names."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.requires import optional

README = Path(__file__).resolve().parents[2] / "README.md"


def serving_section() -> str:
    return README.read_text().split("## Serving", 1)[1].split("\n## ", 1)[0]


def curl_commands() -> list[str]:
    """The ``curl`` commands of the README's serving section, continuation lines joined."""
    commands, current = [], ""
    for line in serving_section().splitlines():
        if current or line.startswith("curl "):
            current += line.rstrip("\\").strip() + " "
            if not line.endswith("\\"):
                commands.append(current.strip())
                current = ""
    return commands


def test_the_readme_has_curl_examples_of_every_api_route():
    routes = {re.search(r"127\.0\.0\.1:8000(/\S*)", c).group(1) for c in curl_commands()}
    assert {"/v1/models", "/v1/completions", "/v1/chat/completions", "/metrics"} <= routes


@pytest.mark.parametrize("command", curl_commands())
def test_the_readme_curl_example_works(server, command):
    if not shutil.which("curl"):
        pytest.skip("no curl on this machine")
    command = command.replace("http://127.0.0.1:8000", server.url, 1)
    command = command.replace("curl ", "curl -sSf --max-time 120 ", 1)
    out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=150)
    assert out.returncode == 0, out.stderr
    if '"stream": true' in command:
        assert out.stdout.strip().endswith("data: [DONE]")
    elif "/metrics" not in command:
        json.loads(out.stdout)  # a whole JSON answer


def test_the_readme_python_example_runs_against_the_servers_it_names(plain_run, chat_run):
    """Its chat call named the plain model ('mytext'), whose server answers chat with 400
    no_chat_template (as the README says beside it): the example raised BadRequestError."""
    optional("openai")
    from tests.serve.conftest import start_server

    code = re.search(r"```python\n(.*?)```", serving_section(), re.S).group(1)
    with start_server(plain_run, model_name="mytext") as text, \
            start_server(chat_run, model_name="chat") as chat:
        code = code.replace("http://127.0.0.1:8000", text.url).replace(
            "http://127.0.0.1:8001", chat.url)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=150)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip(), "the example printed nothing"
