"""Building a C kernel: a line at a terminal before the one-off build, silence elsewhere."""

import io
import stat

import pytest

from scratchgpt.models import c_kernels

# a stand-in compiler: answers --version, and "compiles" by writing an empty file at -o
FAKE_CC = """#!/bin/sh
if [ "$1" = --version ]; then echo fake-cc 1.0; exit 0; fi
while [ "$#" -gt 0 ]; do
  if [ "$1" = -o ]; then : > "$2"; fi
  shift
done
"""


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def build(tmp_path, monkeypatch):
    """Builds one-line sources with the stand-in compiler into a fresh cache, in a process
    that has said nothing yet; returns what each build of source ``name`` wrote on stderr."""
    cc = tmp_path / "cc"
    cc.write_text(FAKE_CC)
    cc.chmod(cc.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("SCRATCHGPT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(c_kernels, "_said_building", False)

    def run(name: str, stderr: io.StringIO) -> str:
        source = tmp_path / name
        source.write_text(f"int {source.stem}(void) {{ return 1; }}\n")
        monkeypatch.setattr("sys.stderr", stderr)
        c_kernels._build(source, str(cc))
        return stderr.getvalue()

    return run


def test_a_build_at_a_terminal_says_so_once_a_process(build):
    said = build("one.c", Terminal())
    assert said.count("\n") == 1 and "compiling its C kernels for this CPU" in said
    assert build("one.c", Terminal()) == ""  # built: the cached library is used
    assert build("two.c", Terminal()) == ""  # another kernel built: said already


def test_a_build_into_a_file_or_pipe_says_nothing(build):
    assert build("one.c", io.StringIO()) == ""
    assert "compiling" in build("two.c", Terminal())  # (nothing said so far)
