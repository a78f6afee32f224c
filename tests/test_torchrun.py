"""`specbench run --tensor-parallel 2` with the ranks started by torchrun, not by the harness (CPU, gloo):
rank 0 alone prints the table and writes --output and the history, the result equals the single-process run
token for token with world size 2 in its env; a rank that fails ends torchrun non-zero with that rank's error
and leaves no process behind (docs/tensor_parallel.md, "Under torchrun").

Run as a script (``python -m torch.distributed.run ... tests/test_torchrun.py run ...``), this file is the
CLI with rank 1's proposer broken, the failing rank of the failure test."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARKER = "SPECBENCH_TORCHRUN_TEST"  # set in torchrun's environment, inherited by its ranks: found in /proc
TIMEOUT_S = 150
CASE_ARGS = ["run", "medusa/chain-k3", "--engine", "static", "--num-prompts", "3", "--max-new-tokens", "24", "-q",
             "--tensor-parallel", "2"]
BROKEN = "rank 1 cannot build its proposer: deliberately broken"


def _marked(marker: str) -> list[tuple[int, str]]:
    """(pid, command line) of every living process whose environment carries ``marker``: torchrun and its
    ranks, wherever they were re-parented (torchrun starts each rank in a session of its own)."""
    found = []
    needle = f"{MARKER}={marker}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if state != "Z":
            found.append((int(entry.name), command))
    return found


def torchrun(argv: list[str], tmp_path: Path, *, script: str | None = None) -> tuple[subprocess.CompletedProcess, list]:
    """``python -m torch.distributed.run --standalone --nproc_per_node 2 -m specbench.cli ARGV`` (or SCRIPT
    ARGV), its history in tmp_path/history; (the finished process, the marked processes still alive after)."""
    marker = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update({MARKER: marker, "HF_HUB_OFFLINE": "1", "SPECBENCH_HISTORY_DIR": str(tmp_path / "history"),
                "OMP_NUM_THREADS": "1"})
    entry = [script] if script else ["-m", "specbench.cli"]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *entry, *argv]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        err += f"\n(torchrun killed after {TIMEOUT_S} s)"
    time.sleep(0.5)  # a rank torchrun has just signalled gets a moment to go
    left = _marked(marker)
    for pid, _ in left:  # ours: end them so that a failure leaves nothing behind either
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(command, process.returncode, out, err), left


@pytest.fixture(scope="module")
def tp1() -> dict:
    """The same case at tensor_parallel = 1, in this process, on one core (as each rank gets)."""
    from specbench.run.harness import run_case
    from test_tp_cases import chain_case, one_thread

    with one_thread():
        return run_case(chain_case(tensor_parallel=1), progress=False).to_dict()


@pytest.fixture(scope="module")
def under_torchrun(tmp_path_factory) -> tuple[subprocess.CompletedProcess, list, Path]:
    tmp_path = tmp_path_factory.mktemp("torchrun")
    (tmp_path / "out").mkdir()
    done, left = torchrun([*CASE_ARGS, "--output", str(tmp_path / "out" / "r.json")], tmp_path)
    return done, left, tmp_path


def test_torchrun_exits_0_and_rank_0_alone_writes_and_prints(under_torchrun):
    done, left, tmp_path = under_torchrun
    assert done.returncode == 0, done.stdout + done.stderr
    assert not left, f"processes left behind: {left}"
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["r.json"]  # one file, no rank's temporary left
    lines = done.stdout.splitlines()
    rows = [line for line in lines if line.startswith("medusa/chain-k3[") and line.rstrip().endswith("exact")]
    assert len(rows) == 1 and "tensor_parallel=2" in rows[0]  # one table row, one gate line: rank 0's
    assert sum(line.startswith("medusa/chain-k3[") and ": PASSED" in line for line in lines) == 1
    assert done.stdout.count("wrote ") == 1 and done.stdout.count("recorded in ") == 1
    (history,) = (tmp_path / "history").glob("*.jsonl")  # one history file, one record: rank 0's
    assert len(history.read_text().splitlines()) == 1


def test_torchrun_result_equals_the_single_process_run(under_torchrun, tp1):
    from test_tp_cases import assert_same_run

    done, _, tmp_path = under_torchrun
    assert done.returncode == 0, done.stdout + done.stderr
    tp2 = json.loads((tmp_path / "out" / "r.json").read_text())
    assert tp2["case"]["tensor_parallel"] == 2 and tp1["case"]["tensor_parallel"] == 1
    assert_same_run(tp2, tp1)
    env = tp2["env"]
    assert (env["world_size"], env["tensor_parallel"], env["backend"]) == (2, 2, "gloo")
    assert len(env["device_names"]) == 2 and env["hardware_class"] == "cpu"
    assert tp1["env"]["world_size"] == 1


def test_a_failing_rank_ends_torchrun_non_zero_with_its_error_and_leaves_no_process(tmp_path):
    (tmp_path / "out").mkdir()
    started = time.monotonic()
    done, left = torchrun([*CASE_ARGS, "--output", str(tmp_path / "out" / "r.json")], tmp_path,
                          script=str(Path(__file__).relative_to(ROOT)))
    assert done.returncode != 0, done.stdout + done.stderr
    assert "(torchrun killed after" not in done.stderr, done.stderr
    assert time.monotonic() - started < TIMEOUT_S
    assert ("specbench: error: rank 1 of 2 (torchrun) failed in case medusa/chain-k3[" in done.stderr
            and f"] at tensor_parallel = 2: ValueError: {BROKEN}" in done.stderr), done.stderr
    assert re.search(r"rank\s*: 1 \(local_rank: 1\)", done.stderr), done.stderr  # torchrun's summary names it too
    assert not left, f"processes left behind: {left}"
    assert not list((tmp_path / "out").iterdir()), "a failed run wrote its --output"
    assert not (tmp_path / "history").exists() or not list((tmp_path / "history").glob("*.jsonl"))


if __name__ == "__main__":  # one of torchrun's ranks in the failure test
    import specbench.run.tensor_parallel
    from specbench.cli import main

    if os.environ.get("RANK") == "1":
        def broken_proposer(case, target):  # after the group is up and the sharded target loaded
            raise ValueError(BROKEN)

        specbench.run.tensor_parallel.build_proposer = broken_proposer
    sys.exit(main(sys.argv[1:]))
