"""Ctrl-C during `specbench run`: one line and exit status 130 (not a 95-line KeyboardInterrupt traceback), and
nothing half-written: no --output file and no results-history record of the interrupted run."""

from __future__ import annotations

import os
import signal
import threading
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STARTUP_LIMIT_S = 600  # a cold torch import and the model load on a busy 2-core machine; the run itself is longer


def test_ctrl_c_mid_run_is_one_line_exit_130_and_writes_nothing(tmp_path):
    output, history = tmp_path / "result.json", tmp_path / "history"
    stderr_path = tmp_path / "stderr.txt"
    command = [sys.executable, "-m", "specbench.cli", "run", "medusa/chain-k3", "--num-prompts", "20",
               "--max-new-tokens", "128", "--threads", "1", "--output", str(output), "--history", str(history)]
    with open(stderr_path, "w") as stderr:
        process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True)
        deadline = time.monotonic() + STARTUP_LIMIT_S
        # the case's progress bar has started: the run is under way, past the imports and the model load
        while "prompt/s" not in stderr_path.read_text() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert process.poll() is None, f"the run ended before it could be interrupted: {stderr_path.read_text()}"
        process.send_signal(signal.SIGINT)
        out, _ = process.communicate(timeout=120)
    errors = stderr_path.read_text()
    assert process.returncode == 130
    assert "Traceback" not in errors and "KeyboardInterrupt" not in errors
    # the progress bar's carriage-return updates share a line; what specbench says is one line of its own
    said = [line for line in errors.replace("\r", "\n").splitlines() if line.startswith("specbench:")]
    assert said == ["specbench: interrupted; what the run had not yet written was not written"], errors
    assert not output.exists()
    assert not history.exists() or not any(history.iterdir())
    # no temporary file of an atomic write left behind either
    assert sorted(os.listdir(tmp_path)) in (["stderr.txt"], ["history", "stderr.txt"])


def test_ctrl_c_during_a_held_write_arrives_after_it():
    """The history's append holds SIGINT off (signals_held): the write finishes, then KeyboardInterrupt comes."""
    import pytest

    from specbench.io.file_lock import signals_held

    done = []
    with pytest.raises(KeyboardInterrupt):
        with signals_held():
            # to this (the main) thread: os.kill may hand it to any thread, torch's included, and under load the main
            # thread would see it only after the block, which is not what this test is about
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)
            time.sleep(0.05)  # time for the signal to arrive, had it not been held
            done.append("the write")
    assert done == ["the write"]
