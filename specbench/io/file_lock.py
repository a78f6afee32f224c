"""One portable exclusive lock for the stores' writers (results files, history files, baseline directories), and
holding Ctrl-C off an append so that it is whole or absent."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

__all__ = ["LockTimeout", "lock_path", "locked", "signals_held"]

LockTimeout = Timeout  # raised by locked(..., timeout=N) when another holder keeps the lock N seconds
LOCK_SUFFIX = ".lock"
# filelock waits by retrying a non-blocking lock: its default 50 ms between attempts would add up to that to
# every contended append of one short line; a retry is a few system calls, so 200 a second cost little
POLL_INTERVAL_S = 0.005


def lock_path(path: str | os.PathLike) -> Path:
    """The lock file guarding ``path``: ``<path>.lock`` beside it (for a directory, beside the directory, so
    the directory itself holds only its data)."""
    return Path(os.path.abspath(path) + LOCK_SUFFIX)  # abspath: "." or "dir/" name their directory


@contextmanager
def locked(path: str | os.PathLike, *, timeout: float = -1) -> Iterator[Path]:
    """Hold an exclusive lock on ``<path>.lock`` for the block; yields the lock file's path.

    Excludes other processes and other threads of this one (each call opens its own descriptor), so a
    read-modify-write or an append under it never interleaves with another's. On POSIX it is ``flock`` and
    on Windows ``msvcrt.locking`` (filelock), both released by the OS if the holder dies, so a killed writer
    never leaves the lock taken (on a filesystem without ``flock`` filelock falls back, with a warning, to a
    marker file that names its holder and is taken over once that process is gone). On POSIX the empty lock
    file stays after release: deleting it would let a waiter holding the old inode and a newcomer creating a
    new one both hold the lock. ``timeout``: seconds to wait (negative: forever; 0: one attempt) before raising
    :data:`LockTimeout`.
    """
    target = lock_path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    # a fresh, non-singleton FileLock per call: filelock counts re-entry per instance, so a shared instance
    # would let a second caller in this process through instead of making it wait
    with FileLock(target, timeout=timeout, poll_interval=POLL_INTERVAL_S):
        yield target


@contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM off the block (Python runs signal handlers in the main thread, so from there), so
    that Ctrl-C arrives after an append, not between its writes: a signal that comes meanwhile is noted, and
    handed to the handler it was meant for on leaving. (Masking the signal would not do: the OS delivers a
    process's signal to any thread that does not mask it, torch's worker threads included.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[tuple[int, object]] = []
    previous = {number: signal.signal(number, lambda *received: arrived.append(received))
                for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for number, frame in arrived[:1]:
            handler = previous[number]
            if callable(handler):
                handler(number, frame)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(number)
