"""The compact Markdown summary for CI job pages (``specbench report --format markdown >> $GITHUB_STEP_SUMMARY``):
flagged regressions first, then the latest run of each case against its baseline.
"""

from __future__ import annotations

import math

from specbench.report.changes import WINDOW, Regression
from specbench.report.status import METRIC_LABELS, STATUS_METRICS, StatusRow

FAILING = ("regression", "fail", "error", "recorded_fail")


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _num(value, digits: int = 3) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _metric_cell(m, digits: int) -> str:
    text = _num(m.measured, digits)
    if m.delta is not None:
        text += f" ({m.delta * 100:+.1f}%)"
    return f"**{text} regression**" if m.status == "regression" else text


def render_markdown(history, regressions: list[Regression], status: list[StatusRow]) -> str:
    classes = sorted(history["hardware_class"].unique()) if not history.empty else []
    failing = [row for row in status if row.status in FAILING]
    lines = [
        "## specbench report",
        "",
        f"{len(history)} runs of {history['case_id'].nunique()} cases on {len(classes)} hardware "
        f"classes ({', '.join(classes) or 'none'}): **{len(regressions)} step regressions** over the history, "
        f"**{len(failing)} of {len(status)}** latest runs failing their gates.",
        "",
        "### Regressions flagged over the history",
        "",
    ]
    if regressions:
        lines += ["| case | metric | hardware class | commit | before | after | change | tolerance |",
                  "|---|---|---|---|---:|---:|---:|---:|"]
        lines += [f"| {_cell(r.case_id)} | {r.metric} | {_cell(r.hardware_class)} | `{_cell(r.commit)}` | "
                  f"{r.before:.4g} | {r.after:.4g} | {r.relative_change * 100:+.1f}% | {r.tolerance * 100:g}% |"
                  for r in regressions]
    else:
        lines.append("None.")
    lines += ["", f"<sub>Step-change rule: median of up to {WINDOW} runs from a commit on vs the runs before, worse "
              "than the gate tolerance and than 3σ of run-to-run noise (specbench.report.changes).</sub>", "",
              "### Latest run per case vs baseline", "",
              "| case | hardware class | commit | " + " | ".join(METRIC_LABELS[m] for m in STATUS_METRICS)
              + " | gate |",
              "|---|---|---|" + "---:|" * len(STATUS_METRICS) + "---|"]
    for row in status:
        cells = [_metric_cell(row.metrics[m], 1 if m == "tokens_per_s" else 3) for m in STATUS_METRICS]
        gate = row.status.replace("_", " ")
        commit = f"`{_cell(row.commit[:10])}`" if row.commit else "–"
        lines.append(f"| {_cell(row.case_id)} | {_cell(row.hardware_class)} | {commit} | "
                     + " | ".join(cells) + f" | {'**' + gate + '**' if row.status in FAILING else gate} |")
    failures = [f"- {_cell(row.hardware_class)}: {_cell(f)}" for row in status for f in row.failures]
    if failures:
        lines += ["", "<details><summary>Failing checks</summary>", "", *failures, "", "</details>"]
    return "\n".join(lines) + "\n"
