"""The status table: the latest run of each case on each hardware class, gated again against the baselines.

Each row holds metric, baseline, relative delta and gate status; the rows (and :func:`plural`, the counted
nouns of the summaries) are shared by the HTML, Markdown and JSON reports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from specbench.gating.baselines import BaselineError, BaselineStore, compare
from specbench.gating.history import result_from_row
from specbench.gating.launch_bound import launch_bound

STATUS_METRICS = ("acceptance_rate", "mean_acceptance_length", "tokens_per_s", "speedup")
METRIC_LABELS = {"acceptance_rate": "acceptance rate", "mean_acceptance_length": "MAL", "tokens_per_s": "tokens/s",
                 "speedup": "speedup", "time_to_first_token_s": "TTFT (s)", "per_token_latency_s": "s/token"}


@dataclass
class MetricStatus:
    name: str
    measured: float | None
    baseline: float | None
    status: str  # a gates status: pass, regression, improvement, no_baseline, skipped
    tolerance: float | None = None

    @property
    def delta(self) -> float | None:
        """measured / baseline - 1, None when either is undefined or the baseline is 0."""
        if self.measured is None or not self.baseline or not math.isfinite(self.measured) \
                or not math.isfinite(self.baseline):
            return None
        return self.measured / self.baseline - 1

    def to_dict(self) -> dict:
        return {"name": self.name, "measured": _finite(self.measured), "baseline": _finite(self.baseline),
                "delta": self.delta, "status": self.status, "tolerance": self.tolerance}


@dataclass
class StatusRow:
    """One case on one hardware class, latest run."""

    case_id: str
    hardware_class: str
    commit: str | None
    created_at: str
    status: str  # pass, improvement, regression, fail, no_baseline, error, recorded_pass, recorded_fail
    metrics: dict[str, MetricStatus] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    per_position: list[float] = field(default_factory=list)
    per_position_baseline: list[float] | None = None
    note: str = ""
    flags: list[str] = field(default_factory=list)  # the latest run's measurement problems (docs/metrics.md#step-costs)
    launch_bound: bool = False  # its speed measures the host, not the proposer (docs/metrics.md#launch-bound-cases)

    def to_dict(self) -> dict:
        return {"case": self.case_id, "hardware_class": self.hardware_class, "commit": self.commit,
                "created_at": self.created_at, "status": self.status, "failures": self.failures, "note": self.note,
                "flags": self.flags, "launch_bound": self.launch_bound,
                "metrics": {name: m.to_dict() for name, m in self.metrics.items()},
                "per_position_acceptance_rate": [_finite(v) for v in self.per_position],
                "per_position_baseline": None if self.per_position_baseline is None
                else [_finite(v) for v in self.per_position_baseline]}


def plural(count: int, singular: str, plural_form: str | None = None) -> str:
    """``count`` and the noun in the right number: "1 hardware class", "2 hardware classes", "0 runs"."""
    return f"{count} {singular if count == 1 else plural_form or singular + 's'}"


def _finite(value):
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def _overall(report) -> str:
    if not report.passed:
        return "regression" if any(c.status == "regression" for c in report.failures) else "fail"
    if not report.has_baseline:
        return "no_baseline"
    return "improvement" if report.improvements else "pass"


def status_rows(history, store: BaselineStore | None) -> list[StatusRow]:
    """One row per (case, hardware class), sorted by both; ``store`` None: the gate outcome recorded with the
    run is shown instead of a fresh comparison (and no baseline values)."""
    rows = []
    if history.empty:
        return rows
    for (case_id, hardware_class), runs in history.groupby(["case_id", "hardware_class"], sort=True):
        latest = runs.iloc[-1]
        result = result_from_row(latest)
        row = StatusRow(case_id, hardware_class, latest["git_commit"], latest["created_at"].isoformat(), "no_baseline",
                        per_position=list(latest["per_position_acceptance_rate"]),
                        flags=[flag.get("message", "") for flag in result.get("flags") or []],
                        launch_bound=launch_bound(result.get("case")))
        measured = {name: MetricStatus(name, _finite(result["metrics"].get(name)), None, "no_baseline")
                    for name in STATUS_METRICS}
        if store is None:
            recorded = latest["gate_passed"]
            if recorded is not None and recorded == recorded:  # None (or NaN) when the run was recorded ungated
                row.status = "recorded_pass" if recorded else "recorded_fail"
            row.failures = list(latest["gate_failures"])
            row.note = "gate outcome recorded with the run (no baseline directory given)"
        else:
            try:
                report = compare(result, store)
            except BaselineError as err:
                row.status, row.note = "error", str(err)
            else:
                row.status = _overall(report)
                row.failures = [c.message() for c in report.failures]
                names = {c.name: c for c in report.checks}
                for name in STATUS_METRICS:
                    if name in names:
                        c = names[name]
                        measured[name] = MetricStatus(name, _finite(c.measured), _finite(c.baseline), c.status,
                                                      c.tolerance)
                entry = store.entry(case_id)
                if entry is not None:
                    row.per_position_baseline = list(entry["quality"]["metrics"].get("per_position_acceptance_rate")
                                                     or [])
        row.metrics = measured
        rows.append(row)
    return rows
