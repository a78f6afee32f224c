"""The ``specbench`` command: run cases and suites, manage baselines, print the environment."""

from __future__ import annotations

import argparse
import json
import sys

from specbench.cases import DEFAULT_TARGET, Case, builtin_suites, find_case

DEFAULT_SUITE = "demo"

EPILOG = """examples:
  specbench run                                  # the default suite on CPU, no download
  specbench run demo/tiny-ngram-k3               # one case of a suite
  specbench run --proposer ngram -k 4 --prompts prompts.jsonl --output result.json
  specbench env                                  # the environment fingerprint as JSON
"""


def _explicit_case(args: argparse.Namespace) -> Case:
    proposer = {"name": args.proposer}
    if args.num_speculative_tokens is not None:
        proposer["num_speculative_tokens"] = args.num_speculative_tokens
    if args.proposer_path:
        proposer["path"] = args.proposer_path
    if args.tree:
        proposer["tree"] = args.tree
    prompts = {"name": args.prompts}
    if args.num_prompts:
        prompts["num_prompts"] = args.num_prompts
    sampling = {"temperature": args.temperature}
    return Case(
        name=args.name or f"{args.proposer}",
        suite="cli",
        target=args.target,
        proposer=proposer,
        prompts=prompts,
        sampling=sampling,
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


def cmd_run(args: argparse.Namespace) -> int:
    from specbench.harness import run_case, to_json, write_json_atomic

    if args.proposer is not None:
        if args.spec:
            raise SystemExit("specbench run: give either SUITE|CASE or the explicit --proposer form, not both")
        if not args.prompts:
            raise SystemExit("specbench run: --prompts NAME|FILE is required with --proposer")
        cases = [_explicit_case(args)]
    else:
        cases = find_case(args.spec or DEFAULT_SUITE)
    results = []
    for case in cases:
        results.append(run_case(case, progress=not args.quiet).to_dict())
    print(results_table(results))
    if args.output:
        payload = results[0] if len(results) == 1 else {"results": results}
        write_json_atomic(args.output, to_json(payload))
        print(f"wrote {args.output}")
    return 0 if all(r["correctness"]["exact"] or not r["correctness"]["checked"] for r in results) else 1


def cmd_env(args: argparse.Namespace) -> int:
    from specbench.env import environment_fingerprint

    print(json.dumps(environment_fingerprint(device=args.device), indent=2, sort_keys=True))
    return 0


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
    run.add_argument("--target", default=DEFAULT_TARGET, help="model reference: local dir, hub id (org/name) or built-in name")
    run.add_argument("--proposer", help="proposer name (none, ngram, medusa, or an installed plug-in); selects the explicit form")
    run.add_argument("--proposer-path", help="proposer checkpoint (e.g. a Medusa heads directory or hub id)")
    run.add_argument("-k", "--num-speculative-tokens", type=int, help="draft tokens per step (chain proposers)")
    run.add_argument("--tree", help="Medusa tree: a name from the shipped/published trees or a JSON file of paths")
    run.add_argument("--prompts", help="prompt set name (gsm8k, spec_bench, mt_bench, spec_bench/<task>, synthetic) or a JSONL file")
    run.add_argument("--num-prompts", type=int, help="use the first N prompts")
    run.add_argument("--max-new-tokens", type=int, default=64)
    run.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (lossless check applies)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--ignore-eos", action="store_true", help="always generate max-new-tokens")
    run.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    run.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda:0")
    run.add_argument("--name", help="case name for the explicit form (default: the proposer name)")
    run.add_argument("--output", help="write the result JSON here (atomically)")
    run.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    run.set_defaults(func=cmd_run)

    env = sub.add_parser("env", help="print the environment fingerprint stored with every result")
    env.add_argument("--device", default=None, help="device whose GPU to describe (default: cuda:0 if present)")
    env.set_defaults(func=cmd_env)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"specbench: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
