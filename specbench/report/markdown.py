"""The compact Markdown summary for CI job pages: flagged regressions, then the latest runs vs baseline.

``specbench report --format markdown >> $GITHUB_STEP_SUMMARY``. Job pages render the HTML inside Markdown,
so in text cells whatever would start a tag (``<`` before a letter, ``/``, ``!`` or ``?``) or an entity
(``&name;``) is escaped, and a case named ``<b>`` shows as written (``a < b`` stays readable); code spans are
literal in Markdown and only get their ``|`` escaped.
"""

from __future__ import annotations

import math
import re

from specbench.gating.launch_bound import LAUNCH_BOUND_METRICS, LAUNCH_BOUND_NOTE, LAUNCH_BOUND_WORDS
from specbench.report.changes import WINDOW, Regression
from specbench.report.status import METRIC_LABELS, STATUS_METRICS, StatusRow, plural

FAILING = ("regression", "fail", "error", "recorded_fail")
_MARKUP_START = re.compile(r"<(?=[A-Za-z/!?])|&(?=#?\w+;)")  # CommonMark's raw HTML and entity openings


def _cell(text) -> str:
    """A table cell or list item of plain text."""
    text = _MARKUP_START.sub(lambda m: "&lt;" if m.group() == "<" else "&amp;", str(text))
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text) -> str:
    """A code span (literal in Markdown: no entities, but a table still splits it at ``|``)."""
    return "`" + str(text).replace("`", "'").replace("|", "\\|").replace("\n", " ") + "`"


def _num(value, digits: int = 3) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


NOT_GATED = ("skipped", "no_baseline")  # a measured value beside which the gate column says nothing about it


def _metric_cell(m, digits: int) -> str:
    text = _num(m.measured, digits)
    if m.delta is not None:
        text += f" ({m.delta * 100:+.1f}%)"
    if m.status in NOT_GATED and m.measured is not None:
        return text + " (not gated)"  # the row's "pass" does not cover it: CPU speed, or no baseline
    return f"**{text} regression**" if m.status == "regression" else text


def render_empty(history_dir: str) -> str:
    """The summary of a history with no runs: one line that says so, so that a CI job page is not blank."""
    return (f"## specbench report\n\nNo runs recorded in {_code(history_dir)} yet: nothing was measured or "
            "gated. `specbench run` and `pytest suites/` record there.\n")


def render_markdown(history, regressions: list[Regression], status: list[StatusRow]) -> str:
    classes = sorted(history["hardware_class"].unique()) if not history.empty else []
    failing = [row for row in status if row.status in FAILING]
    latest = "latest run failing its gate" if len(status) == 1 else "latest runs failing their gates"
    lines = [
        "## specbench report",
        "",
        f"{plural(len(history), 'run')} of {plural(history['case_id'].nunique(), 'case')} on "
        f"{plural(len(classes), 'hardware class', 'hardware classes')} ({_cell(', '.join(classes)) or 'none'}): "
        f"**{plural(len(regressions), 'step regression')}** over the history, "
        f"**{len(failing)} of {len(status)}** {latest}.",
        "",
        "### Regressions flagged over the history",
        "",
    ]
    if regressions:
        lines += ["| case | metric | hardware class | commit | before | after | change | tolerance |",
                  "|---|---|---|---|---:|---:|---:|---:|"]
        lines += [f"| {_cell(r.case_id)} | {_cell(r.metric)} | {_cell(r.hardware_class)} | {_code(r.commit)} | "
                  f"{r.before:.4g} | {r.after:.4g} | {r.relative_change * 100:+.1f}% | {r.tolerance * 100:g}% |"
                  for r in regressions]
    else:
        lines.append("None.")
    lines += ["", f"<sub>Step-change rule: median of up to {WINDOW} runs from a commit on vs the runs before, worse "
              "than the gate tolerance and than 3σ of run-to-run noise (specbench.report.changes).</sub>", "",
              "### Latest run per case vs baseline", "",
              "| case | hardware class | commit | " + " | ".join(_cell(METRIC_LABELS[m]) for m in STATUS_METRICS)
              + " | gate |",
              "|---|---|---|" + "---:|" * len(STATUS_METRICS) + "---|"]
    for row in status:
        cells = [_metric_cell(row.metrics[m], 1 if m == "tokens_per_s" else 3)
                 + (f" ({LAUNCH_BOUND_WORDS})" if row.launch_bound and m in LAUNCH_BOUND_METRICS else "")
                 for m in STATUS_METRICS]
        gate = row.status.replace("_", " ")
        commit = _code(row.commit[:10]) if row.commit else "–"
        lines.append(f"| {_cell(row.case_id)} | {_cell(row.hardware_class)} | {commit} | "
                     + " | ".join(cells) + f" | {'**' + gate + '**' if row.status in FAILING else gate} |")
    if any(m.status in NOT_GATED and m.measured is not None for row in status for m in row.metrics.values()):
        lines += ["", "<sub>(not gated): measured, but the gate column does not cover it: speed on CPU (too noisy on "
                  "shared machines unless a case sets gate_speed = true) or a metric without a stored baseline."
                  "</sub>"]
    if any(row.launch_bound for row in status):
        lines += ["", f"<sub>{_cell(LAUNCH_BOUND_NOTE)}</sub>"]
    failures = [f"- {_cell(row.hardware_class)}: {_cell(f)}" for row in status for f in row.failures]
    if failures:
        lines += ["", "<details><summary>Failing checks</summary>", "", *failures, "", "</details>"]
    flags = [f"- {_cell(row.case_id)} ({_cell(row.hardware_class)}): {_cell(f)}" for row in status for f in row.flags]
    if flags:  # measurement problems (a prediction far off, compiles while timed): to look at (docs/metrics.md#step-costs)
        lines += ["", "<details><summary>Measurement flags</summary>", "", *flags, "", "</details>"]
    return "\n".join(lines) + "\n"
