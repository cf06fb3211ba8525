"""What every seeded ``scratchgpt sample`` command must do, whatever generates the tokens."""

from __future__ import annotations

from collections.abc import Sequence

from scratchgpt.cli import main


def assert_seeded_and_stops(args: Sequence[str], capsys) -> None:
    """``args`` (a seeded ``sample`` command) prints the same text twice, and with ``--stop``
    on a letter from the second half of that text prints the same sample, cut before it."""
    assert main(list(args)) == 0
    a = capsys.readouterr().out
    main(list(args))
    assert capsys.readouterr().out == a
    stop = next(c for c in a[len(a) // 2:] if c.isalpha())  # a letter this sample generates
    main([*args, "--stop", stop])
    out = capsys.readouterr().out
    assert stop not in out[1:] and len(out) < len(a)
    assert a.startswith(out.rstrip("\n"))  # the same sample, cut before the stop string
