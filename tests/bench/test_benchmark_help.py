"""The Python benchmarks' --help says what every flag does: --rounds, --batch, --threads and
the like were listed bare, their meaning and default left to the source."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py"))


def bare_options(help_text: str) -> list[str]:
    """The options that argparse's --help lists with no help text after them."""
    lines = help_text.split("options:", 1)[1].splitlines()
    bare = []
    for i, line in enumerate(lines):
        m = re.match(r"  (-\S+(?: [A-Z_]+)?(?:, -\S+(?: [A-Z_]+)?)*)( {2,}\S.*)?$", line)
        if not m or m.group(2):
            continue
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if not nxt.startswith("   ") or nxt.lstrip().startswith("-"):
            bare.append(m.group(1))
    return bare


def test_bare_options_finds_an_option_without_help():
    text = "options:\n  -h, --help     show this\n  --rounds ROUNDS\n  --p P          mass\n"
    assert bare_options(text) == ["--rounds ROUNDS"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_flag_of_a_python_benchmark_has_help(script):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert bare_options(done.stdout) == []
