"""bench/gpu_tier.sh gates and never re-bases silently: its suite stages gate against the committed baselines and
fail the script on a regression; only its `store` stage regenerates, and only with SPECBENCH_REGENERATE_REASON.
No other bench/ script writes baselines. The script runs here on the CPU: the refusals come before any GPU work,
and a stand-in PYTHON plays pytest (a regressed stage) so the stages' wiring runs without a GPU."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _synthetic_results import make_result

from specbench.gating.baselines import BaselineStore
from specbench.gating.regenerate import update_baseline

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gpu_tier.sh"
# what storing baselines looks like in a script: the CLI commands, the pytest option and the library call
STORING = re.compile(r"baselines regenerate|--update-baselines|--specbench-update-baselines|update_baseline\b")

# plays `python -m pytest` as a stage whose gates failed (exit status 1, as pytest's), after appending RESULT_LINE
# to its --specbench-results file; any other command goes to the real interpreter. Every call is logged.
STAND_IN = """#!/usr/bin/env bash
echo "$*" >> "$STAND_IN_LOG"
if [[ "$1 $2" == "-m pytest" ]]; then
    while (( $# )); do [[ $1 == --specbench-results ]] && cat "$RESULT_LINE" >> "$2"; shift; done
    exit 1
fi
exec {python} "$@"
"""


def _store_function(lines: list[str]) -> range:
    start = lines.index("store() {")
    return range(start, lines.index("}", start) + 1)


def test_only_the_store_stage_regenerates():
    lines = SCRIPT.read_text(encoding="utf-8").splitlines()
    store = _store_function(lines)
    storing = [n for n, line in enumerate(lines) if STORING.search(line) and not line.lstrip().startswith("#")]
    assert storing and all(n in store for n in storing), [lines[n] for n in storing if n not in store]
    assert any("--reason" in lines[n] for n in store)


def test_no_other_bench_script_writes_baselines():
    scripts = [p for p in (ROOT / "bench").iterdir() if p.suffix in (".py", ".sh") and p != SCRIPT]
    assert scripts, "bench/ has no scripts: the check would pass vacuously"
    offenders = [f"{p.name}:{n}" for p in scripts for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
                 if STORING.search(line)]
    assert not offenders, f"bench scripts may compare with an in-memory entry (baseline_entry), never store: {offenders}"


@pytest.fixture()
def checkout(tmp_path):
    """A checkout of the script alone: its baselines/ holds an ngram baseline; PYTHON logs every call."""
    repo = tmp_path / "repo"
    (repo / "bench").mkdir(parents=True)
    shutil.copy(SCRIPT, repo / "bench")
    update_baseline(make_result(seed=3, suite="ngram", name="k3"), repo / "baselines", command="test", reason="test")
    stand_in = tmp_path / "python"
    stand_in.write_text(STAND_IN.format(python=sys.executable))
    stand_in.chmod(0o755)
    result_line = tmp_path / "result.jsonl"
    result_line.write_text(json.dumps(make_result(seed=1, hardware_class="NVIDIA H200")) + "\n")
    env = {**os.environ, "PYTHON": str(stand_in), "STAND_IN_LOG": str(tmp_path / "calls.log"),
           "RESULT_LINE": str(result_line), "PYTHONPATH": str(ROOT), "SPECBENCH_BASELINES_DIR": str(repo / "baselines")}
    env.pop("SPECBENCH_REGENERATE_REASON", None)
    return repo, env


def tier(checkout, *args: str, reason: str | None = None) -> subprocess.CompletedProcess:
    repo, env = checkout
    env = env if reason is None else {**env, "SPECBENCH_REGENERATE_REASON": reason}
    return subprocess.run(["bash", "bench/gpu_tier.sh", *args], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=300)


def _calls(checkout) -> list[str]:
    log = Path(checkout[1]["STAND_IN_LOG"])
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("stages, reason", [(["store"], None), (["store"], "  "), (["reference", "store"], None),
                                           (["all", "store"], None)])
def test_store_without_a_reason_is_refused_before_any_stage_runs(checkout, stages, reason):
    out = checkout[0] / "out"
    done = tier(checkout, str(out), *stages, reason=reason)
    assert done.returncode == 2, done.stderr
    assert "the store stage re-bases baselines/*.json and needs a reason: set SPECBENCH_REGENERATE_REASON=" in done.stderr
    assert not out.exists() and _calls(checkout) == []  # no stage ran, not even the reference suites


def test_store_with_no_results_to_store_fails_clearly(checkout):
    out = checkout[0] / "out"
    done = tier(checkout, str(out), "store", reason="new kernels")
    assert done.returncode == 2
    assert f"gpu_tier.sh: store: no results_*.jsonl in {out} to store" in done.stderr
    assert _calls(checkout) == []


def test_a_regressed_stage_fails_the_script_and_stores_nothing(checkout):
    repo, _ = checkout
    before = {p.name: p.read_bytes() for p in (repo / "baselines").iterdir()}
    done = tier(checkout, str(repo / "out"), "reference")
    assert done.returncode == 1, done.stderr  # the stage's pytest exit status
    assert [c.split()[:2] for c in _calls(checkout)] == [["-m", "pytest"]]  # gated, nothing else
    assert {p.name: p.read_bytes() for p in (repo / "baselines").iterdir()} == before
    assert (repo / "out" / "results_reference.jsonl").is_file()  # kept for a deliberate `store`


def test_store_regenerates_from_the_stages_results_with_the_reason(checkout):
    repo, _ = checkout
    out = repo / "out"
    reason = "H200 re-base after the fused prefill"
    done = tier(checkout, str(out), "reference", "store", reason=reason)
    assert done.returncode == 1, done.stderr  # the reference stage regressed; storing does not hide it
    regenerate = [c for c in _calls(checkout) if "baselines regenerate" in c]
    assert regenerate == [f"-m specbench.cli baselines regenerate --from-results {out}/results_reference.jsonl "
                          f"--reason {reason}"]
    entry = BaselineStore(repo / "baselines").entry("medusa/medusa-chain-k3")
    assert entry["speed"]["NVIDIA H200"]["provenance"]["reason"] == reason
    assert f"  reason: {reason}" in (out / "store.log").read_text().splitlines()
    assert sorted(p.name for p in out.glob("*.json")) == ["medusa.json"]  # what changed; ngram.json did not
