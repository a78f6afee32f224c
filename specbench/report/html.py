"""The static HTML dashboard: one self-contained index.html (inline CSS and SVG, no script, no network) with
the flagged regressions, the status of each case against its baseline, trend plots per case split by
hardware class, per-position acceptance curves and the environment of each run.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from html import escape
from pathlib import Path

from specbench.atomic_write import write_text_atomic
from specbench.gating.gates import DIRECTIONS, HIGHER_IS_BETTER
from specbench.report.changes import WINDOW, Regression
from specbench.report.status import METRIC_LABELS, STATUS_METRICS, StatusRow
from specbench.report.svg import PALETTE, Line, line_chart

TREND_METRICS = ("acceptance_rate", "mean_acceptance_length", "speedup", "tokens_per_s")
SPLIT_METRICS = ("tokens_per_s",)  # one chart per hardware class
ENV_COLUMNS = ("hardware_class", "gpu_name", "driver_version", "cuda_version", "torch", "transformers", "python",
               "dtype", "platform")
MAX_ENV_ROWS = 300
STATUS_TEXT = {"pass": "pass", "improvement": "improved", "regression": "REGRESSION", "fail": "FAIL",
               "no_baseline": "no baseline", "skipped": "skipped", "error": "ERROR",
               "recorded_pass": "pass (recorded)", "recorded_fail": "FAIL (recorded)"}

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #222; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 32px; border-bottom: 1px solid #ddd; }
h3 { font-size: 15px; margin: 18px 0 6px; }
table { border-collapse: collapse; font-size: 11px; margin: 8px 0; }
th, td { border: 1px solid #ddd; padding: 2px 5px; text-align: right; white-space: nowrap; }
th { background: #f4f4f4; text-align: center; } .verdict { font-size: 9px; } td.text, th.text { text-align: left; }
.status-regression, .status-fail, .status-error, .status-recorded_fail { background: #fde2e2; color: #8b0000;
  font-weight: bold; }
.status-improvement { background: #e3f6e3; } .status-pass, .status-recorded_pass { background: #f3fbf3; }
.status-no_baseline, .status-skipped { color: #777; }
.charts { display: flex; flex-wrap: wrap; gap: 10px; } .charts svg { border: 1px solid #eee; }
.muted { color: #666; font-size: 12px; } .ok { color: #1a7f37; font-weight: bold; }
code { background: #f4f4f4; padding: 0 3px; }
"""


def _fmt(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value:.{digits}f}" if abs(value) < 1000 else f"{value:.0f}"


def _pct(value) -> str:
    return "–" if value is None else f"{value * 100:+.1f}%"


def _short(commit) -> str:
    return "(none)" if not commit else str(commit)[:10]


def commit_axis(runs) -> tuple[list[str], list[int]]:
    """Commit labels in order of first appearance and the x index of each run (runs without a commit get
    their own x, labelled by date)."""
    labels, index_of, xs = [], {}, []
    for commit, created_at in zip(runs["git_commit"], runs["created_at"]):
        key = commit or f"@{created_at.isoformat()}"
        if key not in index_of:
            index_of[key] = len(labels)
            labels.append(_short(commit) if commit else created_at.strftime("%m-%d %H:%M"))
        xs.append(index_of[key])
    return labels, xs


def regressions_section(regressions: list[Regression]) -> str:
    head = ('<h2 id="regressions">Regressions flagged over the history</h2><p class="muted">Step-change detector '
            f'(specbench.report.changes): per case × metric × hardware class, the median of up to {WINDOW} runs '
            'from a commit on is worse than the median of the runs before by more than the metric\'s gate tolerance '
            'and by more than 3σ of the run-to-run noise; improvements are not flagged.</p>')
    if not regressions:
        return head + '<p class="ok" id="no-regressions">No step regression in the history.</p>'
    rows = "".join(
        f'<tr class="regression" data-case="{escape(r.case_id)}" data-metric="{r.metric}" '
        f'data-hardware-class="{escape(r.hardware_class)}" data-commit="{escape(str(r.commit))}">'
        f'<td class="text">{escape(r.case_id)}</td><td class="text">{escape(METRIC_LABELS.get(r.metric, r.metric))}'
        f'</td><td class="text">{escape(r.hardware_class)}</td><td class="text"><code>{escape(_short(r.commit))}'
        f'</code></td><td class="text"><code>{escape(_short(r.previous_commit))}</code></td><td>{_fmt(r.before, 4)}'
        f'</td><td>{_fmt(r.after, 4)}</td><td class="status-regression">{_pct(r.relative_change)}</td>'
        f'<td>{r.tolerance * 100:g}%</td><td class="text">{escape(r.created_at[:19])}</td></tr>'
        for r in regressions)
    return (head + '<table id="regressions-table"><tr><th class="text">case</th><th class="text">metric</th>'
            '<th class="text">hardware class</th><th class="text">commit</th><th class="text">previous commit</th>'
            '<th>before (median)</th><th>after (median)</th><th>change</th><th>tolerance</th>'
            f'<th class="text">first run</th></tr>{rows}</table>')


def status_section(rows: list[StatusRow]) -> str:
    head = "".join(f'<th colspan="3">{escape(METRIC_LABELS[m])}</th>' for m in STATUS_METRICS)
    sub = "".join("<th>latest</th><th>baseline</th><th>Δ, gate</th>" for _ in STATUS_METRICS)
    body = []
    for row in rows:
        cells = []
        for name in STATUS_METRICS:
            m = row.metrics[name]
            digits = 1 if name == "tokens_per_s" else 3
            attrs = f'data-metric="{name}" data-status="{m.status}"'
            text = STATUS_TEXT.get(m.status, m.status)
            verdict = "" if m.status == "pass" else f'<br><span class="verdict">{text}</span>'
            cells.append(f'<td class="measured" {attrs}>{_fmt(m.measured, digits)}</td>'
                         f'<td class="baseline" {attrs}>{_fmt(m.baseline, digits)}</td>'
                         f'<td class="gate status-{m.status}" {attrs} title="{m.status}">{_pct(m.delta)}{verdict}</td>')
        failures = escape("\n".join(row.failures) or row.note)
        body.append(f'<tr class="status-row" data-case="{escape(row.case_id)}" '
                    f'data-hardware-class="{escape(row.hardware_class)}" data-status="{row.status}">'
                    f'<td class="text">{escape(row.case_id)}</td><td class="text">{escape(row.hardware_class)}</td>'
                    f'<td class="text" title="run of {escape(row.created_at[:16])}"><code>{escape(_short(row.commit))}'
                    f'</code></td>{"".join(cells)}'
                    f'<td class="overall status-{row.status}" title="{failures}">'
                    f'{STATUS_TEXT.get(row.status, row.status)}</td></tr>')
    return ('<h2 id="status">Latest run per case and hardware class vs baseline</h2><p class="muted">Gated again '
            'against the stored baselines with specbench.gating.gates (tolerance and bootstrap CI; speed only against a '
            'baseline of the same hardware class). Hover the overall status for the failing checks.</p>'
            '<table id="status-table"><tr><th class="text" rowspan="2">case</th><th class="text" rowspan="2">'
            'hardware class</th><th class="text" rowspan="2">commit</th>'
            f'{head}<th rowspan="2">overall</th></tr><tr>{sub}</tr>{"".join(body)}</table>')


def case_charts(case_id: str, runs, regressions: list[Regression], status: list[StatusRow], colors: dict) -> str:
    labels, xs = commit_axis(runs)
    runs = runs.assign(_x=xs)
    x_of_commit = dict(zip(runs["git_commit"], xs))
    charts = []
    for metric in TREND_METRICS:
        # tokens/s differ by an order of magnitude between CPU and GPU: one chart per class keeps each readable
        panels = ([[hw] for hw in sorted(runs["hardware_class"].unique())] if metric in SPLIT_METRICS
                  else [sorted(runs["hardware_class"].unique())])
        for classes in panels:
            lines = []
            for hardware_class in classes:
                group = runs[runs["hardware_class"] == hardware_class]
                values = group[metric].to_numpy(dtype=float)
                points = [(x, y, f"{hardware_class} @ {_short(c)}: {y:.4g}")
                          for x, y, c in zip(group["_x"], values, group["git_commit"]) if math.isfinite(y)]
                medians = group.assign(_v=values).dropna(subset=["_v"]).groupby("_x")["_v"].median()
                lines.append(Line(hardware_class, colors[hardware_class], points, list(medians.items())))
            markers = [(x_of_commit.get(r.commit, 0), f"{r.hardware_class}: {r.message()}") for r in regressions
                       if r.case_id == case_id and r.metric == metric and r.hardware_class in classes]
            arrow = "↑" if DIRECTIONS[metric] == HIGHER_IS_BETTER else "↓"
            where = f" on {classes[0]}" if metric in SPLIT_METRICS else ""
            charts.append(line_chart(f"{METRIC_LABELS[metric]}{where} ({arrow} better)", lines, x_labels=labels,
                                     y_label=metric, markers=markers, css_class="chart trend"))
    curves = []
    for row in status:
        if row.case_id != case_id:
            continue
        color = colors[row.hardware_class]
        curves.append(Line(f"{row.hardware_class} latest", color,
                           [(i, v, f"{row.hardware_class} position {i}: {v:.3f}")
                            for i, v in enumerate(row.per_position)],
                           list(enumerate(row.per_position))))
    baseline = next((r.per_position_baseline for r in status if r.case_id == case_id and r.per_position_baseline), None)
    if baseline:
        curves.append(Line("baseline", "#000000", [(i, v, f"baseline position {i}: {v:.3f}")
                                                   for i, v in enumerate(baseline)], list(enumerate(baseline)),
                           dashed=True))
    depth = max([len(c.path) for c in curves] or [0])
    charts.append(line_chart("per-position acceptance (latest vs baseline)", curves,
                             x_labels=[f"pos {i}" for i in range(depth)], y_label="rate",
                             css_class="chart per-position"))
    anchor = "case-" + "".join(ch if ch.isalnum() else "-" for ch in case_id)
    return (f'<h3 id="{escape(anchor)}">{escape(case_id)} <span class="muted">({len(runs)} runs, {len(labels)} '
            f'commits)</span></h3><div class="charts" data-case="{escape(case_id)}">{"".join(charts)}</div>')


def environment_section(history) -> str:
    recent = history.iloc[::-1].head(MAX_ENV_ROWS)
    head = "".join(f'<th class="text">{c}</th>' for c in ("run", "case", "commit", *ENV_COLUMNS, "gate"))
    body = []
    for _, run in recent.iterrows():
        env = run["env"] or {}
        commit = _short(run["git_commit"]) + (" (dirty)" if run["git_dirty"] else "")
        gate = {True: "pass", False: "FAIL"}.get(run["gate_passed"], "–")
        cells = [run["created_at"].strftime("%Y-%m-%d %H:%M:%S"), run["case_id"], commit,
                 *[("–" if env.get(c) is None else str(env.get(c))) for c in ENV_COLUMNS], gate]
        cells[3] = run["hardware_class"]
        body.append("<tr>" + "".join(f'<td class="text">{escape(str(c))}</td>' for c in cells) + "</tr>")
    more = (f'<p class="muted">The latest {MAX_ENV_ROWS} of {len(history)} runs.</p>'
            if len(history) > MAX_ENV_ROWS else "")
    return (f'<h2 id="environments">Environment of each run</h2>{more}<table id="environment-table"><tr>{head}</tr>'
            f'{"".join(body)}</table>')


def render_html(history, regressions: list[Regression], status: list[StatusRow], *, source: str = "") -> str:
    """The whole page as text."""
    classes = sorted(history["hardware_class"].unique()) if not history.empty else []
    colors = {hw: PALETTE[i % len(PALETTE)] for i, hw in enumerate(classes)}
    trends = "".join(case_charts(case_id, runs, regressions, status, colors)
                     for case_id, runs in history.groupby("case_id", sort=True))
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    commits = history["git_commit"].dropna().nunique() if not history.empty else 0
    summary = (f'{len(history)} runs of {history["case_id"].nunique() if not history.empty else 0} cases over '
               f'{commits} commits on {len(classes)} hardware classes ({escape(", ".join(classes))}); '
               f'{len(regressions)} flagged regressions')
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>specbench report</title>"
            f"<style>{CSS}</style></head><body><h1>specbench report</h1>"
            f'<p id="summary">{summary}. <span class="muted">Generated {now}'
            f'{" from " + escape(source) if source else ""}.</span></p>'
            f"{regressions_section(regressions)}{status_section(status)}"
            f'<h2 id="trends">Trends per case (x: commits in run order; dots: runs, line: median per commit; '
            f'red dashes: flagged regressions)</h2>{trends or "<p>No runs.</p>"}'
            f"{environment_section(history)}</body></html>\n")


def write_html_report(out_dir, page: str) -> Path:
    """Write ``out_dir/index.html`` atomically; returns its path."""
    path = Path(out_dir) / "index.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, page)
    return path
