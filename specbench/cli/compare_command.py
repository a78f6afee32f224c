"""``specbench compare BASE CASE...``: did my change slow it down? A/B of a base commit against the head, on this
machine, in interleaved fresh processes (docs/ab.md); one row per case, JSON, history, exit 0 / 1 / 2."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from specbench.cases import OVERRIDABLE

COMPARE_DESCRIPTION = """\
Run the same cases from BASE and from the head (default: the working tree, uncommitted changes included) in git
worktrees, in fresh processes, interleaved round by round on this machine, and gate the head's speed on the paired
differences: a 99% interval over the rounds, each speed metric failing when the whole interval is on the slow side
of zero and reaches the tolerance (5% by default). Quality and losslessness are gated exactly as against a stored
baseline, the base's run being the baseline. This is the verdict to trust for a change on any machine, CPU
included; stored baselines carry cross-machine tolerances instead (README, "Did my change slow it down?").

Refused (exit 2): a BASE or --head that is not a commit, a case one tree lacks, a case whose definition differs
between the trees (unless --allow-case-change), untracked files under specbench/, suites/ or bench/ that the head's
snapshot of the working tree would lose, fewer than 2 rounds.

exit status: 0 no regression, 1 a regression, a failed lossless check or a run that failed, 2 bad input
"""


def add_ab_arguments(parser: argparse.ArgumentParser) -> None:
    """The options compare and bisect share: rounds, confidence, tolerances, environments, case changes."""
    parser.add_argument("--rounds", type=int, default=6, metavar="R",
                        help="pairs of fresh runs per case, alternating which side goes first (default 6: an even number balances the order; at least 2)")
    parser.add_argument("--warmup", type=int, default=1, metavar="N",
                        help="processes of each commit run unrecorded before its first recorded run (default 1): the "
                             "first process on a fresh machine fills the compile and autotune caches and has read "
                             "T(1) up to 14%% slower than the rest (docs/ab.md#warm-up); 0 runs none")
    parser.add_argument("--confidence", type=float, default=None, metavar="C",
                        help="confidence of the interval over the rounds (default 0.99)")
    parser.add_argument("--tolerance", action="append", default=[], metavar="[METRIC=]X",
                        help="relative tolerance of every speed metric (X) or of one (tokens_per_s=0.03); repeatable "
                             "(default 0.05)")
    parser.add_argument("--allow-case-change", action="store_true",
                        help="compare a case whose definition differs between the trees (a changed case measures "
                             "something else: read the verdict as such)")
    parser.add_argument("--repo", metavar="DIR", help="the git repository whose commits are named (default: the one "
                        "holding the working directory)")
    parser.add_argument("--head-env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable for the head's processes only (PYTHONPATH is prepended), e.g. "
                             "the bench-only slowdown switch of bench/inject_slowdown/ (repeatable)")
    parser.add_argument("--base-env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable for the base's processes only (repeatable)")
    parser.add_argument("--runs-dir", metavar="DIR",
                        help="keep each finished round (both sides' results) and each process's log in DIR (default: a "
                             "temporary directory); run the same comparison again with the same DIR and the rounds "
                             "already there are reused, so one cut short (a time limit, a lost machine) continues where "
                             "it stopped and a larger --rounds adds rounds; refused when DIR holds another comparison's "
                             "(other tree contents, run settings or --*-env)")


def check_rounds(rounds: int, warmup: int = 0) -> None:
    from specbench.gating.ab import MIN_ROUNDS

    if warmup < 0:
        raise ValueError(f"--warmup {warmup}: expected 0 or more unrecorded processes per commit")
    if rounds < MIN_ROUNDS:
        raise ValueError(f"--rounds {rounds}: an A/B interval needs at least {MIN_ROUNDS} rounds (pairs of runs)")


def _pairs(values: list[str], flag: str) -> dict[str, str]:
    out = {}
    for text in values:
        name, sep, value = text.partition("=")
        if not sep or not name:
            raise ValueError(f"{flag} {text!r}: expected NAME=VALUE")
        out[name] = value
    return out


def tolerances_from(values: list[str]) -> dict[str, float]:
    """--tolerance X / METRIC=X -> {metric: X} over the speed metrics; bad names and values refused by name."""
    from specbench.gating.gates import SPEED_METRICS

    out: dict[str, float] = {}
    for text in values:
        name, sep, number = text.rpartition("=") if "=" in text else ("", "", text)
        try:
            value = float(number)
        except ValueError:
            value = -1.0
        if not 0 < value < 1:
            raise ValueError(f"--tolerance {text!r}: expected a fraction between 0 and 1, e.g. 0.05")
        if sep and name not in SPEED_METRICS:
            raise ValueError(f"--tolerance {text!r}: unknown speed metric {name!r}; expected one of "
                             f"{', '.join(SPEED_METRICS)}")
        out.update({name: value} if sep else dict.fromkeys(SPEED_METRICS, value))
    return out


def run_flags(args: argparse.Namespace) -> list[str]:
    """The run-setting flags given to compare, as both sides' `specbench run` takes them."""
    flags = []
    for key in OVERRIDABLE:
        value = getattr(args, key, None)
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        flags += [flag] if value is True else [flag, str(value)]
    return flags


def side_overrides(args: argparse.Namespace) -> dict[str, dict[str, str]]:
    """Per side the variables its --*-env options set."""
    return {"base": _pairs(args.base_env, "--base-env"), "head": _pairs(args.head_env, "--head-env")}


def side_environments(args: argparse.Namespace) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """(the environment for reading case definitions, per side the environment of its runs)."""
    from specbench.gating.ab_runs import child_environment

    return child_environment(), {side: child_environment(env) for side, env in side_overrides(args).items()}


def kept_rounds(args: argparse.Namespace, base, head):
    """The --runs-dir store of finished rounds, None without the option (ab_kept refuses another comparison's)."""
    if not args.runs_dir:
        return None
    from specbench.gating.ab_kept import KeptRounds, comparison_identity

    return KeptRounds(args.runs_dir, comparison_identity(base, head, run_flags(args), side_overrides(args)))


def _change(check) -> str:
    from specbench.gating.ab import check_change

    return f"{check_change(check) * 100:+.1f}%"


def _interval(check) -> str:
    low, high = (value / check.baseline - 1 for value in check.ci)
    return f"[{low * 100:+.1f}%, {high * 100:+.1f}%]"


def comparison_table(comparison) -> str:
    """One row per case: the decisive speed check (the worst regression, else tokens/s) base -> head, its change
    and interval, and the case's verdict."""
    from specbench.gating.ab import headline_check
    from specbench.gating.verdicts import _fmt

    header = ["case", "metric", "base", "head", "change", "interval", "verdict"]
    rows = []
    for case_id in comparison.pairs:
        if case_id in comparison.errors:
            rows.append([case_id, "-", "-", "-", "-", "-", f"ERROR {comparison.errors[case_id]['error']['type']}"])
            continue
        report = comparison.reports[case_id]
        check = headline_check(report)
        failed = sorted({c.name for c in report.failures})
        verdict = "pass" if report.passed else "REGRESSION (" + ", ".join(failed) + ")"
        if check is None or check.ci is None:
            rows.append([case_id, "-", "-", "-", "-", "-", verdict])
            continue
        rows.append([case_id, check.name, _fmt(check.baseline), _fmt(check.measured), _change(check), _interval(check),
                     verdict])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def comparison_json(comparison) -> dict:
    """The comparison as JSON: both trees, every case's report and every round's metrics per side."""
    side = lambda tree: {"rev": tree.label, "commit": tree.commit, "dirty": tree.dirty}  # noqa: E731
    cases = []
    for case_id, pairs in comparison.pairs.items():
        report = comparison.reports.get(case_id)
        cases.append({
            "case_id": case_id, "passed": bool(report and report.passed),
            "error": (comparison.errors.get(case_id) or {}).get("error"),
            "report": report.to_dict() if report else None,
            "rounds": [{"round": r, "base": b.get("metrics"), "head": h.get("metrics")} for r, (b, h) in enumerate(pairs)],
        })
    return {"kind": "specbench-compare", "schema": 1, "base": side(comparison.base), "head": side(comparison.head),
            "rounds": comparison.rounds, "case_changes": comparison.case_changes, "passed": comparison.passed,
            "cases": cases}


def record_history(comparison, directory: str | None) -> Path:
    """Append each case's last head run with its A/B verdict to the results history (details.ab names the base)."""
    from specbench.gating.history import append_results, default_history_dir

    case_ids = list(comparison.reports)
    results = [comparison.recorded(case_id) for case_id in case_ids]
    reports = [comparison.reports[case_id] for case_id in case_ids]
    return append_results(directory or default_history_dir(), results, gate_reports=reports)


def print_comparison(comparison, *, verbose: bool) -> None:
    print(comparison_table(comparison))
    print()
    for line in comparison.case_changes:
        print(f"case changed (--allow-case-change): {line}")
    for case_id, error in comparison.errors.items():
        print(f"{case_id}: ERROR {error['error']['type']}: {error['error'].get('message', '')}")
    for report in comparison.reports.values():
        print(report.format() if verbose else report.format(brief=True))


def open_trees(repo: Path, base_rev: str, head_rev: str | None):
    """(Worktrees, base Tree, head Tree): the head is the working tree's snapshot unless ``head_rev``."""
    from specbench.gating.worktrees import WORKING_TREE, Worktrees

    trees = Worktrees(repo)
    try:
        base = trees.add("base", base_rev)
        head = trees.add("head", head_rev or WORKING_TREE)
    except BaseException:
        trees.close()
        raise
    return trees, base, head


def cmd_compare(args: argparse.Namespace) -> int:
    from specbench.gating.ab_runs import ProcessRunner, RunFailed, compare_trees
    from specbench.gating.worktrees import repository_root

    tolerances = tolerances_from(args.tolerance)
    check_rounds(args.rounds, args.warmup)
    repo = repository_root(args.repo or Path.cwd())
    probe_env, envs = side_environments(args)
    trees, base, head = open_trees(repo, args.base, args.head)
    progress = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    try:
        kept = kept_rounds(args, base, head)
        logs = {"log_dir": kept.directory / "logs"} if kept else {}
        comparison = compare_trees(base, head, args.cases, rounds=args.rounds, env=probe_env,
                                   runner=ProcessRunner(run_flags(args), envs, **logs, warmup=args.warmup,
                                                        progress=progress), tolerances=tolerances,
                                   confidence=args.confidence, allow_case_change=args.allow_case_change,
                                   progress=progress, kept=kept)
    except RunFailed as err:
        print(f"specbench compare: {err}", file=sys.stderr)
        return 1
    finally:
        trees.close()
    print_comparison(comparison, verbose=args.verbose)
    if args.output:
        from specbench.io import strict_json
        from specbench.io.atomic_write import write_text_atomic

        write_text_atomic(args.output, strict_json.dumps(comparison_json(comparison)) + "\n")
        print(f"wrote {args.output}")
    if not args.no_history and comparison.reports:
        path = record_history(comparison, args.history)
        print(f"recorded in {path} (`specbench report{' --history ' + shlex.quote(args.history) if args.history else ''}`)")
    return 0 if comparison.passed else 1
