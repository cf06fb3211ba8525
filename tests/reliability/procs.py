"""Processes for the reliability suite: real ``scratchgpt`` commands that can be killed.

Most are forked from a fork server (``multiprocessing``'s ``forkserver``) that has imported
torch and scratchgpt once, so each killed process costs a fraction of a second rather than
an interpreter start; each is still a process of its own, killed by ``kill -9`` like any
other. A few tests start ``python -m scratchgpt`` itself, where the start-up is the point.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

_CONTEXT: Any = None
# matplotlib.pyplot: the loss plot a finished run draws
PRELOAD = ["torch", "matplotlib.pyplot", "tqdm", "scratchgpt.cli",
           "scratchgpt.commands.train", "scratchgpt.training.job", "scratchgpt.training.trainer",
           "scratchgpt.memory", "tests.reliability.procs"]


def _context() -> Any:
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(PRELOAD)
    return _CONTEXT


def _end_with(test_process: int) -> None:
    """In the forked process: end it once the test process that started it is gone. The
    commands these tests kill run for a million steps; when pytest itself was stopped (Ctrl-C
    twice, a kill), the forkserver's children trained on, each holding a core for hours."""
    def watch() -> None:
        while True:
            time.sleep(1.0)
            try:
                os.kill(test_process, 0)
            except ProcessLookupError:
                os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _run_cli(argv: Sequence[str], log: str, test_process: int) -> None:
    """In the forked process: ``scratchgpt ARGV`` with stdout and stderr in ``log``; the exit
    code is the process's."""
    _end_with(test_process)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    import torch

    torch.set_num_threads(1)
    from scratchgpt.cli import main

    code = main(list(argv))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _call(fn: Callable[..., Any], args: tuple, log: str, test_process: int) -> None:
    _end_with(test_process)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    fn(*args)
    os._exit(0)


class Proc:
    """A forked ``scratchgpt`` command (or function) with its output in a log file."""

    def __init__(self, process: Any, log: Path):
        self.process, self.log = process, log

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.is_alive()

    def kill(self, signum: int = signal.SIGKILL) -> None:
        os.kill(self.pid, signum)

    def wait(self, timeout: float = 120) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            self.kill()
            self.process.join()
            raise TimeoutError(f"process did not end in {timeout}s:\n{self.output()}")
        return self.process.exitcode

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def start_cli(argv: Sequence[str], log: Path) -> Proc:
    p = _context().Process(target=_run_cli, args=(list(map(str, argv)), str(log), os.getpid()))
    p.start()
    return Proc(p, log)


def start_call(fn: Callable[..., Any], args: tuple, log: Path) -> Proc:
    """``fn(*args)`` in a forked process (``fn`` must be a module-level function)."""
    p = _context().Process(target=_call, args=(fn, args, str(log), os.getpid()))
    p.start()
    return Proc(p, log)


def scratchgpt_process(argv: Sequence[str], **kw: Any) -> subprocess.Popen:
    """``python -m scratchgpt ARGV`` in its own session (so signals reach it alone)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "scratchgpt", *map(str, argv)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=env, **kw)


def wait_until_torch_loads(proc: subprocess.Popen, timeout: float = 60) -> None:
    """Wait until ``proc`` has mapped torch's shared libraries: its interpreter has started
    and ``import torch`` is under way. Before that, Ctrl-C lands in Python's own start-up
    (loading ``runpy``), which no program's code can catch."""

    def torch_mapped() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"process ended with {proc.returncode} before importing torch")
        try:
            return "libtorch" in Path(f"/proc/{proc.pid}/maps").read_text()
        except OSError:
            return False

    wait_for(torch_mapped, timeout, "torch's libraries in the process")


def wait_for(condition: Callable[[], bool], timeout: float = 60, what: str = "",
             proc: Proc | None = None) -> None:
    """Poll ``condition`` every 5 ms until it holds; fail after ``timeout`` seconds or when
    ``proc`` ends first."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc is not None and not proc.alive():
            raise AssertionError(f"process ended before {what}:\n{proc.output()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def file_version(path: Path) -> tuple[int, int] | None:
    """(inode, mtime) of ``path``: atomic writes replace the file, so a new version is a new
    inode."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns
