"""A/B verdicts: a head's speed against a base's, from rounds of paired runs on one machine (docs/ab.md).

Absolute speed differs between machines of one model by more than a 5% gate allows (docs/ab.md#why), so the
verdict on a change compares it with its base on the same machine, alternating fresh processes. Each round
gives one pair of values per speed metric (each value a run's median over its repeats); the change is the mean
of the pairs' log ratios, its interval a Student t interval over the pairs:

    d_r = log(head_r / base_r)                     r = 1..R rounds
    change = exp(mean(d)) - 1,  interval = exp(mean(d) -/+ t(R-1) * sd(d) / sqrt(R)) - 1

The rule, for a higher-is-better metric (mirrored for latencies):

    regression   iff  the whole interval is below 0  and  its low end reaches -tolerance
    improvement  iff  the whole interval is above 0  and  its high end reaches +tolerance
    pass         otherwise (no significant change, or a significant one the interval keeps within tolerance)

"Reaches" rather than "the estimate is past the tolerance": a true slowdown of exactly the tolerance must be
caught, and its estimate falls short of the tolerance half the time. An unchanged head fails only when noise puts
the whole interval on one side of zero and stretches it to the tolerance, both at once (docs/ab.md#rule).
Quality and losslessness are gated as against a stored baseline, with the base's first round as the baseline.
"""

from __future__ import annotations

import math
import statistics

from specbench.gating.gates import DIRECTIONS, QUALITY_METRICS, SPEED_METRICS, compare_entry
from specbench.gating.regenerate import baseline_entry
from specbench.gating.verdicts import HIGHER_IS_BETTER, NOT_MEASURED, GateReport, MetricCheck

AB_CONFIDENCE = 0.99  # as the stored gates: several metrics per case are judged at once (docs/ab.md#rule)
AB_TOLERANCE = 0.05  # every speed metric; "5% by default" (docs/ab.md#rule)
MIN_ROUNDS = 2  # one pair has no spread, so no interval


def _t_two_sided_mass(t: float, df: int) -> float:
    """P(|T| < t) for Student's t with ``df`` degrees of freedom (closed forms for integer df)."""
    theta = math.atan(t / math.sqrt(df))
    cos2, sin = math.cos(theta) ** 2, math.sin(theta)
    if df % 2:  # odd: 2/pi * (theta + sin * cos * (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...))
        term, total = 1.0, 0.0
        if df > 1:
            total = term
            for k in range(1, (df - 3) // 2 + 1):
                term *= cos2 * (2 * k) / (2 * k + 1)
                total += term
        return 2 / math.pi * (theta + sin * math.cos(theta) * total)
    term, total = 1.0, 1.0  # even: sin * (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...)
    for k in range(1, (df - 2) // 2 + 1):
        term *= cos2 * (2 * k - 1) / (2 * k)
        total += term
    return sin * total


def t_quantile(confidence: float, df: int) -> float:
    """The t such that P(|T| < t) = ``confidence`` (two-sided critical value), by bisection."""
    if not 0 < confidence < 1 or df < 1:
        raise ValueError(f"need 0 < confidence < 1 and df >= 1, found {confidence!r}, {df!r}")
    low, high = 0.0, 1.0
    while _t_two_sided_mass(high, df) < confidence:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if _t_two_sided_mass(mid, df) < confidence else (low, mid)
    return (low + high) / 2


def paired_change(base: list[float], head: list[float], confidence: float = AB_CONFIDENCE
                  ) -> tuple[float, tuple[float, float]]:
    """(relative change head/base - 1, its interval) over paired rounds, from log ratios (module docstring)."""
    if len(base) != len(head) or len(base) < MIN_ROUNDS:
        raise ValueError(f"need at least {MIN_ROUNDS} pairs of equal length, found {len(base)} and {len(head)}")
    logs = [math.log(h / b) for b, h in zip(base, head)]
    mean = statistics.fmean(logs)
    half = t_quantile(confidence, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean) - 1, (math.exp(mean - half) - 1, math.exp(mean + half) - 1)


def judge_change(direction: str, change: float, interval: tuple[float, float], tolerance: float) -> tuple[str, str]:
    """(status, reason) by the rule in the module docstring; ``change`` and ``interval`` are head/base - 1."""
    sign = 1 if direction == HIGHER_IS_BETTER else -1
    # in "better" units: > 0 is faster whichever the metric's direction
    better_low, better_high = sorted((sign * interval[0], sign * interval[1]))
    shown = f"{change * 100:+.1f}% (interval {interval[0] * 100:+.1f}% to {interval[1] * 100:+.1f}%)"
    if better_high < 0 and better_low <= -tolerance:
        return "regression", f"worse by {shown}, reaching the {tolerance * 100:g}% tolerance"
    if better_low > 0 and better_high >= tolerance:
        return "improvement", f"better by {shown}"
    if better_high < 0 or better_low > 0:
        return "pass", f"a significant change of {shown}, within the {tolerance * 100:g}% tolerance"
    return "pass", f"no significant change: {shown}"


def _value(result: dict, name: str) -> float | None:
    value = (result.get("metrics") or {}).get(name)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    return float(value) if ok else None


def speed_checks(case_id: str, pairs: list[tuple[dict, dict]], *, tolerances: dict | None = None,
                 confidence: float = AB_CONFIDENCE) -> list[MetricCheck]:
    """One A/B check per speed metric that every round measured on both sides; the others are skipped."""
    checks = []
    for name in SPEED_METRICS:
        base = [_value(b, name) for b, _ in pairs]
        head = [_value(h, name) for _, h in pairs]
        if all(v is None for v in base + head):
            continue  # a metric this kind of case never measures (a batch metric of an unbatched case)
        tolerance = (tolerances or {}).get(name, AB_TOLERANCE)
        check = MetricCheck(name, DIRECTIONS[name], None, None, tolerance, "skipped", NOT_MEASURED,
                            confidence=confidence, case_id=case_id)
        if None not in base + head:
            check.baseline, check.measured = statistics.median(base), statistics.median(head)
            change, interval = paired_change(base, head, confidence)
            check.ci = (check.baseline * (1 + interval[0]), check.baseline * (1 + interval[1]))
            check.status, check.reason = judge_change(DIRECTIONS[name], change, interval, tolerance)
            check.reason += f" over {len(pairs)} rounds"
        checks.append(check)
    return checks


def ab_report(case_id: str, pairs: list[tuple[dict, dict]], *, against: str, tolerances: dict | None = None,
              confidence: float = AB_CONFIDENCE) -> GateReport:
    """The head's verdict against the base: quality and losslessness gated as against a stored baseline (the
    base's first round as the baseline, docs/metrics.md#gates), speed by the paired A/B rule. ``against`` names
    the base in the headline (e.g. "5483910 (A/B, 5 rounds)")."""
    if len(pairs) < MIN_ROUNDS:
        raise ValueError(f"an A/B verdict needs at least {MIN_ROUNDS} rounds, found {len(pairs)}")
    base_first, head_first = pairs[0]
    entry = baseline_entry(base_first, command="specbench compare")
    stored = compare_entry(head_first, entry, confidence=confidence)
    keep = [c for c in stored.checks if c.name.split("[")[0] not in SPEED_METRICS]
    report = GateReport(case_id, stored.hardware_class, checks=keep + speed_checks(
        case_id, pairs, tolerances=tolerances, confidence=confidence), baseline_path=against, has_baseline=True)
    for side, index in (("base", 0), ("head", 1)):
        drifting = [name for name in QUALITY_METRICS if len({repr(p[index]["metrics"].get(name)) for p in pairs}) > 1]
        if drifting:
            report.notes.append(f"the {side}'s {', '.join(drifting)} differ between rounds (nondeterministic "
                                "decoding): quality is gated on the first round's")
    return report


def check_change(check: MetricCheck) -> float:
    """An A/B check's paired change (head/base - 1): the interval's centre in log space, as paired_change gives it."""
    low, high = (value / check.baseline for value in check.ci)
    return math.sqrt(low * high) - 1


HEADLINE_METRICS = ("tokens_per_s", "throughput_tokens_per_s", "step_latency_s")


def headline_check(report: GateReport) -> MetricCheck | None:
    """The check a one-row summary shows: among the failing speed checks if any (else all of them), tokens/s,
    throughput or T(1) in that order, else the one that moved most."""
    speed = [c for c in report.checks if c.name in SPEED_METRICS and c.baseline is not None]
    shown = [c for c in speed if c.failed] or speed
    for name in HEADLINE_METRICS:
        check = next((c for c in shown if c.name == name), None)
        if check is not None:
            return check
    return max(shown, key=lambda c: abs(check_change(c)), default=None)
