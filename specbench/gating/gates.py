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
from dataclasses import asdict, dataclass, field

from specbench.env import clock_difference
from specbench.gating.intervals import (DEFAULT_CONFIDENCE, DEFAULT_NUM_RESAMPLES, REPEAT_LEVEL_METRICS, bootstrap_interval,
                                        first_repeat)

HIGHER_IS_BETTER = "higher_is_better"
LOWER_IS_BETTER = "lower_is_better"

QUALITY_METRICS = ("acceptance_rate", "mean_acceptance_length", "per_position_acceptance_rate")
# absolute timings follow the host on a launch-bound case; same-run ratios do not (docs/metrics.md#gates)
ABSOLUTE_SPEED_METRICS = ("tokens_per_s", "time_to_first_token_s", "per_token_latency_s")
RATIO_METRICS = ("speedup", "decode_speedup", "verify_cost_ratio", "draft_cost_ratio")
SPEED_METRICS = ("tokens_per_s", "speedup", "time_to_first_token_s", "per_token_latency_s", "decode_speedup",
                 "verify_cost_ratio", "draft_cost_ratio")
DIRECTIONS = {
    **dict.fromkeys(("acceptance_rate", "mean_acceptance_length", "per_position_acceptance_rate", "tokens_per_s",
                     "speedup", "decode_speedup"), HIGHER_IS_BETTER),
    **dict.fromkeys(("time_to_first_token_s", "per_token_latency_s", "verify_cost_ratio", "draft_cost_ratio"),
                    LOWER_IS_BETTER),
}
DEFAULT_TOLERANCES = {  # relative, overridable per case in the baseline file
    # vLLM's per-position acceptance tolerance for its EAGLE-3 baselines (docs/metrics.md#gates)
    "acceptance_rate": 0.05, "mean_acceptance_length": 0.05, "per_position_acceptance_rate": 0.05,
    # spec and plain are timed in the same run on the same machine: clock, thermal and co-tenant drift
    # cancel to first order, scheduling jitter remains
    "speedup": 0.10, "decode_speedup": 0.10,
    # step costs timed back to back in one process: T(K+1)/T(1) and draft/T(1)
    "verify_cost_ratio": 0.10, "draft_cost_ratio": 0.10,
    # absolute timings move with GPU clocks, driver and co-tenants between runs on one hardware class
    "tokens_per_s": 0.15, "per_token_latency_s": 0.15,
    # one prefill per request averages fewer timings and carries one-off costs (allocator growth, lazy init)
    "time_to_first_token_s": 0.20,
    # bf16/fp16 rounding drift diverges somewhere in a long output; a broken verification path diverges
    # at the first draft and scores near 0
    "min_match_fraction": 0.5,
}
LOW_PRECISION_DTYPES = ("bfloat16", "bf16", "float16", "fp16", "half")

STATUSES = ("pass", "regression", "improvement", "no_baseline", "skipped", "fail")
# "fail" is for absolute requirements (lossless correctness) that need no baseline
FAILING_STATUSES = ("regression", "fail")
# what a brief report still shows line by line; the other statuses are counted by skip_summary
NOTEWORTHY_STATUSES = ("regression", "fail", "improvement")
CPU_SPEED_NOT_GATED = ("CPU timings on shared machines are too noisy to gate; reported only "
                       "(set gate_speed = true in the case to gate)")
CORRECTNESS_CHECKS = ("exact_match", "match_fraction")


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


def _fmt(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "undefined"
    return f"{x:.3g}" if abs(x) < 0.1 else f"{x:.3f}" if abs(x) < 1000 else f"{x:.1f}"


@dataclass
class MetricCheck:
    """The verdict on one gated metric (per-position rates are named ``per_position_acceptance_rate[i]``)."""

    name: str
    direction: str
    baseline: float | None
    measured: float | None
    tolerance: float | None
    status: str
    reason: str = ""
    ci: tuple[float, float] | None = None
    confidence: float = DEFAULT_CONFIDENCE
    case_id: str = ""

    @property
    def failed(self) -> bool:
        return self.status in FAILING_STATUSES

    def _detail(self) -> str:
        parts = [] if self.tolerance is None else [f"tolerance {self.tolerance * 100:g}%"]
        if self.ci is not None:
            parts.append(f"{self.confidence * 100:g}% CI [{_fmt(self.ci[0])}, {_fmt(self.ci[1])}]")
        elif self.tolerance is not None and self.status in ("pass", "regression", "improvement"):
            parts.append("no CI: fewer than 2 requests with per-request data")
        return f" ({', '.join(parts)})" if parts else ""

    def message(self) -> str:
        """One line, prefixed with the case id, naming metric, baseline, measured value and tolerance."""
        worse, better = ("<", ">") if self.direction == HIGHER_IS_BETTER else (">", "<")
        m, b = _fmt(self.measured), _fmt(self.baseline)
        if self.status == "regression":
            text = f"{self.name} regressed: measured {m} {worse} baseline {b}{self._detail()}"
        elif self.status == "improvement":
            text = (f"{self.name} improved: measured {m} {better} baseline {b}{self._detail()}; "
                    "consider regenerating the baseline")
        elif self.status == "pass":
            text = f"{self.name} ok: measured {m}, baseline {b}{self._detail()}"
        elif self.status == "no_baseline":
            text = f"{self.name}: no baseline (measured {m})"
        elif self.status == "skipped":
            text = f"{self.name} skipped"
        else:
            text = f"{self.name} failed"
        if self.reason:
            text += f": {self.reason}"
        return f"{self.case_id}: {text}" if self.case_id else text

    def to_dict(self) -> dict:
        out = asdict(self)
        out["ci"] = list(self.ci) if self.ci is not None else None
        out["message"] = self.message()
        return out


@dataclass
class GateReport:
    """All checks of one case; ``passed`` is False when any check regressed or failed."""

    case_id: str
    hardware_class: str | None
    checks: list[MetricCheck] = field(default_factory=list)
    baseline_path: str | None = None
    has_baseline: bool = False
    quality_baseline: str | None = None  # the case id whose quality baseline was used, when not the case's own
    notes: list[str] = field(default_factory=list)  # what qualifies the verdict (e.g. GPU clocks unlike the baseline's)

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def failures(self) -> list[MetricCheck]:
        return [c for c in self.checks if c.failed]

    @property
    def improvements(self) -> list[MetricCheck]:
        return [c for c in self.checks if c.status == "improvement"]

    def check(self, name: str) -> MetricCheck:
        """The check called ``name`` (KeyError listing the names when absent)."""
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(f"no check {name!r} in the report of {self.case_id}; have {[c.name for c in self.checks]}")

    @property
    def correctness(self) -> MetricCheck | None:
        """The lossless check (``exact_match`` in fp32, ``match_fraction`` in bf16/fp16), None if absent."""
        return next((c for c in self.checks if c.name in CORRECTNESS_CHECKS), None)

    def headline(self) -> str:
        """One line: case id, verdict, the count of each status, and the baseline it was gated against."""
        counts = {s: sum(c.status == s for c in self.checks) for s in STATUSES}
        summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        return (f"{self.case_id}: {'PASSED' if self.passed else 'FAILED'} ({summary or 'no checks'})"
                + (f" against {self.baseline_path}" if self.baseline_path else "")
                + (f" (quality against {self.quality_baseline})" if self.quality_baseline else ""))

    def format(self, *, only_problems: bool = False, brief: bool = False) -> str:
        """The headline and a line per check: every check, only those that did not pass (``only_problems``),
        or only regressions, failures and improvements (``brief``; :func:`skip_summary` counts the rest)."""
        lines = [self.headline()] + [f"  note: {note}" for note in self.notes]
        for c in self.checks:
            shown = c.status in NOTEWORTHY_STATUSES if brief else not only_problems or c.status != "pass"
            if shown:
                lines.append("  " + c.message())
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"case_id": self.case_id, "hardware_class": self.hardware_class, "passed": self.passed,
                "baseline_path": self.baseline_path, "has_baseline": self.has_baseline,
                "quality_baseline": self.quality_baseline, "notes": list(self.notes),
                "checks": [c.to_dict() for c in self.checks]}


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun if count == 1 else noun + 's'}"


def _skip_kind(check: MetricCheck) -> str | None:
    if check.status == "skipped" and check.reason == CPU_SPEED_NOT_GATED:
        return "cpu_speed"
    return check.status if check.status in ("no_baseline", "skipped") else None


def skip_summary(reports: list[GateReport]) -> list[str]:
    """One line per kind of check that a brief report leaves out, counting cases and checks: speed not gated
    on CPU, metrics without a baseline (naming the baseline file when there is one), other skips."""
    found: dict[str, list[tuple[GateReport, MetricCheck]]] = {"cpu_speed": [], "no_baseline": [], "skipped": []}
    for report in reports:
        for check in report.checks:
            kind = _skip_kind(check)
            if kind:
                found[kind].append((report, check))
    lines = []
    for kind, items in found.items():
        if not items:
            continue
        cases = _plural(len({report.case_id for report, _ in items}), "case")
        if kind == "cpu_speed":
            lines.append(f"speed not gated on CPU for {cases} ({_plural(len(items), 'metric')}): shared machines "
                         "are too noisy (set gate_speed = true in a case to gate it)")
        elif kind == "no_baseline":
            paths = sorted({report.baseline_path for report, _ in items if report.baseline_path})
            where = f" in {paths[0]}" if len(paths) == 1 else ""
            lines.append(f"no baseline for {cases} ({_plural(len(items), 'metric')}){where}")
        else:
            lines.append(f"{_plural(len(items), 'check')} of {cases} skipped")
    return lines


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
            check.status, check.reason = "skipped", "not measured in this run"
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
    for name in SPEED_METRICS:
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
    return report
