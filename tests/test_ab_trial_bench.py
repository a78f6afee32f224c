"""bench/ab_trial.py on the CPU (structure only, no timing asserted) and the bench-only slowdown switch of
bench/inject_slowdown (its patch is applied to the tree the process imports, and only when asked)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from _bench_scripts import BENCH, load_bench_script

PROBE = "import specbench.engine.hf_target as m; print(m.HFTarget.verify.__name__)"


def test_trial_writes_one_row_per_case_and_metric(tmp_path):
    trial = load_bench_script("ab_trial")
    out = tmp_path / "out"
    assert trial.main([str(out), "--case", "demo/tiny-ngram-k3", "--plan", "unchanged", "--rounds", "2",
                       "--num-prompts", "1", "--max-new-tokens", "4", "--scratch", str(tmp_path / "scratch")]) == 0
    data = json.loads((out / "ab_trial.json").read_text(encoding="utf-8"))
    metrics = {row["metric"] for row in data["rows"]}
    assert {"step_latency_s", "tokens_per_s"} <= metrics <= set(trial.SHOWN_METRICS)
    for row in data["rows"]:
        assert row["comparison"] == "0-unchanged" and row["case_id"].startswith("demo/tiny-ngram-k3[")
        assert row["interval"][0] <= row["change"] <= row["interval"][1]
        assert row["status"] in ("pass", "regression", "improvement")
    assert (out / "ab_0-unchanged.json").is_file() and "compare HEAD" in (out / "ab_trial.log").read_text()


def test_a_second_call_reuses_the_rounds_kept_under_runs_root(tmp_path):
    """The scratch commit is the same in every call, so --runs-root's rounds are the same comparison's."""
    trial = load_bench_script("ab_trial")
    # ITEM@R: this comparison's rounds, whatever --rounds says
    argv = ["--case", "demo/tiny-ngram-k3", "--plan", "unchanged@2", "--rounds", "3", "--num-prompts", "1",
            "--max-new-tokens", "4", "--scratch", str(tmp_path / "scratch"), "--runs-root", str(tmp_path / "runs")]
    assert trial.main([str(tmp_path / "first"), *argv]) == 0
    assert sorted(p.name for p in (tmp_path / "runs" / "0-unchanged-r2").glob("round-*.json")) == [
        "round-0-demo_tiny-ngram-k3.json", "round-1-demo_tiny-ngram-k3.json"]
    assert trial.main([str(tmp_path / "second"), *argv]) == 0
    log = (tmp_path / "second" / "ab_trial.log").read_text(encoding="utf-8")
    assert log.count("kept from") == 2 and " base (" not in log  # no process ran
    first, second = (json.loads((tmp_path / d / "ab_0-unchanged-r2.json").read_text())["cases"] for d in ("first", "second"))
    assert first[0]["rounds"] == second[0]["rounds"]


def test_the_slowdown_switch_patches_verify_only_when_set(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(BENCH / "inject_slowdown")}
    off = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    assert off.stdout.strip() == "verify" and "inject_slowdown" not in off.stderr
    env["SPECBENCH_INJECT_VERIFY_SLOWDOWN"] = "0.05"
    on = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True,
                        cwd=Path(__file__).resolve().parent.parent)
    assert on.stdout.strip() == "slowed_verify"
    assert "specbench.engine.hf_target.HFTarget.verify slowed by 5.0%" in on.stderr
