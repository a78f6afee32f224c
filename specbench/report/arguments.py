"""The ``specbench report`` and ``specbench check`` command lines, light to import (the commands themselves, in
specbench/report/cli.py, load the stores, numpy and pandas only when they run); :func:`main` runs them alone."""

from __future__ import annotations

import argparse
import sys

REPORT_EPILOG = """examples:
  specbench report                                     # HTML dashboard in ./specbench-report/index.html
  specbench report --format markdown >> "$GITHUB_STEP_SUMMARY"
  specbench report --format json --out report/         # report/report.json
  specbench report --screenshot report.png             # also render the page in headless Chromium
"""
CHECK_EPILOG = """examples:
  specbench check --results results.jsonl              # gate a pytest --specbench-results file
  specbench check --results r.json --history hist/     # gate, then record the runs in the history
  specbench check --history hist/                      # gate the latest stored run of each case
exit status: 0 all gates pass, 1 a regression or failed check (each named), 2 bad input
"""


def one_line(err: BaseException) -> str:
    """An error's message in one line: an OS error as "FILE: reason; what to do", several lines joined by "; "."""
    if isinstance(err, OSError) and err.errno is not None and err.filename:
        return f"{err.filename}: {err.strerror}; check the path and its permissions"
    return "; ".join(line.strip() for line in str(err).splitlines() if line.strip()) or type(err).__name__


def _guarded(name: str):
    """specbench.report.cli's command ``name``, imported when it runs; bad input (unreadable files, broken
    baselines or history) -> one line on stderr and exit status 2."""
    def run(args: argparse.Namespace) -> int:
        from specbench.gating.baselines import BaselineError
        from specbench.report import cli

        try:
            return getattr(cli, name)(args)
        # HistoryError is a ValueError; OSError: a file or directory that cannot be read (or written)
        except (ValueError, BaselineError, OSError) as err:
            print(f"specbench {args.command}: error: {one_line(err)}", file=sys.stderr)
            return 2
    return run


def add_report_subcommands(subparsers) -> None:
    """Register ``report`` and ``check`` on an argparse subparsers object (``dest="command"``)."""
    report = subparsers.add_parser(
        "report", help="render the results history: HTML dashboard, Markdown CI summary or JSON",
        description="Read the results history, flag step regressions over it (per case x metric x hardware class) "
        "and compare the latest run of each case with its baseline.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=REPORT_EPILOG)
    report.add_argument("--history", metavar="DIR", help="history directory (default: $SPECBENCH_HISTORY_DIR or "
                        "<repo>/.specbench/history, where `specbench run` records every run)")
    report.add_argument("--out", metavar="DIR", help="output folder (html default: specbench-report; markdown and "
                        "json print to stdout unless given)")
    report.add_argument("--baselines", metavar="DIR", help="baseline directory (default: $SPECBENCH_BASELINES_DIR "
                        "or <repo>/baselines; when absent the gate outcome recorded with each run is shown)")
    report.add_argument("--format", choices=("html", "markdown", "json"), default="html",
                        help="html: a static dashboard folder; markdown: a CI summary; json: machine-readable "
                        "(default html)")
    report.add_argument("--screenshot", metavar="PNG", help="also render the whole HTML page in headless Chromium "
                        "to PNG")
    report.add_argument("--width", type=int, default=1400, metavar="PX", help="the --screenshot's width in pixels; "
                        "its height is the page's (default 1400)")
    report.set_defaults(func=_guarded("cmd_report"))

    check = subparsers.add_parser(
        "check", help="gate stored results against the baselines (exit 1 on a regression)",
        description="Gate stored run results against the stored baselines, as the pytest plugin does, and print "
        "every GateReport. With --results and --history the gated runs are also appended to the history.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=CHECK_EPILOG)
    check.add_argument("--results", nargs="+", metavar="FILE", help="results files (.jsonl: one result per line; "
                       ".json: a result or {\"results\": [...]})")
    check.add_argument("--history", metavar="DIR", help="history directory: record the results there, or without "
                       "--results gate the latest stored run of each case and hardware class")
    check.add_argument("--baselines", metavar="DIR", help="baseline directory (default: $SPECBENCH_BASELINES_DIR "
                       "or <repo>/baselines)")
    check.add_argument("-v", "--verbose", action="store_true", help="every check of every case (default: a line "
                       "per case, its regressions, failures and improvements, and one line per kind of skipped check)")
    check.set_defaults(func=_guarded("cmd_check"))


def main(argv: list[str] | None = None) -> int:
    """``report`` and ``check`` alone (what ``specbench report|check`` runs)."""
    parser = argparse.ArgumentParser(prog="specbench")
    add_report_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
