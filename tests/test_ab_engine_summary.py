"""bench/ab_engine_summary.py: head against base from the runs bench/ab_engine_trees.sh leaves in OUT."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import ab_engine_summary  # noqa: E402


def _speed_run(out: Path, name: str, plain: float, t1_s: float, t4: float) -> None:
    run = out / name
    run.mkdir(parents=True)
    figures = {"static": {"plain": {"tokens_per_s": plain}, "verify_seconds_k1": t1_s,
                          "verify_cost_ratio": {"1": 1.0, "4": t4}}}
    (run / "speed_7b.json").write_text(json.dumps(figures))


def _curve_run(out: Path, name: str, plain_b1: float) -> None:
    run = out / name
    run.mkdir(parents=True)
    curve = {"curve": [{"batch_size": 1, "plain": {"throughput_tokens_per_s": plain_b1}}]}
    (run / "batch_curve.json").write_text(json.dumps(curve))


def test_each_tree_is_the_mean_of_its_runs_and_the_change_is_head_over_base(tmp_path, capsys):
    _speed_run(tmp_path, "speed_1b_base_1", 800.0, 0.0010, 1.30)
    _speed_run(tmp_path, "speed_1b_base_2", 900.0, 0.0010, 1.40)  # base: mean 850 tok/s, T(4)/T(1) 1.35
    _speed_run(tmp_path, "speed_1b_head_1", 935.0, 0.0009, 1.35)
    _curve_run(tmp_path, "curve_base", 200.0)
    _curve_run(tmp_path, "curve_head_2", 190.0)
    (tmp_path / "speed_1b_head_1.log").write_text("a log beside the run directory is not a run\n")
    assert ab_engine_summary.main([str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = {line[2:26].strip(): line[26:].split() for line in lines if line.startswith("  ")}  # name: base, head, change
    assert lines[0] == "speed_7b.py static engine, synthetic 1B (base runs 2, head runs 1)"
    assert row["plain tok/s"] == ["850.000", "935.000", "+10.00%"]
    assert row["T(1) ms"] == ["1.000", "0.900", "-10.00%"]
    assert row["T(4)/T(1)"] == ["1.350", "1.350", "+0.00%"]
    assert "speed_7b.py static engine, synthetic 7B: no comparison (base runs 0, head runs 0)" in lines
    assert row["B=1 plain tok/s"] == ["200.000", "190.000", "-5.00%"]


def test_a_figure_one_tree_lacks_is_left_out(tmp_path, capsys):
    _speed_run(tmp_path, "speed_7b_base", 218.0, 0.0042, 1.21)
    _speed_run(tmp_path, "speed_7b_head", 230.0, 0.0041, 1.23)
    head = tmp_path / "speed_7b_head" / "speed_7b.json"
    figures = json.loads(head.read_text())
    del figures["static"]["verify_seconds_k1"]  # e.g. a run cut by the call's deadline before its verify timings
    head.write_text(json.dumps(figures))
    assert ab_engine_summary.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "T(1) ms" not in out and "plain tok/s" in out
