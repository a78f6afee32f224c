"""Speed stability over unchanged runs: the spread of each metric and every run gated against every other."""

from __future__ import annotations

import pytest

from specbench.gating.stability import metric_spread, pairwise_false_failures
from tests._synthetic_results import make_result

NUM_RESAMPLES = 200  # enough for a verdict on 40 requests; the default is for published gates


def test_spread_reports_median_and_largest_relative_deviation():
    results = [{"metrics": {"tokens_per_s": v, "speedup": None}} for v in (90.0, 100.0, 110.0)]
    spread = metric_spread(results, ["tokens_per_s", "speedup", "absent"])
    assert set(spread) == {"tokens_per_s"}  # undefined or missing metrics are left out, not zeros
    assert spread["tokens_per_s"]["median"] == 100.0
    assert spread["tokens_per_s"]["max_rel_dev"] == pytest.approx(0.10)
    assert spread["tokens_per_s"]["range"] == pytest.approx(0.20)


def test_runs_alike_never_fail_each_other():
    results = [make_result(seed=0, num_repeats=2) for _ in range(3)]
    pairs = pairwise_false_failures(results, num_resamples=NUM_RESAMPLES)
    assert pairs == {"pairs": 6, "failing_pairs": 0, "by_check": {}, "worst": None}


def test_one_slow_run_fails_only_the_pairs_where_the_fast_ones_are_its_baseline():
    # 20% slower on the host: absolute speed is below the 15% tolerance against a fast baseline, and only then
    results = [make_result(seed=0, num_repeats=2), make_result(seed=0, num_repeats=2),
               make_result(seed=0, num_repeats=2, speed_scale=0.8)]
    pairs = pairwise_false_failures(results, num_resamples=NUM_RESAMPLES)
    assert pairs["pairs"] == 6 and pairs["failing_pairs"] == 2
    assert pairs["by_check"]["tokens_per_s"] == 2
    assert pairs["worst"]["measured_run"] == 2 and pairs["worst"]["baseline_run"] in (0, 1)
