"""The static HTML dashboard: the results history rendered through the Jinja templates into one index.html.

The page is self-contained (inline CSS and SVG, no script, no network): the flagged regressions, the status
of each case against its baseline, batch-size curves beside their baselines (specbench.report.curves), trend
plots per case split by hardware class, per-position acceptance curves and the environment of each run. This module only gathers the values; the markup lives in
``specbench/report/templates/``, rendered with autoescaping and ``StrictUndefined`` (a missing variable is an
error, not an empty string). The charts are the one piece of pre-built markup: specbench.report.svg escapes
every text it embeds and returns them as ``Markup``.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from specbench.io.atomic_write import write_text_atomic
from specbench.gating.gates import DIRECTIONS, HIGHER_IS_BETTER
from specbench.gating.launch_bound import LAUNCH_BOUND_METRICS, LAUNCH_BOUND_NOTE, LAUNCH_BOUND_WORDS, launch_bound
from specbench.report.changes import WINDOW, Regression
from specbench.report.status import METRIC_LABELS, STATUS_METRICS, StatusRow, plural
from specbench.report.svg import PALETTE, Line, line_chart

TREND_METRICS = ("acceptance_rate", "mean_acceptance_length", "speedup", "tokens_per_s")
SPLIT_METRICS = ("tokens_per_s",)  # one chart per hardware class
# where each trend's y axis starts at the latest: a rate and a speed from 0, MAL from 1 (its least), so a chart
# shows a change against the metric's whole range rather than zoomed into noise
Y_FLOORS = {"acceptance_rate": 0.0, "mean_acceptance_length": 1.0, "speedup": 0.0, "tokens_per_s": 0.0}
ONE_COMMIT = "one commit: no trend yet"
ENV_COLUMNS = ("hardware_class", "gpu_name", "driver_version", "cuda_version", "torch", "transformers", "python",
               "dtype", "platform")
MAX_ENV_ROWS = 300
STATUS_TEXT = {"pass": "pass", "improvement": "improved", "regression": "REGRESSION", "fail": "FAIL",
               "no_baseline": "no baseline", "skipped": "skipped", "error": "ERROR",
               "recorded_pass": "pass (recorded)", "recorded_fail": "FAIL (recorded)"}
TEMPLATE = "index.html"


def _fmt(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value:.{digits}f}" if abs(value) < 1000 else f"{value:.0f}"


def _pct(value) -> str:
    return "–" if value is None else f"{value * 100:+.1f}%"


def _short(commit) -> str:
    return "(none)" if not commit else str(commit)[:10]


@lru_cache(maxsize=1)
def template_environment() -> Environment:
    """The Jinja environment over specbench/report/templates/: HTML autoescaped (everything but the
    stylesheet), undefined variables raise."""
    env = Environment(loader=PackageLoader("specbench.report", "templates"),
                      autoescape=select_autoescape(enabled_extensions=("html",), disabled_extensions=("css",),
                                                   default_for_string=True, default=True),
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters.update(fmt=_fmt, pct=_pct, short=_short, plural=plural)
    return env


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


def _trend_charts(case_id: str, runs, labels: list[str], regressions: list[Regression], colors: dict) -> list:
    x_of_commit = dict(zip(runs["git_commit"], runs["_x"]))
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
                label = hardware_class + (f" ({LAUNCH_BOUND_WORDS})" if metric in LAUNCH_BOUND_METRICS
                                          and launch_bound(group["case_definition"].iloc[-1]) else "")
                lines.append(Line(label, colors[hardware_class], points, list(medians.items())))
            markers = [(x_of_commit.get(r.commit, 0), f"{r.hardware_class}: {r.message()}") for r in regressions
                       if r.case_id == case_id and r.metric == metric and r.hardware_class in classes]
            arrow = "↑" if DIRECTIONS[metric] == HIGHER_IS_BETTER else "↓"
            where = f" on {classes[0]}" if metric in SPLIT_METRICS else ""
            charts.append(line_chart(f"{METRIC_LABELS[metric]}{where} ({arrow} better)", lines, x_labels=labels,
                                     y_label=METRIC_LABELS[metric], markers=markers, css_class="chart trend",
                                     y_floor=Y_FLOORS[metric], note=ONE_COMMIT if len(labels) == 1 else ""))
    return charts


def _per_position_chart(case_id: str, status: list[StatusRow], colors: dict):
    curves = []
    for row in status:
        if row.case_id != case_id:
            continue
        curves.append(Line(f"{row.hardware_class} latest", colors[row.hardware_class],
                           [(i, v, f"{row.hardware_class} position {i}: {v:.3f}")
                            for i, v in enumerate(row.per_position)],
                           list(enumerate(row.per_position))))
    baseline = next((r.per_position_baseline for r in status if r.case_id == case_id and r.per_position_baseline), None)
    if baseline:
        curves.append(Line("baseline", "#000000", [(i, v, f"baseline position {i}: {v:.3f}")
                                                   for i, v in enumerate(baseline)], list(enumerate(baseline)),
                           dashed=True))
    depth = max([len(c.path) for c in curves] or [0])
    return line_chart("per-position acceptance (latest vs baseline)", curves,
                      x_labels=[f"pos {i}" for i in range(depth)], y_label="acceptance rate", y_floor=0.0,
                      css_class="chart per-position")


def case_charts(case_id: str, runs, regressions: list[Regression], status: list[StatusRow], colors: dict) -> dict:
    """One case's trend section for the template: its anchor, run and commit counts and its charts (Markup)."""
    labels, xs = commit_axis(runs)
    runs = runs.assign(_x=xs)
    charts = _trend_charts(case_id, runs, labels, regressions, colors)
    charts.append(_per_position_chart(case_id, status, colors))
    return {"case_id": case_id, "anchor": "case-" + "".join(ch if ch.isalnum() else "-" for ch in case_id),
            "num_runs": len(runs), "num_commits": len(labels), "charts": charts}


def environment_rows(history) -> list[list[str]]:
    """The environment table's cells, newest run first, at most MAX_ENV_ROWS rows."""
    rows = []
    for _, run in history.iloc[::-1].head(MAX_ENV_ROWS).iterrows():
        env = run["env"] or {}
        commit = _short(run["git_commit"]) + (" (dirty)" if run["git_dirty"] else "")
        gate = {True: "pass", False: "FAIL"}.get(run["gate_passed"], "–")
        cells = [run["created_at"].strftime("%Y-%m-%d %H:%M:%S"), run["case_id"], commit,
                 *[("–" if env.get(c) is None else str(env.get(c))) for c in ENV_COLUMNS], gate]
        cells[3] = run["hardware_class"]
        rows.append([str(c) for c in cells])
    return rows


def render_html(history, regressions: list[Regression], status: list[StatusRow], *, source: str = "",
                curves: list | None = None) -> str:
    """The whole page as text; ``curves``: specbench.report.curves.batch_curves (none: no curve section)."""
    classes = sorted(history["hardware_class"].unique()) if not history.empty else []
    colors = {hw: PALETTE[i % len(PALETTE)] for i, hw in enumerate(classes)}
    trends = [case_charts(case_id, runs, regressions, status, colors)
              for case_id, runs in history.groupby("case_id", sort=True)]
    return template_environment().get_template(TEMPLATE).render(
        num_runs=len(history), num_cases=history["case_id"].nunique() if not history.empty else 0,
        num_commits=history["git_commit"].dropna().nunique() if not history.empty else 0, classes=classes,
        generated=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), source=source,
        regressions=regressions, window=WINDOW, metric_labels=METRIC_LABELS, status_rows=status,
        status_metrics=STATUS_METRICS, status_text=STATUS_TEXT, trends=trends, curves=curves or [],
        launch_bound_words=LAUNCH_BOUND_WORDS, launch_bound_note=LAUNCH_BOUND_NOTE,
        launch_bound_metrics=LAUNCH_BOUND_METRICS,
        env_header=("run", "case", "commit", *ENV_COLUMNS, "gate"),
        env_rows=environment_rows(history), max_env_rows=MAX_ENV_ROWS)


def write_html_report(out_dir, page: str) -> Path:
    """Write ``out_dir/index.html`` atomically; returns its path."""
    path = Path(out_dir) / "index.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, page)
    return path
