"""Gates: judge a run result against its stored baseline, metric by metric, one-sided and noise-aware.

The rule, for a higher-is-better metric (mirrored for lower-is-better latencies):

    regression   iff  measured < baseline * (1 - tolerance)  and  upper end of the CI < baseline
    improvement  iff  measured > baseline * (1 + tolerance)  and  lower end of the CI > baseline
    pass         otherwise

Why both conditions: the tolerance is the smallest change that matters; the confidence interval says
whether a change is larger than what other prompts or other sampling draws would produce. A tolerance
alone fails on noise when a case has few requests (the flaky single-number thresholds of vLLM #30367,
#37477); an interval alone fails on tiny, meaningless drops once a case has many requests. Improvements
never fail (vLLM #32030): they pass with "consider regenerating the baseline".

The interval is a percentile bootstrap over requests (2,000 resamples, seeded: same input, same verdict),
resampling whole requests because tokens within one request are not independent. Every gated metric is
a ratio estimator ``offset + sum(num) / sum(den)`` over requests: acceptance_rate = accepted / draft
tokens, MAL = 1 + accepted / drafts, per-position i = accepted at i / drafts, tokens_per_s = tok/s / 1,
speedup = tok/s / plain tok/s, latencies = seconds / 1. The baseline stores its per-request values too,
so the interval is of the difference measured - baseline: resampled *paired* by prompt_id when both runs
used the same prompts (prompt difficulty cancels, so an unchanged deterministic run has a zero-width
interval and a uniform drop a tight one), independently otherwise. The interval reported is
baseline + that difference interval: centred on the measured value, and "its upper end is below the
baseline" is exactly "the difference is significantly negative". With fewer than two requests there is
no interval and the tolerance alone decides (greedy fp32 runs are deterministic, so that is sound there).

Confidence is 99%, not 95%: when noise is as large as the tolerance, a false alarm needs the measured
value beyond the interval's far end, probability (1 - confidence) / 2 per check: 2.5% at 95%, which a
suite with a few dozen noisy checks (sampling cases, timings) turns into a red run about every other
run; 0.5% at 99%. A real 30% drop sits far outside either interval, so the wider one costs little power.

Speed is gated only against a baseline of the same ``env.hardware_class``; quality everywhere. Lossless
correctness: a checked fp32 run must be exact (any divergence fails, naming request and position); in
bf16/fp16 batching k tokens changes rounding (Medusa #56), so the match fraction is gated by a minimum.
"""

from __future__ import annotations

import math

from specbench.gating.clocks import clock_difference
from specbench.gating.verdicts import (  # noqa: F401 - re-exported: the verdict types are part of this API
    CORRECTNESS_CHECKS, CPU_SPEED_NOT_GATED, FAILING_STATUSES, HIGHER_IS_BETTER, LOWER_IS_BETTER, NOT_MEASURED, NOTEWORTHY_STATUSES, STATUSES, GateReport, MetricCheck, _fmt, skip_summary,
)
from specbench.gating.intervals import (DEFAULT_CONFIDENCE, DEFAULT_NUM_RESAMPLES, REPEAT_LEVEL_METRICS, bootstrap_interval,
                                        first_repeat)


QUALITY_METRICS = ("acceptance_rate", "mean_acceptance_length", "per_position_acceptance_rate")
# absolute timings follow the host on a launch-bound case; same-run ratios do not (docs/metrics.md#gates)
ABSOLUTE_SPEED_METRICS = ("tokens_per_s", "time_to_first_token_s", "per_token_latency_s", "step_latency_s",
                          "throughput_tokens_per_s")
RATIO_METRICS = ("speedup", "decode_speedup", "verify_cost_ratio", "draft_cost_ratio", "batch_speedup")
# measured only by a point of a batch-size curve (a case with batch_size: docs/batching.md)
BATCH_SPEED_METRICS = ("batch_speedup", "throughput_tokens_per_s")
SPEED_METRICS = ("tokens_per_s", "speedup", "time_to_first_token_s", "per_token_latency_s", "decode_speedup",
                 "verify_cost_ratio", "draft_cost_ratio", "step_latency_s", *BATCH_SPEED_METRICS)
DIRECTIONS = {
    **dict.fromkeys(("acceptance_rate", "mean_acceptance_length", "per_position_acceptance_rate", "tokens_per_s",
                     "speedup", "decode_speedup", *BATCH_SPEED_METRICS), HIGHER_IS_BETTER),
    **dict.fromkeys(("time_to_first_token_s", "per_token_latency_s", "verify_cost_ratio", "draft_cost_ratio",
                     "step_latency_s"), LOWER_IS_BETTER),
}
DEFAULT_TOLERANCES = {  # relative, overridable per case in the baseline file
    # vLLM's per-position acceptance tolerance for its EAGLE-3 baselines (docs/metrics.md#gates)
    "acceptance_rate": 0.05, "mean_acceptance_length": 0.05, "per_position_acceptance_rate": 0.05,
    # spec and plain are timed in the same run on the same machine: clock, thermal and co-tenant drift
    # cancel to first order, scheduling jitter remains
    "speedup": 0.10, "decode_speedup": 0.10, "batch_speedup": 0.10,
    # step costs timed back to back in one process: T(K+1)/T(1) and draft/T(1)
    "verify_cost_ratio": 0.10, "draft_cost_ratio": 0.10,
    # absolute timings move with GPU clocks, driver and co-tenants between runs on one hardware class
    "tokens_per_s": 0.15, "per_token_latency_s": 0.15, "throughput_tokens_per_s": 0.15,
    # T(1), one plain verify timed with the device synchronised: the GPU's step without the decode loop's host
    # work, which moves tok/s more than the GPU does (docs/metrics.md#gates)
    "step_latency_s": 0.10,
    # one prefill per request averages fewer timings and carries one-off costs (allocator growth, lazy init)
    "time_to_first_token_s": 0.20,
    # bf16/fp16 rounding drift diverges somewhere in a long output; a broken verification path diverges
    # at the first draft and scores near 0
    "min_match_fraction": 0.5,
}
LOW_PRECISION_DTYPES = ("bfloat16", "bf16", "float16", "fp16", "half")

def resolve_tolerances(*overrides: dict | None) -> dict:
    """Defaults updated by each override in turn; unknown names or bad values raise ValueError."""
    out = dict(DEFAULT_TOLERANCES)
    for layer in overrides:
        for name, value in (layer or {}).items():
            if name not in DEFAULT_TOLERANCES:
                raise ValueError(f"unknown tolerance {name!r}; expected one of {sorted(DEFAULT_TOLERANCES)}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value:
                raise ValueError(f"tolerance {name!r} must be a number >= 0 (a relative fraction), found {value!r}")
            if name == "min_match_fraction" and value > 1:
                raise ValueError(f"tolerance 'min_match_fraction' must be within [0, 1], found {value!r}")
            out[name] = float(value)
    return out


def judge(direction: str, baseline: float | None, measured: float | None, tolerance: float,
          ci: tuple[float, float] | None) -> tuple[str, str]:
    """(status, reason) by the rule in the module docstring."""
    if baseline is None or not math.isfinite(baseline):
        return "skipped", "the baseline holds no value (undefined when it was recorded)"
    if measured is None or not math.isfinite(measured):
        return "regression", "measured value is undefined (nothing was drafted in this run)"
    higher = direction == HIGHER_IS_BETTER
    below, above = measured < baseline * (1 - tolerance), measured > baseline * (1 + tolerance)
    ci_below = ci is None or ci[1] < baseline
    ci_above = ci is None or ci[0] > baseline
    worse, ci_worse = (below, ci_below) if higher else (above, ci_above)
    better, ci_better = (above, ci_above) if higher else (below, ci_below)
    if worse and ci_worse:
        return "regression", ""
    if better and ci_better:
        return "improvement", ""
    if worse or better:
        return "pass", "beyond the tolerance but within noise: the CI reaches the baseline"
    return "pass", ""


def is_low_precision(result: dict) -> bool:
    dtype = (result.get("case") or {}).get("dtype") or (result.get("env") or {}).get("dtype") or "float32"
    return str(dtype).lower().removeprefix("torch.") in LOW_PRECISION_DTYPES


def check_correctness(result: dict, min_match_fraction: float) -> MetricCheck:
    """fp32: ``exact_match`` must hold; bf16/fp16: ``match_fraction`` >= ``min_match_fraction``."""
    corr, low = result.get("correctness") or {}, is_low_precision(result)
    match_fraction = corr.get("match_fraction")
    measured = match_fraction if match_fraction is not None else math.nan
    required = min_match_fraction if low else 1.0
    verdict = lambda status, reason: MetricCheck("match_fraction" if low else "exact_match",  # noqa: E731
                                                 HIGHER_IS_BETTER, required, measured, None, status, reason)
    if not corr.get("checked"):
        return verdict("skipped", "outputs not checked against plain decoding (lossy rule or sampling)")
    if corr.get("exact"):
        return verdict("pass", "every request identical to plain decoding")
    requests = result.get("requests") or []
    diverged = [(i, pos) for i, pos in enumerate(corr.get("first_divergence") or []) if pos is not None]
    where = "outputs differ (no per-request divergence positions recorded)"
    if diverged:
        i, pos = diverged[0]
        prompt_id = requests[i].get("prompt_id", i) if i < len(requests) else i
        where = (f"request {prompt_id!r} (#{i}) first diverges at output position {pos}; "
                 f"{len(diverged)} of {len(corr['first_divergence'])} requests diverge")
    if not low:
        return verdict("fail", f"fp32 speculative output differs from plain decoding: {where}")
    minimum = f"the minimum {_fmt(min_match_fraction)} (tolerance 'min_match_fraction'); {where}"
    if not math.isfinite(measured) or measured < min_match_fraction:
        return verdict("fail", f"match fraction {_fmt(measured)} is under {minimum}")
    return verdict("pass", f"at or above {minimum}")


def check_conformance(result: dict) -> MetricCheck | None:
    """An engine under test's conformance verdict (docs/conformance.md), gated like the lossless check: greedy
    outputs and, where both engines implement the same rule, counters must equal the reference engine's. None for
    a result of specbench's own engines."""
    conformance = (result.get("correctness") or {}).get("conformance")
    if conformance is None:
        return None
    status = "skipped" if not conformance.get("checked") else "pass" if conformance.get("exact") else "fail"
    check = MetricCheck("conformance", HIGHER_IS_BETTER, 1.0, 1.0 if conformance.get("exact") else 0.0, None, status,
                        f"{conformance['engine']} vs specbench's {conformance['reference_engine']} engine: "
                        f"{conformance['reason']}")
    check.case_id = result.get("case_id", "")
    return check


RATIOS_ONLY = ("absolute timings of a launch-bound case follow the host CPU; gated on GPU-bound cases only "
               "(gate_speed = \"ratios\" gates this case's same-run ratios)")


def _gate_speed(case: dict, hardware_class: str | None, name: str) -> bool:
    """``gate_speed`` true/false/"ratios" from the case; unset (None) gates speed on GPUs only."""
    setting = case.get("gate_speed")
    if setting == "ratios":
        return name in RATIO_METRICS
    return hardware_class != "cpu" if setting is None else bool(setting)


def _measured(metrics: dict, name: str, position: int | None) -> float:
    value = metrics.get(name)
    if position is not None:
        rates = value or []
        if position < len(rates):
            value = rates[position]
        else:  # the run never drafted that deep: rate 0 if it drafted at all
            value = 0.0 if metrics.get("num_drafts") else None
    return math.nan if value is None else float(value)


def compare_entry(result: dict, entry: dict | None, *, tolerances: dict | None = None,
                  confidence: float = DEFAULT_CONFIDENCE, num_resamples: int = DEFAULT_NUM_RESAMPLES,
                  seed: int = 0, baseline_path: str | None = None,
                  quality_from: tuple[str, dict | None] | None = None) -> GateReport:
    """Gate ``result`` against one stored case entry (``None``: no baseline); see specbench.gating.baselines.compare.

    Tolerances: defaults, then the entry's ``tolerances``, the case's ``tolerances``, the argument.
    ``quality_from``: (case id, entry) whose quality section replaces the entry's (the case's quality_baseline).
    """
    case = result.get("case") or {}
    case_id = result.get("case_id") or f"{case.get('suite')}/{case.get('name')}"
    hardware_class = (result.get("env") or {}).get("hardware_class")
    try:
        tol = resolve_tolerances((entry or {}).get("tolerances"), case.get("tolerances"), tolerances)
    except ValueError as err:  # the stored layer is checked on load, so the case's table is the suspect
        raise ValueError(f"{case_id}: {err}; fix the case's 'tolerances' table") from None
    metrics, requests = result.get("metrics") or {}, result.get("requests") or []
    report = GateReport(case_id, hardware_class, baseline_path=baseline_path, has_baseline=entry is not None)

    def gate(name, position, base_metrics, base_requests, missing_reason=None, missing_status="no_baseline"):
        label = name if position is None else f"{name}[{position}]"
        direction, measured = DIRECTIONS[name], _measured(metrics, name, position)
        check = MetricCheck(label, direction, None, measured, tol[name], missing_status,
                            confidence=confidence, case_id=case_id)
        if base_metrics is None:
            check.reason = missing_reason or ""
        elif name in SPEED_METRICS and not math.isfinite(measured):
            check.status, check.reason = "skipped", NOT_MEASURED
        elif name in SPEED_METRICS and not _gate_speed(case, hardware_class, name):
            check.baseline = _measured(base_metrics, name, position)
            check.status, check.reason = "skipped", (
                RATIOS_ONLY if case.get("gate_speed") == "ratios" else CPU_SPEED_NOT_GATED if hardware_class == "cpu"
                else "speed gating is off for this case (gate_speed = false)")
        elif name in QUALITY_METRICS and case.get("gate_quality") is False:
            check.baseline = _measured(base_metrics, name, position)
            check.status, check.reason = "skipped", "quality gating is off for this case (gate_quality = false)"
        else:
            check.baseline = _measured(base_metrics, name, position)
            if math.isfinite(check.baseline):
                rows = (result.get("repeats") or []) if name in REPEAT_LEVEL_METRICS else (
                    requests if name in SPEED_METRICS else first_repeat(requests))
                check.ci = bootstrap_interval(rows, base_requests, check.baseline, name, position=position,
                                              confidence=confidence, num_resamples=num_resamples, seed=seed)
            check.status, check.reason = judge(direction, check.baseline, measured, tol[name], check.ci)
        report.checks.append(check)

    no_entry = f"no baseline stored for {case_id}" + (f" in {baseline_path}" if baseline_path else "")
    quality = (entry or {}).get("quality")
    no_quality = no_entry
    if quality_from is not None:
        reference_id, reference_entry = quality_from
        quality = (reference_entry or {}).get("quality")
        no_quality = (f"no baseline stored for {reference_id}, the quality baseline of {case_id}"
                      + (f", in {baseline_path}" if baseline_path else ""))
        report.quality_baseline = reference_id
    base_quality = quality["metrics"] if quality else None
    for name in ("acceptance_rate", "mean_acceptance_length"):
        gate(name, None, base_quality, quality and quality["requests"], no_quality)
    num_positions = max(len(metrics.get("per_position_acceptance_rate") or []),
                        len((base_quality or {}).get("per_position_acceptance_rate") or []))
    for i in range(num_positions):
        gate("per_position_acceptance_rate", i, base_quality, quality and quality["requests"], no_quality)

    speed_by_class = (entry or {}).get("speed") or {}
    speed = speed_by_class.get(hardware_class) if hardware_class else None
    # a batch point's metrics are checks of batch points only: an unbatched run has nothing to say about them
    batch_point = metrics.get("batch_size") is not None or case.get("batch_size") is not None
    for name in (n for n in SPEED_METRICS if batch_point or n not in BATCH_SPEED_METRICS):
        if entry is None:
            gate(name, None, None, None, no_entry)
        elif speed is None:
            have = ", ".join(sorted(speed_by_class)) or "none"
            why = (f"no baseline for hardware class {hardware_class} (have: {have})" if hardware_class
                   else "the result has no env.hardware_class")
            gate(name, None, None, None, why, missing_status="skipped")
        else:
            base_rows = (speed.get("repeats") or []) if name in REPEAT_LEVEL_METRICS else speed["requests"]
            gate(name, None, speed["metrics"], base_rows)
    if speed is not None:
        clocks = clock_difference(result.get("env") or {}, (speed.get("provenance") or {}).get("env") or {})
        if clocks:
            report.notes.append(f"{case_id}: {clocks}")

    correctness = check_correctness(result, tol["min_match_fraction"])
    correctness.case_id, correctness.confidence = case_id, confidence
    report.checks.append(correctness)
    report.checks.extend(filter(None, [check_conformance(result)]))
    return report
