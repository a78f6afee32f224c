"""Reading what a `specbench` command printed, for the CLI tests."""

from __future__ import annotations


def error_line(capsys) -> str:
    """stderr, which must be exactly one line and no traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]
