"""``specbench baselines regenerate``, ``show`` and ``migrate``: store, print and upgrade the stored baselines."""

from __future__ import annotations

import argparse
import sys

from specbench.cases import Case, builtin_suites, find_case
from specbench.cli.run_command import DEFAULT_SUITE, _fmt, _run_cases, _runnable, _select, _store


def cmd_baselines_regenerate(args: argparse.Namespace) -> int:
    from specbench.gating.regenerate import require_reason

    reason = require_reason(args.reason)  # refused before anything runs or is read
    if args.from_results:
        _store(_recorded_results(args), args.baselines, reason)
        return 0
    cases = _runnable(_select(find_case(args.suite or DEFAULT_SUITE), args.k), verbose=True)
    _store(_run_cases(cases, args.quiet), args.baselines, reason)
    return 0


def _recorded_results(args: argparse.Namespace) -> list[dict]:
    """Results recorded elsewhere (a GPU job's ``--specbench-results``), filtered by suite and -k like cases."""
    from specbench.report.cli import load_results

    recorded = [result for _, result in load_results(args.from_results)]
    by_case = {}
    for result in recorded:
        case = result.get("case") or {}
        if args.suite and case.get("suite") != args.suite:
            continue
        by_case[result["case_id"]] = result  # the last record of a case wins
    chosen = {c.case_id for c in _select([Case.from_dict(r["case"]) for r in by_case.values()], args.k)}
    results = [r for case_id, r in by_case.items() if case_id in chosen]
    if not results:
        raise ValueError(f"no results{' of suite ' + args.suite if args.suite else ''}"
                         f"{' matching -k ' + repr(args.k) if args.k else ''} in {', '.join(args.from_results)}")
    return results


def _shown_case_ids(store, suite: str | None) -> list[str]:
    """The stored case ids of ``suite`` (all without one); a suite with none is an error listing the known ones."""
    case_ids = store.case_ids()
    shown = [c for c in case_ids if not suite or c.startswith(suite + "/")]
    if suite and not shown:
        stored = sorted({c.partition("/")[0] for c in case_ids})
        kind = "built-in suite" if suite in builtin_suites() else "suite"
        raise ValueError(f"no baselines stored for {kind} {suite!r} in {store.directory} (suites with baselines there: "
                         f"{', '.join(stored) or 'none'}; built-in suites: {', '.join(builtin_suites())}); store them "
                         f"with `specbench baselines regenerate {suite} --reason TEXT`")
    return shown


def _last_stored(entry: dict) -> str:
    """When the entry's latest section (quality or a hardware class's speed) was stored, and why."""
    provenances = [entry["quality"]["provenance"], *(speed["provenance"] for speed in entry["speed"].values())]
    latest = max(provenances, key=lambda p: str(p.get("date") or ""))
    reason = latest.get("reason")  # files stored before reasons were recorded lack it
    return f"stored {latest.get('date')}: {reason!r}" if reason else f"stored {latest.get('date')}, no reason recorded"


def cmd_baselines_show(args: argparse.Namespace) -> int:
    from specbench.gating.baselines import BaselineStore

    store = BaselineStore(args.baselines) if args.baselines else BaselineStore()
    if args.baselines and not store.directory.is_dir():
        raise ValueError(f"baseline directory {store.directory} does not exist; pass the directory that holds "
                         "<suite>.json files")
    shown = _shown_case_ids(store, args.suite)
    if not shown:
        print(f"no baselines stored in {store.directory}; store them with `specbench baselines regenerate SUITE --reason TEXT`",
              file=sys.stderr)
    for case_id in shown:
        entry = store.entry(case_id)
        quality = entry["quality"]["metrics"]
        speed = ", ".join(
            f"{hw}: {_fmt(v['metrics']['tokens_per_s'], 1)} tok/s, {_fmt(v['metrics']['speedup'], 2)}x"
            for hw, v in sorted(entry["speed"].items())
        )
        print(
            f"{case_id}: acceptance {_fmt(quality['acceptance_rate'])}, MAL {_fmt(quality['mean_acceptance_length'], 2)}, "
            f"per position {[round(x, 3) for x in quality['per_position_acceptance_rate']]}; {speed}; "
            f"{_last_stored(entry)}"
        )
    return 0


def cmd_baselines_migrate(args: argparse.Namespace) -> int:
    """Rewrite every baseline file of an older schema at the current one (atomically), printing what changed."""
    import json

    from specbench.io.atomic_write import write_text_atomic
    from specbench.gating.baselines import BaselineStore, format_baseline_file, validate_baseline_file
    from specbench.gating.migrate import SCHEMA_VERSION, migrate

    store = BaselineStore(args.baselines) if args.baselines else BaselineStore()
    if not store.directory.is_dir():
        raise ValueError(f"baseline directory {store.directory} does not exist; pass the directory that holds "
                         "<suite>.json files with --baselines")
    for path in sorted(store.directory.glob("*.json")):
        store.load(path.stem)  # a file that does not validate after migration stops here, named
        data = json.loads(path.read_text(encoding="utf-8"))
        migrated, passed = migrate(data)
        if not passed:
            print(f"{path}: schema {data.get('schema')}, current")
            continue
        write_text_atomic(path, format_baseline_file(validate_baseline_file(migrated, path)))
        print(f"{path}: schema {' -> '.join(str(n) for n in [*passed, SCHEMA_VERSION])} "
              f"({len(migrated['cases'])} cases)")
    return 0
