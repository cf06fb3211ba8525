"""The README's curl examples, run with curl against a server of the tiny chat model: each must
succeed, and the streamed one must end with ``data: [DONE]``."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def curl_commands() -> list[str]:
    """The ``curl`` commands of the README's serving section, continuation lines joined."""
    text = README.read_text()
    section = text.split("## Serving", 1)[1].split("\n## ", 1)[0]
    commands, current = [], ""
    for line in section.splitlines():
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
