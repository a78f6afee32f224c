"""How stable a case's speed figures are over unchanged runs: their spread, and every run gated against every other.

A trial that gates N unchanged runs against the first one answers for one choice of baseline; a baseline recorded
on a fast run makes every slower later run look like a regression, so the first-run answer can be lucky. Gating
each run against each other run (N (N - 1) ordered pairs) answers for any baseline the regeneration command might
have stored (docs/metrics.md#gates). ``metric_spread`` says how far each metric moves between runs, the figure a
tolerance has to exceed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from specbench.gating.gates import compare_entry
from specbench.gating.regenerate import baseline_entry


def metric_spread(results: Sequence[dict], names: Sequence[str]) -> dict[str, dict]:
    """Per metric over the runs: values, median, and the largest |value / median - 1| (``max_rel_dev``);
    (max - min) / median as ``range``. Metrics undefined in any run are left out."""
    out = {}
    for name in names:
        values = [(r.get("metrics") or {}).get(name) for r in results]
        if not values or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
            continue
        median = statistics.median(values)
        if not median:
            continue
        out[name] = {"values": values, "median": median,
                     "max_rel_dev": max(abs(v / median - 1) for v in values),
                     "range": (max(values) - min(values)) / abs(median)}
    return out


def pairwise_false_failures(results: Sequence[dict], *, num_resamples: int | None = None) -> dict:
    """Gate every unchanged run against a baseline made of every other one.

    Returns ``pairs`` (ordered pairs gated), ``failing_pairs``, ``by_check`` (failing pairs per check name) and
    ``worst`` (the failing pair with the most failed checks: baseline run, measured run, checks), all runs being
    unchanged, so every failure is a false one.
    """
    entries = [baseline_entry(r, command="pairwise stability") for r in results]
    extra = {} if num_resamples is None else {"num_resamples": num_resamples}
    pairs = failing = 0
    by_check: dict[str, int] = {}
    worst = None
    for i, entry in enumerate(entries):
        for j, result in enumerate(results):
            if i == j:
                continue
            report = compare_entry(result, entry, **extra)
            pairs += 1
            if report.passed:
                continue
            failing += 1
            names = [c.name for c in report.failures]
            for name in names:
                by_check[name] = by_check.get(name, 0) + 1
            if worst is None or len(names) > len(worst["checks"]):
                worst = {"baseline_run": i, "measured_run": j, "checks": names}
    return {"pairs": pairs, "failing_pairs": failing, "by_check": by_check, "worst": worst}
