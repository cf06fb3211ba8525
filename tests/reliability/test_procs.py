"""The reliability suite's own process helpers (tests/reliability/procs.py)."""

from __future__ import annotations

import subprocess
import time

from tests.reliability import procs


def test_a_forked_command_ends_once_the_test_process_is_gone(tmp_path):
    """The commands these tests kill run for a million steps; with pytest itself stopped, they
    trained on, a core each, for hours. A stand-in for the test process is started, then
    ended: the forked process ends within seconds (it would sleep a minute)."""
    stand_in = subprocess.Popen(["sleep", "60"])
    p = procs._context().Process(target=procs._call,
                                 args=(time.sleep, (60,), str(tmp_path / "log"), stand_in.pid))
    p.start()
    try:
        time.sleep(1.5)
        assert p.is_alive()  # (it waits while the test process lives)
        stand_in.kill()
        stand_in.wait()
        p.join(10)
        assert p.exitcode == 1
    finally:
        if p.is_alive():
            p.kill()
        stand_in.kill()
