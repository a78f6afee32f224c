"""Repeats, same-run ratio metrics and the predicted speedup, on scripted timings with known answers; their gates
and flags. (The step costs themselves, scripted and real: tests/test_step_costs.py.)"""

from __future__ import annotations

import math

import pytest

from specbench.cases import Case
from specbench.gating.gates import RATIOS_ONLY, compare_entry
from specbench.gating.regenerate import baseline_entry
from specbench.run.harness import run_case
from specbench.run.speed import measurement_flags, repeat_record, speed_over_repeats
from _synthetic_results import make_result


def _requests(spec_rate, plain_rate, spec_ptl, plain_ptl, drafts=10, accepted=15):
    return [{"tokens_per_s": s, "plain_tokens_per_s": p, "per_token_latency_s": sl, "plain_per_token_latency_s": pl,
             "time_to_first_token_s": 0.01, "num_drafts": drafts, "num_accepted_tokens": accepted}
            for s, p, sl, pl in zip(spec_rate, plain_rate, spec_ptl, plain_ptl)]


def test_repeat_record_and_median_over_repeats_have_known_values():
    costs = {"t1_s": 0.010, "verify_s": 0.012, "draft_s": 0.001, "verify_width": 4}
    record = repeat_record(0, _requests([30, 50], [20, 30], [0.02, 0.03], [0.04, 0.05]), costs)
    assert record["tokens_per_s"] == 40 and record["plain_tokens_per_s"] == 25 and record["speedup"] == 1.6
    assert record["decode_speedup"] == pytest.approx(0.09 / 0.05)  # sum of plain / sum of speculative s/token
    assert record["verify_cost_ratio"] == pytest.approx(1.2) and record["draft_cost_ratio"] == pytest.approx(0.1)
    assert record["predicted_speedup"] == pytest.approx(2.5 / 1.3)  # MAL 1 + 30/20 over (1.2 + 0.1)
    records = [dict(record, repeat=i, tokens_per_s=rate, t1_s=t1) for i, (rate, t1) in enumerate([(40, 0.010), (10, 0.030),
                                                                                              (44, 0.011)])]
    out = speed_over_repeats(records)
    assert out["num_repeats"] == 3 and out["tokens_per_s"] == 40  # the median, not the mean (31.3)
    assert out["step_latency_s"] == 0.011  # T(1): the median over repeats too
    assert out["speedup_prediction_error"] == pytest.approx((0.09 / 0.05) / (2.5 / 1.3) - 1)


def test_a_prediction_off_by_more_than_ten_percent_is_flagged():
    metrics = {"decode_speedup": 1.2, "predicted_speedup": 1.5, "speedup_prediction_error": 1.2 / 1.5 - 1,
               "mean_acceptance_length": 2.0, "verify_cost_ratio": 1.2, "draft_cost_ratio": 0.13}
    (flag,) = measurement_flags(metrics)
    assert flag["kind"] == "speedup_prediction"
    assert flag["message"].startswith("measured decode-phase speedup 1.200 is -20% off the 1.500 its step costs predict")
    assert measurement_flags({**metrics, "speedup_prediction_error": 0.05}) == []
    assert measurement_flags({**metrics, "speedup_prediction_error": math.nan}) == []


def _entry(result):
    return baseline_entry(result, command="pytest tests/test_repeats.py")


def test_the_median_over_repeats_is_gated_with_an_interval_over_repeats():
    """Five repeats of 40 requests, speed drifting 1% from one repeat to the next (a GPU-bound case's order of
    magnitude): an unchanged run (other noise draws) passes at a 5% tolerance, a uniform 10% slowdown is
    caught, and the interval is wider than one repeat's."""
    tol = {"tokens_per_s": 0.05, "speedup": 0.05, "decode_speedup": 0.05}
    baseline = make_result(seed=0, num_repeats=5, repeat_drift=0.01)
    entry = _entry(baseline)
    unchanged = compare_entry(make_result(seed=1, num_repeats=5, repeat_drift=0.01), entry, tolerances=tol)
    assert unchanged.passed, unchanged.format()
    slower = compare_entry(make_result(seed=1, num_repeats=5, repeat_drift=0.01, speed_scale=0.9), entry, tolerances=tol)
    assert "tokens_per_s" in [c.name for c in slower.failures], slower.format()
    one = compare_entry(make_result(seed=1), _entry(make_result(seed=0)), tolerances=tol).check("tokens_per_s").ci
    many = unchanged.check("tokens_per_s").ci
    assert many[1] - many[0] > one[1] - one[0]  # drift between repeats widens it (paired single-repeat: prompts cancel)


def test_step_cost_ratios_are_gated_tightly_and_lower_is_better():
    entry = _entry(make_result(seed=0, num_repeats=3))
    tol = {"verify_cost_ratio": 0.05, "draft_cost_ratio": 0.05}
    assert compare_entry(make_result(seed=1, num_repeats=3), entry, tolerances=tol).passed
    verify = compare_entry(make_result(seed=1, num_repeats=3, verify_scale=1.2), entry, tolerances=tol)
    assert [c.name for c in verify.failures] == ["verify_cost_ratio"], verify.format()
    draft = compare_entry(make_result(seed=1, num_repeats=3, draft_scale=1.5), entry, tolerances=tol)
    assert [c.name for c in draft.failures] == ["draft_cost_ratio"], draft.format()
    assert compare_entry(make_result(seed=1, num_repeats=3, verify_scale=0.8), entry, tolerances=tol).passed


def test_ratios_only_skips_absolute_timings_naming_why_but_gates_ratios():
    baseline = make_result(seed=0, gate_speed="ratios", hardware_class="NVIDIA H200")
    slower = make_result(seed=0, gate_speed="ratios", hardware_class="NVIDIA H200", speed_scale=0.5, verify_scale=1.5)
    report = compare_entry(slower, _entry(baseline))
    assert report.check("tokens_per_s").status == "skipped" and report.check("tokens_per_s").reason == RATIOS_ONLY
    assert report.check("per_token_latency_s").status == "skipped"
    assert [c.name for c in report.failures] == ["verify_cost_ratio"]


def test_clocks_unlike_the_baselines_are_said_in_the_verdict():
    clocks = {"sm_clock_mhz": 1980, "memory_clock_mhz": 3201, "pstate": "P0", "throttle_reasons": []}
    baseline = make_result(seed=0, hardware_class="NVIDIA H200")
    baseline["env"]["gpu_clocks"] = clocks
    run = make_result(seed=0, hardware_class="NVIDIA H200")
    run["env"]["gpu_clocks"] = {**clocks, "sm_clock_mhz": 1410}
    report = compare_entry(run, _entry(baseline))
    (note,) = report.notes
    assert "SM 1410 MHz vs 1980 MHz" in note and note in report.format()
    run["env"]["gpu_clocks"] = clocks
    assert compare_entry(run, _entry(baseline)).notes == []


def test_run_case_repeats_the_prompt_set_and_keeps_quality_from_the_first_repeat():
    case = Case(name="repeats", proposer={"name": "ngram", "num_speculative_tokens": 3}, max_new_tokens=12,
                prompts={"name": "synthetic", "num_prompts": 2}, repeats=3)
    result = run_case(case, progress=False).to_dict()
    assert [r["repeat"] for r in result["requests"]] == [0, 0, 1, 1, 2, 2]
    assert [r["repeat"] for r in result["repeats"]] == [0, 1, 2]
    first = result["requests"][:2]
    for later in (result["requests"][2:4], result["requests"][4:]):  # the same seeds: the same tokens and counters
        assert [r["output_token_ids"] for r in later] == [r["output_token_ids"] for r in first]
    metrics = result["metrics"]
    assert metrics["num_drafts"] == sum(r["num_drafts"] for r in first)
    assert metrics["num_repeats"] == 3
    for record in result["repeats"]:
        assert record["t1_s"] > 0 and record["verify_width"] == 4
        assert record["predicted_speedup"] == pytest.approx(
            metrics["mean_acceptance_length"] / (record["verify_cost_ratio"] + record["draft_cost_ratio"]))


def test_a_flagged_run_is_marked_in_the_history_status_and_ci_summary(tmp_path):
    from specbench.gating.history import append_results, load_history
    from specbench.report.markdown import render_markdown
    from specbench.report.status import status_rows

    result = make_result(seed=0)
    result["flags"] = [{"kind": "speedup_prediction", "message": "measured decode-phase speedup 1.200 is -20% off"}]
    append_results(tmp_path, [result, make_result(seed=1, name="other")])
    history = load_history(tmp_path)
    rows = {row.case_id: row for row in status_rows(history, None)}
    assert rows["medusa/medusa-chain-k3"].flags == ["measured decode-phase speedup 1.200 is -20% off"]
    assert rows["medusa/other"].flags == []
    summary = render_markdown(history, [], list(rows.values()))
    assert "<details><summary>Measurement flags</summary>" in summary
    assert "- medusa/medusa-chain-k3 (cpu): measured decode-phase speedup 1.200 is -20% off" in summary
    from specbench.report.html import render_html

    page = render_html(history, [], list(rows.values()))
    assert page.count("⚑ measurement") == 1 and 'title="measured decode-phase speedup 1.200 is -20% off"' in page
