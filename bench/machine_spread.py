"""The spread of every speed metric of the same cases over several machines (one results file per machine, e.g.
each device call's `gpu_tier.sh` results_*.jsonl), against the stored baseline and its tolerance: the data that
stored-baseline tolerances are set from (README, "Baselines and gates"; docs/ab.md#why).

    python bench/machine_spread.py OUT machine1/results_speed_cases.jsonl machine2/... machine3/...

For each case and speed metric: each machine's value, the spread (max / min - 1), the committed baseline, the
worst machine's relative loss against it (positive: worse, in the gate's direction), and the tolerance that gate uses now; a row is marked when a
machine falls outside a gated metric's tolerance (the table shows gated metrics only unless --all; the JSON has all). Writes OUT/machine_spread.json and prints the table.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specbench.gating.baselines import BaselineStore  # noqa: E402
from specbench.gating.gates import DIRECTIONS, HIGHER_IS_BETTER, SPEED_METRICS, _gate_speed, resolve_tolerances  # noqa: E402
from specbench.cases import find_case  # noqa: E402
from specbench.report.cli import load_results  # noqa: E402


def current_case(case_id: str, recorded: dict) -> dict:
    """The case as the committed case files define it now (its tolerances are what the gate uses today); the
    newest result's record of it when the files no longer hold it."""
    try:
        found = find_case(case_id)
    except (KeyError, ValueError):
        found = []
    return found[0].to_dict() if len(found) == 1 else recorded


def spread_rows(files: list[Path], store: BaselineStore) -> list[dict]:
    """One row per (case, speed metric) measured on at least one machine."""
    by_case: dict[str, dict[str, dict]] = {}
    for path in files:
        for _, result in load_results([str(path)]):
            if "error" not in result:
                by_case.setdefault(result["case_id"], {})[str(path)] = result  # a machine's last run of a case
    rows = []
    for case_id, per_machine in sorted(by_case.items()):
        entry = store.entry(case_id)
        newest = list(per_machine.values())[-1]
        hardware = (newest.get("env") or {}).get("hardware_class")
        speed = ((entry or {}).get("speed") or {}).get(hardware) or {}
        case = current_case(case_id, newest.get("case") or {})
        tolerances = resolve_tolerances((entry or {}).get("tolerances"), case.get("tolerances"))
        for name in SPEED_METRICS:
            values = {m: r["metrics"].get(name) for m, r in per_machine.items()}
            values = {m: float(v) for m, v in values.items() if isinstance(v, (int, float)) and math.isfinite(v) and v > 0}
            if not values:
                continue
            stored = (speed.get("metrics") or {}).get(name)
            # the worst machine in the gate's direction: a relative loss, positive when worse than the baseline
            sign = -1.0 if DIRECTIONS[name] == HIGHER_IS_BETTER else 1.0
            worst = max((sign * (v / stored - 1) for v in values.values()), default=None) if stored else None
            gated = _gate_speed(case, hardware, name)  # as the gate decides it
            rows.append({"case_id": case_id, "metric": name, "gated": gated, "machines": values,
                         "spread": max(values.values()) / min(values.values()) - 1, "baseline": stored,
                         "worst_from_baseline": worst, "tolerance": tolerances[name],
                         "outside": gated and worst is not None and worst > tolerances[name]})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("results", nargs="+", type=Path, help="one results file per machine (.jsonl or --output JSON)")
    parser.add_argument("--baselines", type=Path, default=None, help="baseline directory (default: the committed)")
    parser.add_argument("--all", action="store_true", help="also the metrics the cases do not gate (default: gated only)")
    args = parser.parse_args(argv)
    rows = spread_rows(args.results, BaselineStore(args.baselines) if args.baselines else BaselineStore())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "machine_spread.json").write_text(json.dumps({"files": [str(p) for p in args.results], "rows": rows},
                                                             indent=2) + "\n", encoding="utf-8")
    print(f"{'case':48} {'metric':24} {'machines':>8} {'spread':>7} {'worst loss':>13} {'tolerance':>9}")
    for row in (r for r in rows if args.all or r["gated"]):
        worst = "-" if row["worst_from_baseline"] is None else f"{row['worst_from_baseline'] * 100:+.1f}%"
        print(f"{row['case_id'][:48]:48} {row['metric']:24} {len(row['machines']):8d} {row['spread'] * 100:6.1f}% "
              f"{worst:>13} {row['tolerance'] * 100:8.0f}%{'  OUTSIDE' if row['outside'] else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
