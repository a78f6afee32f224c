"""The ``specbench`` command: run cases and suites, manage baselines, print the environment."""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from specbench.cases import (
    DTYPE_NAMES,
    OVERRIDABLE,
    Case,
    argument_type,
    builtin_suites,
    find_case,
    hardware_shortfall,
    parse_device,
    with_overrides,
)

DEFAULT_SUITE = "medusa"  # with no SUITE given, only its CPU cases run (the embedded default)

EPILOG = """examples:
  specbench run                                  # the default suite on CPU, no download
  specbench run demo/tiny-ngram-k3               # one case of a suite
  specbench run medusa/chain-k3 --num-prompts 2 --max-new-tokens 8   # a quick look (no baseline: see run --help)
  specbench run --prompts gsm8k --num-prompts 80      # reference target + Medusa heads + calibrated tree
  specbench run --proposer ngram --num-speculative-tokens 4 --prompts prompts.jsonl --output result.json
  specbench report                               # the dashboard of every run recorded so far
  specbench env                                  # the environment fingerprint as JSON

exit status: 0 every gate passed, 1 a regression or a failed lossless check, 2 bad input
"""

RUN_DESCRIPTION = f"""\
Run plain and speculative decoding through the same engine; report acceptance rate,
mean acceptance length, per-position acceptance, tokens/s and speedup; check greedy output token for
token; gate the results against the stored baselines; and append them to the results history that
`specbench report` renders.

Two forms:
  SUITE | SUITE/CASE | FILE.toml   stored cases (no argument: the CPU cases of the '{DEFAULT_SUITE}' suite;
                                   built-in suites: {', '.join(builtin_suites())})
  --target/--proposer/--proposer-path/--tree/--num-speculative-tokens/--prompts
                                   the explicit form: one new case, cli/NAME (--prompts is required)

Overrides: --max-new-tokens, --num-prompts, --n-shot, --temperature, --seed, --ignore-eos, --dtype and
--device change the stored cases they run. A changed case is renamed after its changes, e.g.
medusa/chain-k3[max_new_tokens=8,num_prompts=2], so it is never gated against the unmodified case's
baseline: it has no baseline (only its lossless check decides the exit status), --update-baselines refuses
it, and the history records it under its own name.

exit status: 0 every gate passed, 1 a regression or a failed lossless check, 2 bad input (a flag, a case,
prompt, checkpoint, baseline or history file)
"""

REFERENCE_TARGET = "specbench-ref/gsm8k-tiny"
REFERENCE_MEDUSA = "specbench-ref/gsm8k-tiny-medusa"
REFERENCE_TREE = "gsm8k-tiny-63"
EXPLICIT_FLAGS = ("target", "proposer", "proposer_path", "tree", "num_speculative_tokens", "prompts")
_EXPLICIT_DEFAULTS = Case(name="cli")  # what the explicit form takes for a setting left out


class UsageError(Exception):
    """A command line that argparse refused: printed as one line, exit status 2."""


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but a refused command line is one line on stderr (flag, value, what is expected), not the
    whole usage block; main() turns it into exit status 2. Subcommand parsers inherit the class."""

    def error(self, message: str):
        raise UsageError(f"{self.prog}: error: {message} (see `{self.prog} --help`)")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


# ---- which cases to run ----------------------------------------------------------------------------------


def _parse_proposer(text: str) -> str:
    """argparse ``type=`` for --proposer: a registered proposer or "none" (plain decoding only)."""
    from specbench.proposers.registry import ENTRY_POINT_GROUP, available_proposers

    known = sorted({"none", *available_proposers()})
    if text not in known:
        raise argparse.ArgumentTypeError(f"unknown proposer {text!r}; expected one of {', '.join(known)} (plug-ins "
                                         f"register under the entry-point group {ENTRY_POINT_GROUP!r})")
    return text


def _explicit_proposer(args: argparse.Namespace, target: str) -> dict:
    """The proposer table of the explicit form; flags that do not apply to the chosen proposer are refused."""
    proposer = {"name": args.proposer or "medusa"}
    given = [flag for flag in ("proposer_path", "tree", "num_speculative_tokens") if getattr(args, flag) is not None]
    if proposer["name"] == "none" and given:
        raise ValueError(f"--proposer none decodes plainly, so {_flag(given[0])} does not apply; drop it")
    if args.tree is not None and proposer["name"] != "medusa":
        raise ValueError(f"--tree applies to --proposer medusa only, not {proposer['name']!r}; drop --tree")
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
    return proposer


def _explicit_case(args: argparse.Namespace) -> Case:
    """The case the explicit flags describe; what is left out takes the shipped defaults: the reference
    target, its Medusa heads and their calibrated tree, and Case's own defaults for the run settings."""
    if not args.prompts:
        raise ValueError("--prompts NAME|FILE is required in the explicit form (e.g. --prompts gsm8k)")
    if args.k:
        raise ValueError("-k selects cases of a suite, and the explicit form runs the one case its flags "
                         "describe; drop -k")
    target = args.target or REFERENCE_TARGET
    prompts = {"name": args.prompts}
    if args.num_prompts:
        prompts["num_prompts"] = args.num_prompts
    if args.prompts == "gsm8k":
        # the reference models were trained on zero-shot "Question: ...\nAnswer:" text
        prompts["n_shot"] = args.n_shot if args.n_shot is not None else (0 if target.startswith("specbench-ref/") else 1)
    elif args.n_shot is not None:
        raise ValueError(f"--n-shot applies to --prompts gsm8k only, not {args.prompts!r}; drop --n-shot")
    d = _EXPLICIT_DEFAULTS
    return Case.from_dict({
        "name": args.name or args.proposer or "medusa", "suite": "cli", "target": target,
        "proposer": _explicit_proposer(args, target), "prompts": prompts,
        "sampling": {"temperature": args.temperature if args.temperature is not None else 0.0},
        "dtype": args.dtype or d.dtype, "device": args.device or d.device,
        "max_new_tokens": args.max_new_tokens or d.max_new_tokens,
        "seed": args.seed if args.seed is not None else d.seed, "ignore_eos": bool(args.ignore_eos),
    }, origin="the explicit form")


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
                         "file and run `specbench baselines regenerate`")
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
    if args.no_gate and args.baselines:
        raise ValueError("--baselines has no effect with --no-gate (nothing is compared); drop one of them")
    if explicit:
        return [_explicit_case(args)], {}
    return _stored_cases(args)


def _runnable(cases: list[Case], verbose: bool) -> list[Case]:
    """Drop the cases this machine cannot run, saying so: each with -v, else in one line."""
    from specbench.report.status import plural

    kept, skipped = [], []
    for case in cases:
        shortfall = hardware_shortfall(case)
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


def _quiet_libraries() -> None:
    """-q, of any command: no progress bars from the libraries either (transformers' weight loading,
    huggingface_hub's downloads), nor transformers' warnings."""
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()
    disable_progress_bars()


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def _damaged_file(case: Case) -> str | None:
    """The first file of the case's model directories (target, proposer checkpoint) that does not parse, with
    the reason: the libraries that read them (transformers, tokenizers) say what is wrong but not where."""
    from safetensors import safe_open

    from specbench.cases import expand_ref
    from specbench.checkpoints.resolve import resolve_model_dir

    for ref in filter(None, (case.target, case.proposer.get("path"))):
        try:
            directory = resolve_model_dir(expand_ref(ref))
        except Exception:  # noqa: BLE001 - a reference that does not resolve was not what failed to parse
            continue
        for path in sorted(directory.glob("*.json")):
            try:
                json.loads(path.read_text(encoding="utf-8"))
            except (ValueError, OSError) as err:
                return f"{path}: not valid JSON ({_first_line(err)})"
        for path in sorted(directory.glob("*.safetensors")):
            try:
                with safe_open(path, framework="pt"):
                    pass
            except Exception as err:  # noqa: BLE001 - SafetensorError and OSError alike mean "cannot be read"
                return f"{path}: truncated or corrupt safetensors file ({_first_line(err)})"
    return None


def _load_error(case: Case, err: BaseException) -> ValueError:
    """A one-line error for a model file that a library failed to read, naming the file where it can be found."""
    damaged = _damaged_file(case)
    if damaged:
        return ValueError(f"{damaged}; re-download or re-export the model (case {case.case_id})")
    models = " and ".join(repr(ref) for ref in filter(None, (case.target, case.proposer.get("path"))))
    return ValueError(f"case {case.case_id}: a file of {models} could not be read ({type(err).__name__}: "
                      f"{_first_line(err)}); check the files of those model directories, or re-download them")


def _run_one(case: Case, progress: bool) -> dict:
    from safetensors import SafetensorError

    from specbench.harness import run_case

    try:
        return run_case(case, progress=progress).to_dict()
    except (json.JSONDecodeError, UnicodeDecodeError, SafetensorError) as err:
        # raised by transformers or tokenizers, naming no file; specbench's own readers name theirs
        raise _load_error(case, err) from err


def _run_cases(cases: list[Case], quiet: bool) -> list[dict]:
    if not cases:
        raise ValueError("no case to run here (check SUITE, -k, and the skipped cases above)")
    return [_run_one(case, not quiet) for case in cases]


# ---- verdicts and output ---------------------------------------------------------------------------------


def lossless_report(result: dict):
    """A GateReport holding only the lossless check of ``result``: gates.check_correctness, with the tolerances
    resolved from the case (for a run that is not compared with a baseline: --no-gate, or overridden)."""
    from specbench.gating.gates import GateReport, check_correctness, resolve_tolerances

    case = result.get("case") or {}
    check = check_correctness(result, resolve_tolerances(case.get("tolerances"))["min_match_fraction"])
    check.case_id = result["case_id"]
    return GateReport(result["case_id"], (result.get("env") or {}).get("hardware_class"), checks=[check])


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


def results_table(results: list[dict], reports: list) -> str:
    header = ["case", "accept", "MAL", "per position", "tok/s", "plain tok/s", "speedup", "lossless"]
    rows = []
    for r, report in zip(results, reports):
        m = r["metrics"]
        per_position = "/".join(f"{x:.2f}" for x in m["per_position_acceptance_rate"]) or "-"
        rows.append([
            r["case_id"], _fmt(m["acceptance_rate"]), _fmt(m["mean_acceptance_length"], 2), per_position,
            _fmt(m["tokens_per_s"], 1), _fmt(m["plain_tokens_per_s"], 1), _fmt(m["speedup"], 2) + "x",
            _lossless_cell(report.correctness),
        ])
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


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


def _store(results: list[dict], baselines_dir: str | None) -> None:
    from specbench.gating.regenerate import update_baseline

    command = "specbench " + shlex.join(sys.argv[1:])
    for result in results:
        print(update_baseline(result, baselines_dir, command=command).format())


def cmd_run(args: argparse.Namespace) -> int:
    from specbench.gating.baselines import BaselineStore
    from specbench.harness import to_json, write_json_atomic

    cases, changed = _cases_to_run(args)
    results = _run_cases(_runnable(cases, args.verbose), args.quiet)
    gated = not args.no_gate and not args.update_baselines
    store = BaselineStore(args.baselines) if args.baselines else BaselineStore()
    reports = gate_results(results, store, gate=gated, overridden=changed)
    print(results_table(results, reports))
    if args.output:
        payload = results[0] if len(results) == 1 else {"results": results}
        write_json_atomic(args.output, to_json(payload))
        print(f"wrote {args.output}")
    if args.update_baselines:
        _store(results, args.baselines)
        _record(results, None, args)
        return 0
    print()
    print("\n".join(gate_lines(reports, changed, verbose=args.verbose)))
    # a --no-gate run records no gate outcome: it was not compared with anything
    _record(results, reports if gated else None, args)
    return exit_status(reports)


# ---- baselines and env -----------------------------------------------------------------------------------


def cmd_baselines_regenerate(args: argparse.Namespace) -> int:
    if args.from_results:
        _store(_recorded_results(args), args.baselines)
        return 0
    cases = _runnable(_select(find_case(args.suite or DEFAULT_SUITE), args.k), verbose=True)
    _store(_run_cases(cases, args.quiet), args.baselines)
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
                         f"with `specbench baselines regenerate {suite}`")
    return shown


def cmd_baselines_show(args: argparse.Namespace) -> int:
    from specbench.gating.baselines import BaselineStore

    store = BaselineStore(args.baselines) if args.baselines else BaselineStore()
    if args.baselines and not store.directory.is_dir():
        raise ValueError(f"baseline directory {store.directory} does not exist; pass the directory that holds "
                         "<suite>.json files")
    shown = _shown_case_ids(store, args.suite)
    if not shown:
        print(f"no baselines stored in {store.directory}; store them with `specbench baselines regenerate SUITE`",
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
            f"per position {[round(x, 3) for x in quality['per_position_acceptance_rate']]}; {speed}"
        )
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    from specbench.env import environment_fingerprint

    print(json.dumps(environment_fingerprint(device=args.device), indent=2, sort_keys=True))
    return 0


# ---- the parser ------------------------------------------------------------------------------------------

BASELINES_HELP = "baseline directory (default: $SPECBENCH_BASELINES_DIR or <repo>/baselines)"
# "the case's" default: in the stored-case form a flag left out keeps the case's setting
RUN_SETTINGS_HELP = {
    "num_prompts": "use the first N prompts of the set (default: the case's; the whole set in the explicit form)",
    "n_shot": "GSM8K worked examples per prompt, gsm8k prompts only (default: the case's; in the explicit form 0 "
              "for specbench-ref targets, else 1)",
    "max_new_tokens": "tokens to generate per prompt (default: the case's; 64 in the explicit form)",
    "temperature": "sampling temperature: 0 is greedy, where the lossless check applies; above 0 the run samples, "
                   "verified by lossless rejection sampling (default: the case's; 0 in the explicit form)",
    "seed": "random seed: prompt i is decoded with seed N + i, plainly and speculatively alike (default: the case's; "
            "0 in the explicit form)",
    "ignore_eos": "always generate --max-new-tokens tokens, past end-of-sequence (default: the case's; off in the "
                  "explicit form)",
    "dtype": "weights and activations dtype; bfloat16/float16 runs are judged by a minimum match fraction, not "
             "exactness (default: the case's; float32 in the explicit form)",
    "device": "torch device: cpu, cuda, cuda:N or mps; refused when this machine lacks it (default: the case's; "
              "cpu in the explicit form)",
}


def _add_selection_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by the commands that run cases: -k selection, the baseline directory, quiet."""
    parser.add_argument("-k", dest="k", metavar="EXPR",
                        help="only the cases whose name contains one of these comma-separated words ('not w' excludes)")
    parser.add_argument("--baselines", metavar="DIR", help=BASELINES_HELP)
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress bars (specbench's, nor transformers' weight loading, nor hub downloads)")


def _add_explicit_arguments(run: argparse.ArgumentParser) -> None:
    explicit = run.add_argument_group("the explicit form (a new case, cli/NAME; not with SUITE|CASE)")
    explicit.add_argument("--target", metavar="REF", help="target model: a local directory, a hub id (org/name) or "
                          f"specbench-ref/... (default {REFERENCE_TARGET})")
    explicit.add_argument("--proposer", type=_parse_proposer, metavar="NAME",
                          help="none (plain decoding only), medusa, ngram, or an installed plug-in (default medusa)")
    explicit.add_argument("--proposer-path", metavar="REF", help="the proposer's checkpoint, e.g. Medusa heads: a "
                          f"directory or hub id (default {REFERENCE_MEDUSA} with the reference target)")
    explicit.add_argument("--num-speculative-tokens", type=argument_type("num_speculative_tokens"), metavar="K",
                          help="draft tokens per step, a chain of K (medusa, ngram)")
    explicit.add_argument("--tree", metavar="NAME|FILE", help="Medusa tree: a shipped or published tree name (e.g. "
                          f"{REFERENCE_TREE}, mc_sim_7b_63) or a JSON file of paths (default {REFERENCE_TREE} with "
                          "the reference heads and no --num-speculative-tokens)")
    explicit.add_argument("--prompts", metavar="NAME|FILE", help="required: a prompt set (gsm8k, gsm8k-embedded, "
                          "spec_bench, spec_bench/<task>, mt_bench, synthetic) or a JSONL file")
    explicit.add_argument("--name", type=argument_type("name", str),
                          help="the case name, its id being cli/NAME (default: the proposer name)")


def _add_setting_arguments(run: argparse.ArgumentParser) -> None:
    settings = run.add_argument_group("run settings (both forms; on stored cases, overrides)")
    h = RUN_SETTINGS_HELP
    settings.add_argument("--num-prompts", type=argument_type("num_prompts"), metavar="N", help=h["num_prompts"])
    settings.add_argument("--n-shot", type=argument_type("n_shot"), metavar="N", help=h["n_shot"])
    settings.add_argument("--max-new-tokens", type=argument_type("max_new_tokens"), metavar="N",
                          help=h["max_new_tokens"])
    settings.add_argument("--temperature", type=argument_type("temperature", float), metavar="T", help=h["temperature"])
    settings.add_argument("--seed", type=argument_type("seed"), metavar="N", help=h["seed"])
    settings.add_argument("--ignore-eos", action="store_true", default=None, help=h["ignore_eos"])
    settings.add_argument("--dtype", choices=DTYPE_NAMES, help=h["dtype"])
    settings.add_argument("--device", type=parse_device, help=h["device"])


def _add_output_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument("--output", metavar="FILE", help="write the full result JSON here, atomically (one result, or "
                     "{\"results\": [...]} for several)")
    _add_selection_arguments(run)
    run.add_argument("-v", "--verbose", action="store_true", help="every check of every case, and each skipped "
                     "case's reason (default: a line per case, its problems, and one summary line per kind of skip)")
    run.add_argument("--no-gate", action="store_true", help="report only: do not compare with the stored baselines "
                     "(the lossless check still decides the exit status)")
    run.add_argument("--update-baselines", action="store_true", help="store the results as the cases' baselines "
                     "instead of gating them (refused when a lossless check fails, and for overridden cases)")
    history = run.add_mutually_exclusive_group()
    history.add_argument("--history", metavar="DIR", help="the results history to append the runs and their gate "
                         "outcomes to (default: $SPECBENCH_HISTORY_DIR or <repo>/.specbench/history, where "
                         "`specbench report` reads)")
    history.add_argument("--no-history", action="store_true", help="record the runs in no results history")


def _add_run_command(sub) -> None:
    run = sub.add_parser(
        "run", help="run a suite, one case, or an explicit target/proposer/prompts combination",
        description=RUN_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("spec", nargs="?", metavar="SUITE|CASE",
                     help=f"a suite, SUITE/CASE, or a .toml case file (default: the CPU cases of '{DEFAULT_SUITE}')")
    _add_explicit_arguments(run)
    _add_setting_arguments(run)
    _add_output_arguments(run)
    run.set_defaults(func=cmd_run)


def _add_baselines_command(sub) -> None:
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
    show.add_argument("suite", nargs="?", help="only this suite's cases (default: every stored suite)")
    show.add_argument("--baselines", metavar="DIR", help=BASELINES_HELP)
    show.set_defaults(func=cmd_baselines_show)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="specbench",
        description="Test harness and regression benchmarks for speculative decoding: did acceptance, "
        "correctness or speed regress, and by how much?",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EPILOG,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run_command(sub)
    _add_baselines_command(sub)

    env = sub.add_parser("env", help="print the environment fingerprint stored with every result")
    env.add_argument("--device", default=None, help="device whose GPU to describe (default: cuda:0 if present)")
    env.set_defaults(func=cmd_env)

    from specbench import calibrate
    from specbench.report.cli import add_report_subcommands
    from specbench.zoo.cli import add_zoo_subcommand

    calibrate_parser = sub.add_parser(
        "calibrate-tree", help="calibrate a Medusa tree for a checkpoint from measured head accuracies",
        description=calibrate.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    calibrate.add_arguments(calibrate_parser)
    calibrate_parser.set_defaults(func=calibrate.run)
    add_report_subcommands(sub)
    add_zoo_subcommand(sub)
    return parser


# ---- errors ----------------------------------------------------------------------------------------------


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors caused by input (bad names, missing or damaged data, models, checkpoints, baselines): printed in
    one line, exit status 2. ValueError covers CheckpointError (MedusaCheckpointError), InvalidModelRef and
    HistoryError; OSError covers FileNotFoundError and ReferenceMissing, and unreadable files."""
    from safetensors import SafetensorError

    from specbench.checkpoints.resolve import ModelUnavailable
    from specbench.gating.baselines import BaselineError
    from specbench.prompts import DatasetUnavailable

    return (ValueError, OSError, BaselineError, ModelUnavailable, DatasetUnavailable, SafetensorError)


def main(argv: list[str] | None = None) -> int:
    from specbench.report.cli import one_line

    try:
        args = build_parser().parse_args(argv)
        if getattr(args, "quiet", False):
            _quiet_libraries()
        return args.func(args)
    except UsageError as err:
        print(err, file=sys.stderr)
        return 2
    except _user_errors() as err:
        print(f"specbench: error: {one_line(err)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
