"""Atomic file replacement: a crash or SIGKILL at any point leaves the old or the new file whole."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Replace ``path`` with ``text`` so that a crash at any point leaves the old or the new file whole."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            # keep the file's mode; mkstemp's 0600 would make a new reviewed file unreadable to others
            os.fchmod(f.fileno(), path.stat().st_mode & 0o777 if path.exists() else 0o644)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())  # data on disk before the rename makes it visible
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    directory_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory_fd)  # the rename itself survives a power loss
    finally:
        os.close(directory_fd)
