"""Verdicts: one metric's check (MetricCheck) and one case's report (GateReport), with their one-line messages.

specbench.gating.gates makes them (the rule is in its docstring); the CLI, pytest plugin and dashboard print them.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field

from specbench.gating.intervals import DEFAULT_CONFIDENCE

HIGHER_IS_BETTER = "higher_is_better"
LOWER_IS_BETTER = "lower_is_better"

STATUSES = ("pass", "regression", "improvement", "no_baseline", "skipped", "fail")
# "fail" is for absolute requirements (lossless correctness) that need no baseline
FAILING_STATUSES = ("regression", "fail")
# what a brief report still shows line by line; the other statuses are counted by skip_summary
NOTEWORTHY_STATUSES = ("regression", "fail", "improvement")
CPU_SPEED_NOT_GATED = ("CPU timings on shared machines are too noisy to gate; reported only "
                       "(set gate_speed = true in the case to gate)")
CORRECTNESS_CHECKS = ("exact_match", "match_fraction")
NOT_MEASURED = "not measured in this run"



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
                + self._where()
                + (f" (quality against {self.quality_baseline})" if self.quality_baseline else ""))

    def _where(self) -> str:
        """The baseline file: what it was gated against, or the file that holds no baseline for the case; never
        a file that does not exist (an explicit or overridden case has none)."""
        if not self.baseline_path:
            return ""
        if self.has_baseline:
            return f" against {self.baseline_path}"
        return f" (none stored for it in {self.baseline_path})" if os.path.exists(self.baseline_path) else ""

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
            paths = sorted({report.baseline_path for report, _ in items
                            if report.baseline_path and os.path.exists(report.baseline_path)})
            where = f" in {paths[0]}" if len(paths) == 1 else ""
            lines.append(f"no baseline for {cases} ({_plural(len(items), 'metric')}){where}")
        else:
            lines.append(f"{_plural(len(items), 'check')} of {cases} skipped")
    return lines
