"""The comparison bench/ab_engine_trees.sh prints: head against base, run by run, from the runs' JSON in OUT.

    python bench/ab_engine_summary.py OUT

Per synthetic target (1B, 7B; bench/speed_7b.py, static engine): plain tok/s, T(1) in ms, T(k)/T(1) for k = 2, 4, 6
and the 63-node tree, and the oracle's tok/s at K = 3 and 5: each tree's mean over its runs, and head / base - 1.
Per batch size of bench/batch_curve.py: throughput of the plain, oracle and Medusa-profile runs, head / base - 1.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def speed_rows(figures: dict) -> dict[str, float]:
    static = figures.get("static") or {}
    cost = static.get("verify_cost_ratio") or {}
    rows = {"plain tok/s": static.get("plain", {}).get("tokens_per_s"),
            "T(1) ms": 1e3 * static["verify_seconds_k1"] if "verify_seconds_k1" in static else None}
    rows.update({f"T({k})/T(1)": cost.get(k) for k in ("2", "4", "6", "tree63")})
    for k in (3, 5):
        rows[f"oracle K={k} tok/s"] = static.get(f"spec_full_acceptance_k{k}", {}).get("tokens_per_s")
    return rows


def curve_rows(report: dict) -> dict[str, float]:
    rows = {}
    for point in report.get("curve", []):
        for kind in ("plain", "oracle", "medusa_profile"):
            rows[f"B={point['batch_size']} {kind} tok/s"] = point.get(kind, {}).get("throughput_tokens_per_s")
    return rows


def load(out: Path, pattern: str, file: str, rows) -> dict[str, list[dict[str, float]]]:
    """tree -> the rows of each of its runs named ``pattern`` (run directories ``<pattern>_<tree>[_<n>]``)."""
    found: dict[str, list] = {"base": [], "head": []}
    for directory in sorted(out.glob(f"{pattern}_*")):
        tree = directory.name[len(pattern) + 1:].split("_")[0]
        if directory.is_dir() and (directory / file).is_file() and tree in found:
            found[tree].append(rows(json.loads((directory / file).read_text())))
    return found


def compare(title: str, found: dict) -> list[str]:
    if not found["base"] or not found["head"]:
        return [f"{title}: no comparison (base runs {len(found['base'])}, head runs {len(found['head'])})"]
    lines = [f"{title} (base runs {len(found['base'])}, head runs {len(found['head'])})",
             f"  {'figure':24} {'base':>10} {'head':>10} {'head/base-1':>12}"]
    for name in found["head"][0]:
        base = [r[name] for r in found["base"] if r.get(name) is not None]
        head = [r[name] for r in found["head"] if r.get(name) is not None]
        if not base or not head:
            continue
        b, h = statistics.fmean(base), statistics.fmean(head)
        lines.append(f"  {name:24} {b:10.3f} {h:10.3f} {h / b - 1:+12.2%}")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[0])
    lines = []
    for size in ("1b", "7b"):
        lines += compare(f"speed_7b.py static engine, synthetic {size.upper()}", load(out, f"speed_{size}", "speed_7b.json", speed_rows))
    lines += compare("batch_curve.py, synthetic 7B", load(out, "curve", "batch_curve.json", curve_rows))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
