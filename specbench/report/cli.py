"""``specbench report`` (dashboard, CI summary, JSON) and ``specbench check`` (gate stored results outside
pytest, optionally recording them in the history). ``specbench.cli`` registers both through
specbench/report/arguments.py (light to import: `specbench --help` loads none of this), whose ``main`` runs them
alone.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

from specbench.io.atomic_write import write_text_atomic
from specbench.gating.aggregates import contradictions
from specbench.gating.baselines import BaselineError, BaselineStore, compare, default_baselines_dir
from specbench.gating.history import (
    HistoryError,
    append_results,
    default_history_dir,
    load_history,
    result_from_row,
)
from specbench.report.status import plural

def load_results(paths: list[str]) -> list[tuple[str, dict]]:
    """(source, result) of every result in the files: ``.jsonl`` one result per line (the pytest plugin's
    ``--specbench-results``), otherwise one JSON document holding a result or ``{"results": [...]}``
    (``specbench run --output``). Raises HistoryError naming the file and line of anything else."""
    out = []
    for name in paths:
        path = Path(name)
        try:
            text = path.read_text(encoding="utf-8")
        except (FileNotFoundError, IsADirectoryError, PermissionError) as err:
            raise HistoryError(f"{path}: cannot read the results file ({err.strerror})") from None
        if path.suffix == ".jsonl":
            documents = [(f"{path}:{n}", line) for n, line in enumerate(text.split("\n"), start=1) if line.strip()]
        else:
            documents = [(str(path), text)]
        for source, document in documents:
            try:
                data = json.loads(document)
            except json.JSONDecodeError as err:
                raise HistoryError(f"{source}: not valid JSON ({err.msg} at line {err.lineno}, column {err.colno}); "
                                   "a .jsonl file needs one whole result per line") from None
            items = data["results"] if isinstance(data, dict) and isinstance(data.get("results"), list) else [data]
            for i, result in enumerate(items):
                where = source if len(items) == 1 else f"{source} results[{i}]"
                _validate_result(result, where)
                out.append((where, result))
    if not out:
        raise HistoryError(f"no results in {', '.join(paths)}")
    return out


def _validate_result(result, where: str) -> None:
    if not isinstance(result, dict):
        raise HistoryError(f"{where}: expected a run result object, found {type(result).__name__}")
    case = result.get("case") if isinstance(result.get("case"), dict) else {}
    has_id = bool(result.get("case_id")) or (bool(case.get("suite")) and bool(case.get("name")))
    missing = [k for k, ok in (("metrics", isinstance(result.get("metrics"), dict)), ("case_id", has_id)) if not ok]
    if missing:
        raise HistoryError(f"{where}: run result lacks {missing} (expected the RESULT_SCHEMA keys case_id, case, "
                           f"metrics, requests, correctness, env; found {sorted(result)})")
    wrong = contradictions(result)
    if wrong:
        metric, stored, computed = wrong[0]
        also = f" (also {', '.join(name for name, _, _ in wrong[1:])})" if wrong[1:] else ""
        raise HistoryError(f"{where}: metrics.{metric} is {_shown(stored)} but its requests' counters give "
                           f"{_shown(computed)}{also}: the aggregates do not follow from the per-request records; "
                           "re-run the case, or restore the file as the run wrote it")


def _store(path: str | None, *, required: bool) -> BaselineStore | None:
    directory = Path(path) if path else default_baselines_dir()
    if not directory.is_dir():
        if path or required:
            raise HistoryError(f"baseline directory {directory} does not exist; pass --baselines DIR")
        return None
    return BaselineStore(directory)


def _latest_runs(history_dir: str) -> list[tuple[str, dict]]:
    history = load_history(history_dir)
    if history.empty:
        raise HistoryError(f"history directory {history_dir} holds no records")
    latest = history.groupby(["case_id", "hardware_class"], sort=True).tail(1)
    return [(f"{history_dir}/{row['source']}", result_from_row(row)) for _, row in latest.iterrows()]


def cmd_check(args: argparse.Namespace) -> int:
    if not args.results and not args.history:
        raise HistoryError("nothing to check: give --results FILE... and/or --history DIR")
    store = _store(args.baselines, required=True)
    runs = load_results(args.results) if args.results else _latest_runs(args.history)
    reports, failures = [], []
    for source, result in runs:
        report = compare(result, store)
        reports.append(report)
        failures += report.failures
        print(report.format(brief=not args.verbose) + f"\n  (from {source})")
    if not args.verbose:
        from specbench.gating.gates import skip_summary

        print("\n".join(f"{line}; -v for details" for line in skip_summary(reports)))
    if args.results and args.history:
        path = append_results(args.history, [r for _, r in runs], gate_reports=reports)
        print(f"recorded {plural(len(runs), 'run')} in {path}")
    if failures:
        print(f"\nspecbench check: {plural(len(failures), 'failing check')} in "
              f"{sum(not r.passed for r in reports)} of {plural(len(reports), 'case')}:")
        for c in failures:
            tolerance = "n/a (absolute requirement)" if c.tolerance is None else f"{c.tolerance * 100:g}%"
            print(f"  {c.case_id}: {c.name} {c.status}: baseline {_number(c.baseline)}, measured "
                  f"{_number(c.measured)}, tolerance {tolerance}" + (f" ({c.reason})" if c.reason else ""))
        return 1
    print(f"\nspecbench check: {'1 case passes' if len(reports) == 1 else f'all {len(reports)} cases pass'}")
    return 0


def _shown(value) -> str:
    """A stored or recomputed metric in an error: lists item by item, numbers to 6 significant digits."""
    if isinstance(value, list):
        return "[" + ", ".join(map(_shown, value)) + "]"
    return f"{value:.6g}" if isinstance(value, float) else repr(value)


def _number(value) -> str:
    return "undefined" if value is None or value != value else f"{value:.4g}"


def report_payload(history, regressions, status, source: str) -> dict:
    """The machine-readable report (``--format json``)."""
    return {"schema": 1, "generated_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "history": source, "num_runs": len(history),
            "cases": sorted(history["case_id"].unique().tolist()),
            "hardware_classes": sorted(history["hardware_class"].unique().tolist()),
            "regressions": [r.to_dict() for r in regressions], "status": [row.to_dict() for row in status]}


NOTHING_RECORDED = ("specbench report: nothing recorded yet in {directory}: `specbench run` records every run there "
                    "(unless --no-history), as does `pytest suites/` (unless --specbench-no-history); run one, then "
                    "`specbench report` again")


def _history(args: argparse.Namespace):
    """(history directory, its DataFrame or None when nothing is recorded yet: an empty directory, or no default
    one). A --history DIR that does not exist is bad input: most likely a mistyped path."""
    history_dir = Path(args.history) if args.history else default_history_dir()
    if not history_dir.is_dir():
        if args.history:
            raise HistoryError(f"history directory {history_dir} does not exist; pass the directory that "
                               "`specbench run --history DIR` or `pytest --specbench-history DIR` recorded into, "
                               "or leave --history out for the default one")
        return history_dir, None
    history = load_history(history_dir)
    return history_dir, None if history.empty else history


def cmd_report(args: argparse.Namespace) -> int:
    from specbench.report.changes import detect_regressions
    from specbench.report.status import status_rows

    if args.width < 320:
        raise HistoryError(f"--width {args.width}: expected at least 320 pixels (the dashboard's narrowest layout)")
    if args.screenshot and args.format != "html":
        raise HistoryError("--screenshot renders the HTML report; drop --format or use --format html")
    store = _store(args.baselines, required=False)
    history_dir, history = _history(args)
    if history is None:
        # nothing is wrong with the input, there is just nothing to show yet
        print(NOTHING_RECORDED.format(directory=history_dir), file=sys.stderr)
        if args.format == "markdown":  # a CI job summary says so, rather than being silently empty
            from specbench.report.markdown import render_empty

            return _emit(render_empty(str(history_dir)), args.out, "summary.md")
        return 0
    case_ids = history["case_id"].unique().tolist()
    overrides = {c: (store.entry(c) or {}).get("tolerances") for c in case_ids} if store else {}
    regressions = detect_regressions(history, baseline_tolerances=overrides)
    status = status_rows(history, store)
    if args.format == "markdown":
        from specbench.report.markdown import render_markdown

        return _emit(render_markdown(history, regressions, status), args.out, "summary.md")
    if args.format == "json":
        payload = report_payload(history, regressions, status, str(history_dir))
        return _emit(json.dumps(payload, indent=2, allow_nan=False) + "\n", args.out, "report.json")
    from specbench.report.curves import batch_curves
    from specbench.report.html import render_html, write_html_report

    page = render_html(history, regressions, status, source=str(history_dir), curves=batch_curves(history, store))
    path = write_html_report(args.out or "specbench-report", page)
    print(f"wrote {path} ({plural(len(history), 'run')}, {plural(len(regressions), 'flagged regression')})")
    if args.screenshot:
        from specbench.report.screenshot import MAX_HEIGHT, BrowserUnavailable, capture

        try:
            shot = capture(path, screenshot=args.screenshot, width=args.width)
        except BrowserUnavailable as err:
            raise HistoryError(str(err)) from None
        for line in shot.console:
            print(f"console: {line}", file=sys.stderr)
        clipped = f"; the page is {shot.layout.height} px tall, cut at {MAX_HEIGHT}" if shot.layout.clipped else ""
        print(f"wrote {shot.screenshot} (the whole page, {args.width} x {min(shot.layout.height, MAX_HEIGHT)} px{clipped})")
    return 0


def _emit(text: str, out: str | None, name: str) -> int:
    if out is None:
        sys.stdout.write(text)
        return 0
    path = Path(out) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text)
    print(f"wrote {path}", file=sys.stderr)
    return 0

