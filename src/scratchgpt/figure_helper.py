"""Figures drawn by a helper process that imports matplotlib while the command starts.

Why: importing matplotlib (``pyplot`` and what it pulls in) takes ~0.4 s of one core, and a
training run draws its loss curve only when it ends. Meanwhile the command's own start-up,
importing torch, keeps one core busy for about a second while the others idle. Started before
that, :func:`start` runs this module as a helper process that imports matplotlib on an idle
core and then waits; at the end, :func:`draw` hands it the figure (~0.15 s of drawing) instead
of importing matplotlib then. Where there is no helper (a program calling the library, a
process of a data-parallel group) or it cannot draw (it died, or the drawing failed),
:func:`draw` draws in this process, so an error surfaces exactly as it would without one.

The helper reads one JSON line per figure on its stdin, ``{"figure": NAME, "args": [...]}``
(NAME one of :data:`FIGURES`), and answers each with one JSON line on its stdout:
``{"ok": true, "stdout": TEXT, "stderr": TEXT}``, what the drawing printed (such as a note
that the font lacks some characters), which the command prints as the drawing would have
in-process; or ``{"ok": false}``, and the command draws the figure again itself, saying what
went wrong (and any note) once, as it would without a helper. The helper's own stderr goes
nowhere: if it cannot start (matplotlib fails to import) or dies, the command draws its figures
in-process, so the user sees a working figure, or the error of drawing it, never the helper's
traceback. It ignores Ctrl-C (the command handles it) and ends when its stdin does, so it
never outlives the command. ``SCRATCHGPT_FIGURE_HELPER=0`` draws every figure in-process.

>>> start()                                                           # doctest: +SKIP
>>> draw("losses", Path("runs/x/metrics.csv"), Path("runs/x/loss.png"))  # doctest: +SKIP
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

SWITCH = "SCRATCHGPT_FIGURE_HELPER"
# The figures a helper draws: name -> (module, function), each function taking the paths it
# reads and writes, and importing nothing heavier than matplotlib.
FIGURES = {"losses": ("scratchgpt.training.metrics", "plot_losses")}

_helper: subprocess.Popen[str] | None = None


def start() -> None:
    """Start this process's helper (once), unless ``SCRATCHGPT_FIGURE_HELPER=0``."""
    global _helper
    if _helper is not None or os.environ.get(SWITCH, "") == "0":
        return
    try:
        _helper = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    except OSError:
        return  # (no process to spare: figures are drawn here)
    atexit.register(stop)


def stop() -> None:
    """End the helper. Nothing of it is pending once :func:`draw` has returned, so it is ended
    at once, even in the middle of its import (a command interrupted early does not wait)."""
    global _helper
    helper, _helper = _helper, None
    if helper is None:
        return
    helper.kill()
    helper.wait()
    for pipe in (helper.stdin, helper.stdout):
        with contextlib.suppress(OSError):  # (what a dead helper's pipe left unwritten)
            pipe.close()  # type: ignore[union-attr]


def draw(figure: str, *paths: Path) -> None:
    """Draw ``figure`` (a name in :data:`FIGURES`) from and to ``paths``: by the helper when
    there is one that can, else here."""
    if not _drawn_by_helper(figure, paths):
        _function(figure)(*paths)


def _drawn_by_helper(figure: str, paths: tuple[Path, ...]) -> bool:
    if _helper is None:
        return False
    request = json.dumps({"figure": figure, "args": [str(p) for p in paths]})
    try:
        _helper.stdin.write(request + "\n")  # type: ignore[union-attr]
        _helper.stdin.flush()  # type: ignore[union-attr]
        line = _helper.stdout.readline()  # type: ignore[union-attr]
    except OSError:  # it died (a closed pipe): not asked again
        line = ""
    if not line:
        stop()
    answer = _answer(line)
    if answer.get("ok") is not True:
        return False
    for name in ("stdout", "stderr"):  # what drawing it here would have said
        stream = getattr(sys, name)
        stream.write(str(answer.get(name, "")))
        stream.flush()
    return True


def _answer(line: str) -> dict[str, Any]:
    """The helper's answer on ``line``; {} for none (it died) or one it did not write."""
    try:
        answer = json.loads(line)
    except ValueError:
        return {}
    return answer if isinstance(answer, dict) else {}


def _function(figure: str) -> Any:
    module, name = FIGURES[figure]
    return getattr(importlib.import_module(module), name)


def _serve() -> None:
    """The helper's life: matplotlib imported first, then one figure per line of stdin."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the command's to handle
    from scratchgpt.viz import pyplot

    pyplot()
    for line in sys.stdin:
        print(json.dumps(_drawn(line)), flush=True)


def _drawn(line: str) -> dict[str, Any]:
    """Draw the figure ``line`` asks for; the answer to it (see the module's doc)."""
    said = {"stdout": io.StringIO(), "stderr": io.StringIO()}  # (stdout carries the answers)
    try:
        with contextlib.redirect_stdout(said["stdout"]), \
                contextlib.redirect_stderr(said["stderr"]):
            request = json.loads(line)
            _function(request["figure"])(*(Path(p) for p in request["args"]))
    except Exception:  # the command draws it again, and says what went wrong (and the notes)
        return {"ok": False}
    return {"ok": True, **{name: text.getvalue() for name, text in said.items()}}


if __name__ == "__main__":
    _serve()
