"""``specbench sweep``: one case over batch sizes x draft lengths, its grid table, the best K per batch size, its JSON."""

from __future__ import annotations

import argparse


from specbench.cases import OVERRIDABLE, Case, changed_name, find_case

SWEEP_DESCRIPTION = """\
Run one case at every batch size B x draft length K in the static engine's B slots (engine static): at each point,
plain and speculative batched decoding at the same B, as `specbench run --batch-size B` runs it. Prints a row
per point (throughput = all output tokens / wall time of the batched run, the plain throughput at the same B,
batch speedup = their ratio, acceptance, MAL, the lossless check) and, per batch size, the K of highest
throughput. --output writes the grid as JSON.

  specbench sweep medusa/chain-k3 --engine static --batch-sizes 1,2,4,8 --num-speculative-tokens 1,2,3,5 \\
      --num-prompts 8 --output sweep.json

The points are not gated against baselines (a sweep changes the case; the lossless check still applies) and not
recorded in the results history.

exit status: 0 every point ran and passed its lossless check, 1 a point failed it or faulted (its row reads
ERROR), 2 bad input (a flag, a list, the case)
"""

SWEEP_OVERRIDES = tuple(key for key in OVERRIDABLE if key != "batch_size")  # --batch-sizes replaces --batch-size


def _sweep_base(spec: str) -> tuple[Case, list[int] | None]:
    """(the one case SPEC names, the batch sizes it sweeps or None): a batch_sizes case comes back as its points,
    which are folded back into the case they were expanded from."""
    from specbench.gating.curves import curve_name

    cases = find_case(spec)
    sizes = [c.batch_size for c in cases]
    names = {curve_name(c.name) for c in cases}
    if len(cases) == 1:
        return cases[0], None
    if len(names) != 1 or any(c.name != changed_name(next(iter(names)), {"batch_size": b}) for c, b in zip(cases, sizes)):
        raise ValueError(f"specbench sweep runs one case, and {spec!r} names {len(cases)}: "
                         f"{', '.join(c.case_id for c in cases)}; name one as SUITE/CASE")
    data = {**cases[0].to_dict(), "name": next(iter(names))}
    del data["batch_size"]
    return Case.from_dict(data, origin=f"{spec} folded back from its batch sizes"), sizes


def _grid_row(point: dict, lossless: str) -> list[str]:
    from specbench.cli.run_command import _fmt

    k = "-" if point["num_speculative_tokens"] is None else str(point["num_speculative_tokens"])
    if "error" in point:
        return [k, str(point["batch_size"]), "ERROR", "-", "-", "-", "-", f"ERROR {point['error']['type']}"]
    m = point["metrics"]
    return [k, str(point["batch_size"]), _fmt(m["throughput_tokens_per_s"], 1), _fmt(m["plain_throughput_tokens_per_s"], 1),
            _fmt(m["batch_speedup"], 2) + "x", _fmt(m["acceptance_rate"]), _fmt(m["mean_acceptance_length"], 2), lossless]


def grid_table(points: list[dict], lossless: list[str]) -> str:
    """One row per grid point, K then B."""
    header = ["K", "B", "throughput tok/s", "plain tok/s", "batch speedup", "accept", "MAL", "lossless"]
    rows = [_grid_row(point, cell) for point, cell in zip(points, lossless)]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def best_lines(best: list[dict]) -> list[str]:
    from specbench.cli.run_command import _fmt

    if not best:
        return ["best K per batch size: none (no point ran)"]
    return ["best K per batch size (by throughput):"] + [
        f"  B={b['batch_size']}: K={'-' if b['num_speculative_tokens'] is None else b['num_speculative_tokens']} "
        f"({_fmt(b['throughput_tokens_per_s'], 1)} tok/s, batch speedup {_fmt(b['batch_speedup'], 2)}x)" for b in best]


def cmd_sweep(args: argparse.Namespace) -> int:
    from specbench.run.batch import grid_cases, sweep_point, sweep_report
    from specbench.cli.run_command import _lossless_cell, _run_one, exit_status, lossless_report
    from specbench.env import environment_fingerprint
    from specbench.run.harness import load_target, to_json, write_json_atomic

    base, swept = _sweep_base(args.spec)
    overrides = {key: getattr(args, key) for key in SWEEP_OVERRIDES}
    batch_sizes = args.batch_sizes or swept or [base.batch_size or 1]
    draft_lengths = args.num_speculative_tokens or [None]
    grid = grid_cases(base, batch_sizes, draft_lengths, overrides)  # every point validated before anything loads
    target, tokenizer = load_target(grid[0])  # one target for the grid: the points differ in K and B only
    points, cells, reports = [], [], []
    from tqdm.auto import tqdm  # here: `specbench --help` need not load it

    for case in tqdm(grid, desc=f"sweep {base.case_id}", unit="point", disable=args.quiet):
        entry = _run_one(case, False, target=target, tokenizer=tokenizer)
        report = None if "error" in entry else lossless_report(entry)
        points.append(sweep_point(case, entry))
        cells.append(_lossless_cell(report.correctness) if report else "")
        reports.append(report)
    print(grid_table(points, cells))
    report = sweep_report(base, batch_sizes, draft_lengths, points,
                          environment_fingerprint(device=base.device, dtype=base.dtype))
    print()
    print("\n".join(best_lines(report["best"])))
    if args.output:
        write_json_atomic(args.output, to_json(report))
        print(f"wrote {args.output}")
    return 1 if None in reports else exit_status(reports)
