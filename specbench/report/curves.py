"""The dashboard's batch-size curves: per curve and hardware class, batch speedup and throughput against B, the
latest measured points beside the baseline file's points for that class."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from markupsafe import Markup

from specbench.gating.baselines import BaselineError, BaselineStore
from specbench.gating.curves import curve_name, point_batch_size
from specbench.report.svg import Line, line_chart

CURVE_METRICS = ("batch_speedup", "throughput_tokens_per_s")
# in words, and the batch speedup with its definition: it is not the status table's speedup (mean per-request
# tokens/s over plain's), so a batch case's two differ (docs/metrics.md#batching)
CURVE_LABELS = {"batch_speedup": "batch speedup (throughput ÷ plain throughput)",
                "throughput_tokens_per_s": "throughput (tokens/s)"}
AXIS_LABELS = {"batch_speedup": "batch speedup", "throughput_tokens_per_s": "throughput (tokens/s)"}
MEASURED_COLOR, BASELINE_COLOR = "#1f77b4", "#000000"


def _finite(value):
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


@dataclass
class Curve:
    """One curve on one hardware class: per series ("measured", "baseline") and metric, {B: value}."""

    case_id: str
    hardware_class: str
    series: dict[str, dict[str, dict[int, float | None]]] = field(default_factory=dict)
    charts: list[Markup] = field(default_factory=list)

    @property
    def batch_sizes(self) -> list[int]:
        return sorted({b for by_metric in self.series.values() for values in by_metric.values() for b in values})

    def to_dict(self) -> dict:
        """What the page embeds in ``data-series``: per series and metric, ``[[B, value], ...]`` by B."""
        return {name: {metric: [[b, v] for b, v in sorted(values.items())] for metric, values in by_metric.items()}
                for name, by_metric in self.series.items()}


def _baseline_metrics(store: BaselineStore | None, case_id: str, hardware_class: str) -> dict | None:
    """The speed metrics stored for a point on ``hardware_class``; None without a store, entry or class."""
    if store is None:
        return None
    try:
        entry = store.entry(case_id)
    except BaselineError:  # the status table reports a broken baseline file; the curve just lacks its series
        return None
    speed = ((entry or {}).get("speed") or {}).get(hardware_class)
    return speed["metrics"] if speed else None


def batch_curves(history, store: BaselineStore | None) -> list[Curve]:
    """A Curve per (curve id, hardware class) whose latest runs hold two batch sizes or more, sorted by both."""
    if history.empty or "batch_size" not in history:
        return []
    latest = history.groupby(["case_id", "hardware_class"], sort=True).tail(1)
    grouped: dict[tuple[str, str], Curve] = {}
    for _, row in latest.iterrows():
        size = _finite(row["batch_size"])
        if size is None or point_batch_size(row["case_id"]) is None:
            continue
        key = (curve_name(row["case_id"]), row["hardware_class"])
        curve = grouped.setdefault(key, Curve(*key, {"measured": {m: {} for m in CURVE_METRICS},
                                                     "baseline": {m: {} for m in CURVE_METRICS}}))
        stored = _baseline_metrics(store, row["case_id"], row["hardware_class"]) or {}
        for metric in CURVE_METRICS:
            curve.series["measured"][metric][int(size)] = _finite(row.get(metric))
            if _finite(stored.get(metric)) is not None:
                curve.series["baseline"][metric][int(size)] = _finite(stored.get(metric))
    curves = [grouped[key] for key in sorted(grouped) if len(grouped[key].batch_sizes) >= 2]
    for curve in curves:
        curve.charts = [curve_chart(curve, metric) for metric in CURVE_METRICS]
    return curves


def _line(curve: Curve, name: str, metric: str, color: str, dashed: bool) -> Line:
    x_of = {b: i for i, b in enumerate(curve.batch_sizes)}
    values = [(b, v) for b, v in sorted(curve.series[name][metric].items()) if v is not None]
    return Line(name, color, [(x_of[b], v, f"{name} B={b}: {v:.4g}") for b, v in values],
                [(x_of[b], v) for b, v in values], dashed=dashed)


def curve_chart(curve: Curve, metric: str) -> Markup:
    """One metric of a curve against B (x: the batch sizes, evenly spaced), measured solid, baseline dashed."""
    lines = [_line(curve, "measured", metric, MEASURED_COLOR, dashed=False),
             _line(curve, "baseline", metric, BASELINE_COLOR, dashed=True)]
    return line_chart(f"{CURVE_LABELS[metric]} vs batch size on {curve.hardware_class} (↑ better)",
                      [line for line in lines if line.points], x_labels=[f"B={b}" for b in curve.batch_sizes],
                      y_label=AXIS_LABELS[metric], y_floor=0.0, css_class="chart batch-curve")
