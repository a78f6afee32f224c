"""The ``specbench`` command: run cases and suites, manage baselines, print the environment."""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from specbench.cases import Case, builtin_suites, find_case

DEFAULT_SUITE = "medusa"  # with no SUITE given, only its CPU cases run (the embedded default)

EPILOG = """examples:
  specbench run                                  # the default suite on CPU, no download
  specbench run demo/tiny-ngram-k3               # one case of a suite
  specbench run --prompts gsm8k --num-prompts 80      # reference target + Medusa heads + calibrated tree
  specbench run --proposer ngram --num-speculative-tokens 4 --prompts prompts.jsonl --output result.json
  specbench env                                  # the environment fingerprint as JSON
"""


REFERENCE_TARGET = "specbench-ref/gsm8k-tiny"
REFERENCE_MEDUSA = "specbench-ref/gsm8k-tiny-medusa"
REFERENCE_TREE = "gsm8k-tiny-63"
EXPLICIT_FLAGS = ("target", "proposer", "proposer_path", "tree", "num_speculative_tokens", "prompts")


def _explicit_case(args: argparse.Namespace) -> Case:
    """The case the explicit flags describe; what is left out takes the shipped defaults: the reference
    target, its Medusa heads and their calibrated tree."""
    if not args.prompts:
        raise ValueError("--prompts NAME|FILE is required in the explicit form (e.g. --prompts gsm8k)")
    target = args.target or REFERENCE_TARGET
    proposer = {"name": args.proposer or "medusa"}
    if args.num_speculative_tokens is not None:
        proposer["num_speculative_tokens"] = args.num_speculative_tokens
    if args.tree:
        proposer["tree"] = args.tree
    if args.proposer_path:
        proposer["path"] = args.proposer_path
    if proposer["name"] == "medusa":
        if "path" not in proposer:
            if target != REFERENCE_TARGET:
                raise ValueError(f"--proposer medusa with --target {target} needs --proposer-path (its Medusa heads)")
            proposer["path"] = REFERENCE_MEDUSA
        if "tree" not in proposer and "num_speculative_tokens" not in proposer:
            if proposer["path"] != REFERENCE_MEDUSA:
                raise ValueError("--proposer medusa needs --num-speculative-tokens K (a chain) or --tree NAME|FILE")
            proposer["tree"] = REFERENCE_TREE
    prompts = {"name": args.prompts}
    if args.num_prompts:
        prompts["num_prompts"] = args.num_prompts
    if args.prompts == "gsm8k":
        # the reference models were trained on zero-shot "Question: ...\nAnswer:" text
        prompts["n_shot"] = args.n_shot if args.n_shot is not None else (0 if target.startswith("specbench-ref/") else 1)
    return Case(
        name=args.name or proposer["name"],
        suite="cli",
        target=target,
        proposer=proposer,
        prompts=prompts,
        sampling={"temperature": args.temperature},
        dtype=args.dtype,
        device=args.device,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        ignore_eos=args.ignore_eos,
    )


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if value != value else f"{value:.{digits}f}"
    return str(value)


def results_table(results: list[dict]) -> str:
    header = ["case", "accept", "MAL", "per position", "tok/s", "plain tok/s", "speedup", "lossless"]
    rows = []
    for r in results:
        m = r["metrics"]
        per_position = "/".join(f"{x:.2f}" for x in m["per_position_acceptance_rate"]) or "-"
        lossless = ("exact" if r["correctness"]["exact"] else f"DIVERGED {r['correctness']['match_fraction']:.3f}") if r["correctness"]["checked"] else "n/a (sampled)"
        rows.append([
            r["case_id"], _fmt(m["acceptance_rate"]), _fmt(m["mean_acceptance_length"], 2), per_position,
            _fmt(m["tokens_per_s"], 1), _fmt(m["plain_tokens_per_s"], 1), _fmt(m["speedup"], 2) + "x", lossless,
        ])
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)) for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _select(cases: list[Case], expression: str | None) -> list[Case]:
    """-k EXPR: keep cases whose name contains any comma-separated word; a leading 'not ' excludes."""
    if not expression:
        return cases
    if expression.startswith("not "):
        words = [w.strip() for w in expression[4:].split(",") if w.strip()]
        return [c for c in cases if not any(w in c.name for w in words)]
    words = [w.strip() for w in expression.split(",") if w.strip()]
    return [c for c in cases if any(w in c.name for w in words)]


def _runnable(cases: list[Case]) -> list[Case]:
    """Drop (and say so) the cases this machine cannot run."""
    from specbench.cases import unmet_requirements

    kept = []
    for case in cases:
        reason = unmet_requirements(case)
        if reason:
            print(f"skipped: {reason}", file=sys.stderr)
        else:
            kept.append(case)
    return kept


def _run_cases(cases: list[Case], quiet: bool) -> list[dict]:
    from specbench.harness import run_case

    if not cases:
        raise ValueError("no case to run here (check SUITE, -k, and the skipped cases above)")
    return [run_case(case, progress=not quiet).to_dict() for case in cases]


def _store(results: list[dict], baselines_dir: str | None) -> None:
    from specbench.gating.regenerate import update_baseline

    command = "specbench " + shlex.join(sys.argv[1:])
    for result in results:
        print(update_baseline(result, baselines_dir, command=command).format())


def cmd_run(args: argparse.Namespace) -> int:
    from specbench.gating.baselines import BaselineStore, compare
    from specbench.harness import to_json, write_json_atomic

    if any(getattr(args, flag) is not None for flag in EXPLICIT_FLAGS):
        if args.spec:
            raise ValueError("give either SUITE|CASE or the explicit form (--target/--proposer/--prompts ...), not both")
        cases = [_explicit_case(args)]
    elif args.spec:
        cases = _select(find_case(args.spec), args.k)
    else:
        cases = _select([c for c in find_case(DEFAULT_SUITE) if c.device == "cpu"], args.k)
    cases = _runnable(cases)
    results = _run_cases(cases, args.quiet)
    print(results_table(results))
    if args.output:
        payload = results[0] if len(results) == 1 else {"results": results}
        write_json_atomic(args.output, to_json(payload))
        print(f"wrote {args.output}")
    if args.update_baselines:
        _store(results, args.baselines)
        return 0
    passed = True
    reports = []
    if not args.no_gate:
        store = BaselineStore(args.baselines) if args.baselines else BaselineStore()
        print()
        for result in results:
            report = compare(result, store)
            reports.append(report.to_dict())
            passed &= report.passed
            print(report.format(only_problems=True))
    if args.history:
        from specbench.gating.history import append_results

        print(f"appended to {append_results(args.history, results, gate_reports=reports or None)}")
    lossless = all(r["correctness"]["exact"] or not r["correctness"]["checked"] for r in results)
    return 0 if passed and lossless else 1


def cmd_baselines_regenerate(args: argparse.Namespace) -> int:
    if args.from_results:
        _store(_recorded_results(args), args.baselines)
        return 0
    cases = _runnable(_select(find_case(args.suite or DEFAULT_SUITE), args.k))
    _store(_run_cases(cases, args.quiet), args.baselines)
    return 0


def _recorded_results(args: argparse.Namespace) -> list[dict]:
    """Results recorded elsewhere (a GPU job's ``--specbench-results``), filtered by suite and -k like cases."""
    from specbench.cases import Case
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


def cmd_baselines_show(args: argparse.Namespace) -> int:
    from specbench.gating.baselines import BaselineStore

    store = BaselineStore(args.baselines) if args.baselines else BaselineStore()
    for case_id in store.case_ids():
        if args.suite and not case_id.startswith(args.suite + "/"):
            continue
        entry = store.entry(case_id)
        quality = entry["quality"]["metrics"]
        speed = ", ".join(
            f"{hw}: {_fmt(v['metrics']['tokens_per_s'], 1)} tok/s, {_fmt(v['metrics']['speedup'], 2)}x"
            for hw, v in sorted(entry["speed"].items())
        )
        print(
            f"{case_id}: acceptance {_fmt(quality['acceptance_rate'])}, MAL {_fmt(quality['mean_acceptance_length'], 2)}, "
            f"per position {[round(x, 3) for x in quality['per_position_acceptance_rate']]}; {speed}"
        )
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    from specbench.env import environment_fingerprint

    print(json.dumps(environment_fingerprint(device=args.device), indent=2, sort_keys=True))
    return 0


BASELINES_HELP = "baseline directory (default: $SPECBENCH_BASELINES_DIR or <repo>/baselines)"


def _add_selection_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by the commands that run cases: -k selection, the baseline directory, quiet."""
    parser.add_argument("-k", dest="k", metavar="EXPR", help="only cases whose name contains a comma-separated word ('not w' excludes)")
    parser.add_argument("--baselines", metavar="DIR", help=BASELINES_HELP)
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specbench",
        description="Test harness and regression benchmarks for speculative decoding: did acceptance, "
        "correctness or speed regress, and by how much?",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EPILOG,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run",
        help="run a suite, one case, or an explicit target/proposer/prompts combination",
        description="Run plain and speculative decoding through the same engine and report acceptance rate, "
        "mean acceptance length, per-position acceptance, tokens/s and speedup. With no arguments runs the "
        f"'{DEFAULT_SUITE}' suite. Built-in suites: {', '.join(builtin_suites())}.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    run.add_argument("spec", nargs="?", help="SUITE, SUITE/CASE, or a .toml case file")
    run.add_argument("--target", help=f"model reference: local dir, hub id (org/name) or specbench-ref/... (default {REFERENCE_TARGET})")
    run.add_argument("--proposer", help="proposer name: none, ngram, medusa, or an installed plug-in (default medusa)")
    run.add_argument("--proposer-path", help="proposer checkpoint (e.g. a Medusa heads directory or hub id)")
    run.add_argument("--num-speculative-tokens", type=int, help="draft tokens per step (chain proposers)")
    run.add_argument("--tree", help="Medusa tree: a name from the shipped/published trees or a JSON file of paths")
    run.add_argument("--prompts", help="prompt set name (gsm8k, spec_bench, mt_bench, spec_bench/<task>, synthetic) or a JSONL file")
    run.add_argument("--num-prompts", type=int, help="use the first N prompts")
    run.add_argument("--n-shot", type=int, help="GSM8K worked examples per prompt (default 0 for specbench-ref targets, else 1)")
    run.add_argument("--max-new-tokens", type=int, default=64)
    run.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (lossless check applies)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--ignore-eos", action="store_true", help="always generate max-new-tokens")
    run.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    run.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda:0")
    run.add_argument("--name", help="case name for the explicit form (default: the proposer name)")
    run.add_argument("--output", help="write the result JSON here (atomically)")
    _add_selection_arguments(run)
    run.add_argument("--no-gate", action="store_true", help="report only; do not compare with stored baselines")
    run.add_argument("--update-baselines", action="store_true", help="store the results as baselines (refused if a lossless check fails)")
    run.add_argument("--history", metavar="DIR", help="append the results (and gate outcomes) to this results-history directory")
    run.set_defaults(func=cmd_run)

    baselines = sub.add_parser("baselines", help="show or regenerate stored baselines")
    baselines_sub = baselines.add_subparsers(dest="baselines_command", required=True)
    regenerate = baselines_sub.add_parser(
        "regenerate",
        help="re-run a suite's cases and store their results as baselines",
        description="Re-run the cases and store each result as its baseline, atomically, printing an old -> new "
        "diff per metric. Quality metrics are stored once; speed metrics under this machine's hardware class. "
        "A run whose lossless check fails is refused.",
    )
    regenerate.add_argument("suite", nargs="?", help=f"suite name or .toml file (default: {DEFAULT_SUITE}; "
                            "with --from-results: only that suite's results, default all)")
    regenerate.add_argument("--from-results", nargs="+", metavar="FILE",
                            help="store results already measured instead of re-running: pytest --specbench-results "
                            ".jsonl files or specbench run --output files (e.g. from a GPU job); the last result "
                            "of each case wins; speed goes under the hardware class the result records")
    _add_selection_arguments(regenerate)
    regenerate.set_defaults(func=cmd_baselines_regenerate)
    show = baselines_sub.add_parser("show", help="print the stored baselines")
    show.add_argument("suite", nargs="?")
    show.add_argument("--baselines", metavar="DIR", help=BASELINES_HELP)
    show.set_defaults(func=cmd_baselines_show)

    env = sub.add_parser("env", help="print the environment fingerprint stored with every result")
    env.add_argument("--device", default=None, help="device whose GPU to describe (default: cuda:0 if present)")
    env.set_defaults(func=cmd_env)

    from specbench import calibrate
    from specbench.report.cli import add_report_subcommands
    from specbench.zoo.cli import add_zoo_subcommand

    calibrate_parser = sub.add_parser(
        "calibrate-tree", help="calibrate a Medusa tree for a checkpoint from measured head accuracies",
        description=calibrate.__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    calibrate.add_arguments(calibrate_parser)
    calibrate_parser.set_defaults(func=calibrate.run)
    add_report_subcommands(sub)
    add_zoo_subcommand(sub)
    return parser


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors caused by input (bad names, missing data or models): printed in one line, exit code 2."""
    from specbench.gating.baselines import BaselineError
    from specbench.checkpoints.resolve import ModelUnavailable
    from specbench.checkpoints.tensor_files import CheckpointError
    from specbench.prompts import DatasetUnavailable

    return (ValueError, FileNotFoundError, BaselineError, ModelUnavailable, CheckpointError, DatasetUnavailable)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except _user_errors() as err:
        print(f"specbench: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
