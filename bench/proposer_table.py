"""Issue #29's table from speed-suite results: per case tok/s, speedup, MAL, draft cost, predicted against measured.

    SPECBENCH_SYNTH_DIR=DIR specbench run speed -k synth-7b --output OUT/speed_7b_proposers.json
    python bench/proposer_table.py OUT/speed_7b_proposers.json --out OUT/speed_7b_proposers.md

RESULTS: ``specbench run --output`` JSON or the pytest plugin's ``--specbench-results`` JSONL (one or several). The
Markdown table is written atomically to OUT (and printed). "predicted" is MAL / (T(K+1)/T(1) + draft / T(1)) of
the run's own step costs, compared with the decode-phase speedup (docs/metrics.md#step-costs); a launch-bound run
says so beside its speedup (docs/metrics.md#launch-bound-cases).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from specbench.gating.launch_bound import launch_bound
from specbench.report.cli import load_results

HEADER = ("case", "proposer", "tok/s", "plain tok/s", "speedup", "decode speedup", "predicted", "measured / predicted",
          "MAL", "per position", "T(K+1)/T(1)", "draft cost (T(1))", "T(1) ms")


def _num(value, digits: int) -> str:
    finite = isinstance(value, (int, float)) and math.isfinite(value)
    return f"{value:.{digits}f}" if finite else "–"


def _proposer(case: dict) -> str:
    proposer = dict(case.get("proposer") or {})
    name = proposer.pop("name", "?")
    proposer.pop("path", None)
    return name + (" " + ", ".join(f"{k}={v}" for k, v in proposer.items()) if proposer else "")


def table_row(result: dict) -> list[str]:
    """One result's cells, in HEADER's order."""
    m, case = result["metrics"], result.get("case") or {}
    error = m.get("speedup_prediction_error")
    speedup = _num(m.get("speedup"), 3) + (" (launch-bound: host overhead)" if launch_bound(case) else "")
    return [result["case_id"], _proposer(case), _num(m.get("tokens_per_s"), 1), _num(m.get("plain_tokens_per_s"), 1),
            speedup, _num(m.get("decode_speedup"), 3), _num(m.get("predicted_speedup"), 3),
            "–" if error is None or not math.isfinite(error) else f"{1 + error:.3f}",
            _num(m.get("mean_acceptance_length"), 2),
            "/".join(f"{x:.3f}" for x in m.get("per_position_acceptance_rate") or []) or "–",
            _num(m.get("verify_cost_ratio"), 3), _num(m.get("draft_cost_ratio"), 3),
            _num((m.get("step_latency_s") or math.nan) * 1e3, 2)]


def markdown_table(results: list[dict]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(table_row(r)) + " |" for r in results if "metrics" in r]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", help="specbench run --output JSON or --specbench-results JSONL files")
    parser.add_argument("--out", help="write the Markdown table here (atomically) too")
    args = parser.parse_args(argv)
    table = markdown_table([result for _, result in load_results(args.results)])
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = out.with_name(f".{out.name}.{os.getpid()}.partial")
        staging.write_text(table, encoding="utf-8")
        os.replace(staging, out)  # a reader sees no table or the whole one
    sys.stdout.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
