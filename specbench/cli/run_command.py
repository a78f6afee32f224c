"""``specbench run``: which cases to run, running them, the result table, the gate lines and the exit status."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import sys

from specbench.cases.requirements import hardware_shortfall
from specbench.cases import OVERRIDABLE, Case, find_case, with_overrides
from specbench.cli.errors import load_error
from specbench.gating.launch_bound import LAUNCH_BOUND_NOTE, launch_bound
from specbench.run.speed import PREDICTION_TOLERANCE

from specbench.cli.explicit_case import (  # noqa: F401 - the reference names are specbench.cli's too
    EXPLICIT_FLAGS, REFERENCE_MEDUSA, REFERENCE_TARGET, REFERENCE_TREE, _explicit_case, flag as _flag,
)

DEFAULT_SUITE = "medusa"  # with no SUITE given, only its CPU cases run (the embedded default)


# ---- which cases to run ----------------------------------------------------------------------------------


def _select(cases: list[Case], expression: str | None) -> list[Case]:
    """-k EXPR: keep cases whose name contains any comma-separated word; a leading 'not ' excludes."""
    if not expression:
        return cases
    if expression.startswith("not "):
        words = [w.strip() for w in expression[4:].split(",") if w.strip()]
        return [c for c in cases if not any(w in c.name for w in words)]
    words = [w.strip() for w in expression.split(",") if w.strip()]
    return [c for c in cases if any(w in c.name for w in words)]


def _stored_cases(args: argparse.Namespace) -> tuple[list[Case], dict[str, dict]]:
    """The stored cases SUITE|CASE and -k select, with the override flags applied: (cases, case id -> the
    settings its overrides changed, for the changed cases only)."""
    if args.name:
        raise ValueError("--name names the case of the explicit form (--target/--proposer/--prompts ...); a "
                         "stored case keeps its own name: drop --name")
    stored = find_case(args.spec) if args.spec else [c for c in find_case(DEFAULT_SUITE) if c.device == "cpu"]
    overrides = {key: getattr(args, key) for key in OVERRIDABLE}
    cases, changed = [], {}
    for case in _select(stored, args.k):
        case, changes = with_overrides(case, overrides)
        cases.append(case)
        if changes:
            changed[case.case_id] = changes
    if changed and args.update_baselines:
        case_id, changes = next(iter(changed.items()))
        flag = _flag(next(iter(changes)))
        raise ValueError(f"--update-baselines stores the baselines of the stored cases, and {flag} "
                         f"changes them (it would store {case_id}); drop the override, or edit the case in its suite "
                         "file and run `specbench baselines regenerate --reason TEXT`")
    return cases, changed


def _cases_to_run(args: argparse.Namespace) -> tuple[list[Case], dict[str, dict]]:
    """(cases, the changes overrides made to stored cases) for the two forms; mixing them is refused."""
    explicit = [flag for flag in EXPLICIT_FLAGS if getattr(args, flag) is not None]
    if explicit and args.spec:
        raise ValueError(f"{_flag(explicit[0])} describes a new case (the explicit form), so it cannot change the "
                         f"stored case(s) {args.spec!r}; drop {args.spec} to run the explicit form, or drop "
                         f"{_flag(explicit[0])} (the stored cases' settings are edited in their suite file)")
    if args.no_gate and args.update_baselines:
        raise ValueError("--no-gate has no effect with --update-baselines (it stores the results, it gates "
                         "nothing); drop --no-gate")
    if args.reason is not None and not args.update_baselines:
        raise ValueError("--reason is recorded only when baselines are stored: add --update-baselines, or drop "
                         "--reason (a run without it gates against the stored baselines)")
    if args.update_baselines:
        from specbench.gating.regenerate import require_reason

        require_reason(args.reason)  # before any case runs
    if args.no_gate and args.baselines:
        raise ValueError("--baselines has no effect with --no-gate (nothing is compared); drop one of them")
    if explicit:
        return [_explicit_case(args)], {}
    return _stored_cases(args)


def _runnable(cases: list[Case], verbose: bool) -> list[Case]:
    """Drop the cases this machine cannot run, saying so: each with -v, else in one line."""
    from specbench.report.status import plural

    from specbench.engines import engine_shortfall

    kept, skipped = [], []
    for case in cases:
        shortfall = hardware_shortfall(case) or engine_shortfall(case)
        if shortfall:
            skipped.append((case, shortfall))
        else:
            kept.append(case)
    if verbose:
        for case, shortfall in skipped:
            print(f"skipped: {case.case_id} (device={case.device!r}): {shortfall}", file=sys.stderr)
    elif skipped:
        why = "; ".join(sorted({shortfall for _, shortfall in skipped}))
        print(f"skipped {len(skipped)} of {plural(len(cases), 'case')} that this machine cannot run ({why}); "
              "-v lists them", file=sys.stderr)
    return kept


# ---- running ---------------------------------------------------------------------------------------------


def _run_one(case: Case, progress: bool, **loaded) -> dict:
    """The case's result dict; for a device fault (out of memory, a CUDA/CUBLAS/cuDNN error, a batched cache that
    does not fit) an error entry ``{"case", "case_id", "error": {"type", "message", "requested"}}`` instead, said
    in one line, after freeing what the case left behind, so that the next case runs. ``loaded``: run_case's
    ``target`` and ``tokenizer``, when already loaded."""
    from safetensors import SafetensorError

    from specbench.run.harness import case_fault, fault_line, free_device_memory, run_case

    try:
        return run_case(case, progress=progress, **loaded).to_dict()
    except (json.JSONDecodeError, UnicodeDecodeError, SafetensorError) as err:
        # raised by transformers or tokenizers, naming no file; specbench's own readers name theirs
        raise load_error(case, err) from err
    except (RuntimeError, MemoryError) as err:  # MemoryError: a batched cache that does not fit (check_cache_fits)
        fault = case_fault(err)
        if fault is None:
            raise
    # out of the except block: the traceback (and the frames holding the case's tensors) is gone
    free_device_memory()
    print(fault_line(case.case_id, fault), flush=True)
    return {"case": case.to_dict(), "case_id": case.case_id, "error": fault}


def _run_cases(cases: list[Case], quiet: bool) -> list[dict]:
    if not cases:
        raise ValueError("no case to run here (check SUITE, -k, and the skipped cases above)")
    return [_run_one(case, not quiet) for case in cases]


# ---- verdicts and output ---------------------------------------------------------------------------------


def lossless_report(result: dict):
    """A GateReport holding only the lossless check of ``result``: gates.check_correctness, with the tolerances
    resolved from the case (for a run that is not compared with a baseline: --no-gate, or overridden)."""
    from specbench.gating.gates import GateReport, check_conformance, check_correctness, resolve_tolerances

    case = result.get("case") or {}
    check = check_correctness(result, resolve_tolerances(case.get("tolerances"))["min_match_fraction"])
    check.case_id = result["case_id"]
    checks = [check, *filter(None, [check_conformance(result)])]  # an engine under test's verdict: docs/conformance.md
    return GateReport(result["case_id"], (result.get("env") or {}).get("hardware_class"), checks=checks)


def gate_results(results: list[dict], store, *, gate: bool = True, overridden=()) -> list:
    """One GateReport per result: against its stored baseline (``store``, a BaselineStore) when ``gate`` and the
    case is not ``overridden``; otherwise its lossless check alone. Either way the lossless verdict is
    gates.check_correctness's, so an exact fp32 match and a bf16/fp16 minimum match fraction are judged as the
    pytest plugin judges them."""
    from specbench.gating.baselines import compare

    return [compare(r, store) if gate and r["case_id"] not in overridden else lossless_report(r) for r in results]


def exit_status(reports: list) -> int:
    """0 when every report passed, 1 when a gate failed (a regression or a failed lossless check)."""
    return 0 if all(report.passed for report in reports) else 1


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if value != value else f"{value:.{digits}f}"
    return str(value)


def _lossless_cell(check) -> str:
    """The table's lossless column, from the lossless check's verdict (bf16/fp16: against its minimum)."""
    if check is None or check.status == "skipped":
        return "n/a (sampled)"
    minimum = f" (min {_fmt(check.baseline, 2)})" if check.name == "match_fraction" else ""
    if check.status != "pass":
        return f"DIVERGED {_fmt(check.measured)}{minimum}"
    return "exact" if check.measured == 1.0 else f"match {_fmt(check.measured)}{minimum}"


def _predicted_cell(metrics: dict) -> str:
    """The speedup the run's step costs predict for the decode phase (docs/metrics.md#step-costs), '!' past 10% off."""
    predicted = metrics.get("predicted_speedup")
    if predicted is None or predicted != predicted:  # NaN: an engine under test exposes no step costs
        return "-"
    error = metrics.get("speedup_prediction_error")
    off = error is not None and math.isfinite(error) and abs(error) > PREDICTION_TOLERANCE
    return _fmt(predicted, 2) + "x" + (" !" if off else "")


def results_table(results: list[dict], reports: list) -> str:
    """One row per result, its report alongside; an error entry (a faulted case, report None) reads ERROR."""
    header = ["case", "accept", "MAL", "per position", "tok/s", "plain tok/s", "speedup", "predicted", "lossless"]
    rows = []
    for r, report in zip(results, reports):
        if "error" in r:
            rows.append([r["case_id"], "ERROR", *["-"] * 6, f"ERROR {r['error']['type']}"])
            continue
        m = r["metrics"]
        per_position = "/".join(f"{x:.2f}" for x in m["per_position_acceptance_rate"]) or "-"
        # a tiny target on CUDA: the figure is the host's per-step work, and says so beside itself
        speedup = _fmt(m["speedup"], 2) + "x" + (" launch-bound" if launch_bound(r.get("case")) else "")
        rows.append([
            r["case_id"], _fmt(m["acceptance_rate"]), _fmt(m["mean_acceptance_length"], 2), per_position,
            _fmt(m["tokens_per_s"], 1), _fmt(m["plain_tokens_per_s"], 1), speedup,
            _predicted_cell(m), _lossless_cell(report.correctness),
        ])
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if any("error" not in r and launch_bound(r.get("case")) for r in results):
        lines.append(LAUNCH_BOUND_NOTE)
    return "\n".join(lines)


def curve_table(curve: dict) -> str:
    """A batch-size curve (run.batch.curves) as a table: per batch size, throughput, batch speedup, acceptance."""
    header = ["B", "throughput tok/s", "plain tok/s", "batch speedup", "accept", "MAL"]
    rows = [[str(p["batch_size"]), _fmt(p["throughput_tokens_per_s"], 1), _fmt(p["plain_throughput_tokens_per_s"], 1),
             _fmt(p["batch_speedup"], 2) + "x", _fmt(p["acceptance_rate"]), _fmt(p["mean_acceptance_length"], 2)]
            for p in curve["points"]]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in [header, *rows]]
    return "\n".join([f"batch-size curve of {curve['case_id']}:", *lines])


def gate_lines(reports: list, changed: dict[str, dict], *, verbose: bool) -> list[str]:
    """What a run prints about its gates: with -v every check of every case; by default a headline per case,
    each regression, failure and improvement, and one summary line per kind of check left out."""
    from specbench.gating.gates import skip_summary
    from specbench.report.status import plural

    if verbose:
        return [report.format() for report in reports]
    lines = [report.format(brief=True) for report in reports]
    if changed:
        flags = ", ".join(_flag(key) for key in dict.fromkeys(k for changes in changed.values() for k in changes))
        lines.append(f"{plural(len(changed), 'case')} changed by {flags}: not compared with the stored baselines, "
                     "lossless check only")
    summary = skip_summary(reports)
    return lines + [f"{line}; -v for details" for line in summary]


def _record(results: list[dict], reports: list | None, args: argparse.Namespace) -> None:
    """Append the runs (and their gate outcomes) to the results history unless --no-history."""
    if args.no_history:
        return
    from specbench.gating.history import append_results, default_history_dir

    directory = args.history or default_history_dir()
    path = append_results(directory, results, gate_reports=reports)
    print(f"recorded in {path} (`specbench report{' --history ' + shlex.quote(args.history) if args.history else ''}`"
          " renders the history)")


def _store(results: list[dict], baselines_dir: str | None, reason: str) -> None:
    """Store each result as its case's baseline with ``reason`` in the provenance, printing each diff."""
    from specbench.gating.regenerate import update_baseline

    command = "specbench " + shlex.join(sys.argv[1:])
    for result in results:
        print(update_baseline(result, baselines_dir, command=command, reason=reason).format())


def _torchrun_peer() -> bool:
    """This process is a rank other than 0 of a torchrun launch (docs/tensor_parallel.md)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and int(os.environ.get("RANK", "0")) > 0


def _run_as_peer(args: argparse.Namespace) -> int:
    """A torchrun rank other than 0: its share of each case, silently (no table, no --output, no history, no
    baselines; rank 0 says what it skips); rank 0 prints, gates, writes and records."""
    cases, _ = _cases_to_run(args)
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        with contextlib.redirect_stderr(sink):
            runnable = _runnable(cases, False)
        entries = _run_cases(runnable, True)
    return 1 if any("error" in entry for entry in entries) else 0


def cmd_run(args: argparse.Namespace) -> int:
    """``specbench run``. Under torchrun (docs/tensor_parallel.md) every rank runs this; a rank that fails on
    its share of a case says so (naming the rank) and exits 1, and torchrun stops the other ranks."""
    from specbench.distributed import TorchrunRankFailed, teardown
    from specbench.run.tensor_parallel import under_torchrun

    from specbench.cpu_threads import apply_policy

    policy = apply_policy(getattr(args, "threads", None))
    try:
        code = _run_as_peer(args) if _torchrun_peer() else _run_and_report(args, policy.note())
    except TorchrunRankFailed as failure:
        # no teardown: the peers may be inside a collective with this rank; torchrun ends them
        if args.verbose and not failure.peer_loss:
            import traceback

            traceback.print_exception(failure.cause, file=sys.stderr)
        print(f"specbench: error: {failure}", file=sys.stderr, flush=True)
        return 1
    if under_torchrun():
        teardown()  # every rank is past its last collective: leave torchrun's group before exiting
    return code


def _run_and_report(args: argparse.Namespace, cpu_note: str | None = None) -> int:
    """Run the cases, print the table and the gate lines (and ``cpu_note``: a shared or oversubscribed CPU),
    write --output, the history or the baselines."""
    from specbench.run.batch import curves
    from specbench.gating.baselines import BaselineStore
    from specbench.run.harness import to_json, write_json_atomic

    cases, changed = _cases_to_run(args)
    entries = _run_cases(_runnable(cases, args.verbose), args.quiet)  # results, and error entries of faulted cases
    results = [entry for entry in entries if "error" not in entry]
    errors = [entry for entry in entries if "error" in entry]
    gated = not args.no_gate and not args.update_baselines
    store = BaselineStore(args.baselines) if args.baselines else BaselineStore()
    reports = gate_results(results, store, gate=gated, overridden=changed)
    in_order = iter(reports)
    print(results_table(entries, [None if "error" in entry else next(in_order) for entry in entries]))
    for curve in curves(entries):
        print()
        print(curve_table(curve))
    if args.output:
        payload = entries[0] if len(entries) == 1 else {"results": entries}
        write_json_atomic(args.output, to_json(payload))
        print(f"wrote {args.output}")
    if errors and not args.no_history:
        # a history record is a run with metrics: a faulted case has none
        print(f"not recorded in the results history (no metrics): {', '.join(e['case_id'] for e in errors)}",
              file=sys.stderr)
    if args.update_baselines:
        if cpu_note:
            print(cpu_note)
        _store(results, args.baselines, args.reason)
        if results:
            _record(results, None, args)
        return 1 if errors else 0
    print()
    print("\n".join(gate_lines(reports, changed, verbose=args.verbose) + ([cpu_note] if cpu_note else [])))
    # a --no-gate run records no gate outcome: it was not compared with anything
    if results:
        _record(results, reports if gated else None, args)
    return 1 if errors else exit_status(reports)
