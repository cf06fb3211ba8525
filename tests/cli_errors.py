"""The one check of a CLI error: exit code 2 and one line on stderr, no traceback."""

from __future__ import annotations

from scratchgpt.cli import main


def error_of(capsys, argv: list[str]) -> str:
    """Run ``scratchgpt ARGV`` in-process; it must fail with exit code 2 and exactly one line
    on stderr (no traceback). Returns that line."""
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse's own refusals: a flag's type or choices
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]
