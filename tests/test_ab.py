"""The A/B verdict (specbench.gating.ab): the t interval over paired rounds, the rule, and reports from scripted
timings with known verdicts (docs/ab.md)."""

from __future__ import annotations

import math

import pytest

from specbench.gating.ab import (AB_TOLERANCE, ab_report, headline_check, judge_change, paired_change,
                                 speed_checks, t_quantile)
from specbench.gating.verdicts import HIGHER_IS_BETTER, LOWER_IS_BETTER
from tests._synthetic_results import make_result, with_divergence

# a machine's round-to-round drift, the same for both sides of a round (clocks, heat): it must cancel in the pairs
ROUND_DRIFT = [1.0, 1.03, 0.97, 1.02, 0.98]
# what is left per process after the pairing: +-0.5%, well under the 5% tolerance
PROCESS_JITTER = [1.004, 0.996, 1.005, 0.995, 1.0]


def scripted_pairs(head_speed: float, *, head_accept: float = 1.0, rounds: int = 5) -> list[tuple[dict, dict]]:
    """Rounds of (base, head) results whose speed is scripted: the head runs at ``head_speed`` times the base."""
    pairs = []
    for r in range(rounds):
        drift = ROUND_DRIFT[r % len(ROUND_DRIFT)]
        base = make_result(0, num_requests=10, speed_scale=drift * PROCESS_JITTER[r % 5], hardware_class="NVIDIA H200")
        head = make_result(0, num_requests=10, speed_scale=drift * head_speed * PROCESS_JITTER[(r + 2) % 5],
                           accept_scale=head_accept, hardware_class="NVIDIA H200")
        pairs.append((base, head))
    return pairs


@pytest.mark.parametrize("df", [1, 2, 3, 4, 5, 8, 9, 30])
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_t_quantile_matches_scipy(df, confidence):
    stats = pytest.importorskip("scipy.stats")
    assert t_quantile(confidence, df) == pytest.approx(stats.t.ppf(0.5 + confidence / 2, df), rel=1e-7)


def test_paired_change_is_the_geometric_mean_ratio_with_a_t_interval():
    base, head = [100.0, 110.0, 90.0], [95.0, 104.5, 85.5]  # every pair exactly 5% slower
    change, (low, high) = paired_change(base, head)
    assert change == pytest.approx(-0.05)
    assert low == pytest.approx(-0.05) and high == pytest.approx(-0.05)  # no spread in the ratios: a point
    change, (low, high) = paired_change([100.0, 100.0, 100.0], [96.0, 94.0, 95.0], confidence=0.95)
    assert low < change < high < 0
    # by hand: logs of 0.96, 0.94, 0.95; t(2) at 95% = 4.3027
    logs = [math.log(x) for x in (0.96, 0.94, 0.95)]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    assert high == pytest.approx(math.exp(mean + 4.302653 * sd / math.sqrt(3)) - 1, rel=1e-5)
    with pytest.raises(ValueError, match="at least 2 pairs"):
        paired_change([1.0], [1.0])


@pytest.mark.parametrize("direction,change,interval,status", [
    # higher is better (tok/s): a significant drop whose interval reaches -5% fails
    (HIGHER_IS_BETTER, -0.05, (-0.07, -0.03), "regression"),
    (HIGHER_IS_BETTER, -0.045, (-0.052, -0.038), "regression"),  # a true 5% slowdown estimated short of 5%
    (HIGHER_IS_BETTER, -0.02, (-0.03, -0.01), "pass"),  # real, but the interval stays within the tolerance
    (HIGHER_IS_BETTER, -0.08, (-0.20, 0.04), "pass"),  # large but not significant: the interval holds 0
    (HIGHER_IS_BETTER, 0.08, (0.06, 0.10), "improvement"),
    # lower is better (T(1)): mirrored
    (LOWER_IS_BETTER, 0.05, (0.03, 0.07), "regression"),
    (LOWER_IS_BETTER, -0.06, (-0.08, -0.04), "improvement"),
    (LOWER_IS_BETTER, 0.01, (-0.01, 0.03), "pass"),
])
def test_judge_change_rule(direction, change, interval, status):
    got, reason = judge_change(direction, change, interval, AB_TOLERANCE)
    assert got == status, reason


def test_an_unchanged_head_passes_despite_drift_between_rounds():
    report = ab_report("medusa/medusa-chain-k3", scripted_pairs(1.0), against="base")
    assert report.passed, report.format()
    tokens = report.check("tokens_per_s")
    assert tokens.status == "pass" and "no significant change" in tokens.reason
    # the rounds drift by 6% end to end, which pairing cancels: what is left is the +-0.5% jitter, whose 99% interval
    # over 5 rounds is t(4) = 4.6 standard errors, about +-1.2%; unpaired, the drift alone would spread 6%
    assert tokens.ci[0] > tokens.baseline * 0.98 and tokens.ci[1] < tokens.baseline * 1.02


@pytest.mark.parametrize("slowdown", [0.05, 0.10])
def test_a_slower_head_is_caught(slowdown):
    report = ab_report("medusa/medusa-chain-k3", scripted_pairs(1 - slowdown), against="base")
    assert not report.passed
    failed = {c.name for c in report.failures}
    assert {"tokens_per_s", "step_latency_s"} <= failed, report.format()
    assert headline_check(report).name in failed
    assert report.check("acceptance_rate").status == "pass"  # the same tokens: quality unchanged


def test_a_faster_head_is_an_improvement_and_passes():
    report = ab_report("medusa/medusa-chain-k3", scripted_pairs(1.10), against="base")
    assert report.passed
    assert report.check("tokens_per_s").status == "improvement"


def test_quality_and_losslessness_are_gated_against_the_base():
    report = ab_report("medusa/medusa-chain-k3", scripted_pairs(1.0, head_accept=0.7), against="base")
    assert report.check("acceptance_rate").status == "regression"
    diverged = [(b, with_divergence(h, 2, 7, match_fraction=0.9)) for b, h in scripted_pairs(1.0)]
    report = ab_report("medusa/medusa-chain-k3", diverged, against="base")
    assert report.correctness.status == "fail" and "position 7" in report.correctness.reason


def test_a_metric_missing_on_one_side_is_skipped_not_judged():
    pairs = scripted_pairs(1.0)
    pairs[1][1]["metrics"]["step_latency_s"] = None  # the head's second round did not time T(1)
    checks = {c.name: c for c in speed_checks("x/y", pairs)}
    assert checks["step_latency_s"].status == "skipped"
    assert checks["tokens_per_s"].status == "pass"


def test_one_round_is_refused():
    with pytest.raises(ValueError, match="at least 2 rounds"):
        ab_report("x/y", scripted_pairs(1.0, rounds=1), against="base")
