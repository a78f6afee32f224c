"""Speed-gate trial: does the speed gate catch a 10% slowdown, and does it never fail an unchanged run?

For each case: load the target and build the proposer once, run the case once untimed (a process's first
run is slower), once as the in-memory baseline (``baseline_entry``), then gate against it (``compare_entry``):

* N unchanged runs: any failing report is a false failure (the failed checks are recorded with their
  measured and baseline values, and each speed metric's largest |measured / baseline - 1|);
* injected slowdowns, bench-only wrappers: for each fraction f and each place, ``verify`` (the target's
  verify, used by plain decoding too, so tok/s falls but speedup may not) or ``proposer`` (``propose``,
  used by speculative steps and the step-cost draft timing only), extra work of f x T(1) after each call,
  T(1) the baseline's median plain verify step. On CUDA the GPU spins (``torch.cuda._sleep`` on the
  current stream, cycles per second calibrated at start); on CPU Python busy-waits;
* the real regression: a static-engine case on CUDA rebuilt with ``cuda_graphs=False`` (docs/engines.md).

Speed is forced gated on every case (``gate_speed = True``: CPU speed is not gated by default,
docs/metrics.md#gates). Runs are interleaved (unchanged, injected, unchanged, ...) so a run cut short
still has both kinds; each case gets an equal share of the time left when it starts, and no run starts
that would end past ``--max-seconds``. ``OUT_DIR/speed_gate_trial.json`` is rewritten atomically after
every run. A run decodes a case's prompts ``repeats`` times, plain and speculative, plus its step costs:
seconds on a 7B case, so one 10-minute call gives all six speed cases few runs each (``--cases`` picks
fewer for more). On a GPU box, in one call (the synth steps' time is outside --max-seconds: lower it):

    specbench zoo synth /tmp/synth --device cuda && specbench zoo synth /tmp/synth1b --shape 1b --device cuda \\
      && SPECBENCH_SYNTH_DIR=/tmp/synth SPECBENCH_SYNTH_1B_DIR=/tmp/synth1b python bench/speed_gate_trial.py OUT
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import shlex
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _slowdown import Slowed, Spin, calibrate_cuda_sleep  # noqa: E402
from specbench.io import strict_json  # noqa: E402
from specbench.io.atomic_write import write_text_atomic  # noqa: E402
from specbench.cases.requirements import expand_ref, missing_checkpoint, unmet_requirements  # noqa: E402
from specbench.cases import find_case, with_overrides  # noqa: E402
from specbench.engine.proposer import Proposer, PerSlotProposer  # noqa: E402
from specbench.gating.gates import SPEED_METRICS, compare_entry, resolve_tolerances  # noqa: E402
from specbench.gating.regenerate import baseline_entry  # noqa: E402
from specbench.gating.stability import metric_spread, pairwise_false_failures  # noqa: E402
from specbench.run.harness import (  # noqa: E402
    build_proposer, case_fault, fault_line, free_device_memory, load_target, parse_dtype, run_case,
)

PLACES = ("verify", "proposer")
KEY_METRICS = ("tokens_per_s", "plain_tokens_per_s", "speedup", "decode_speedup", "per_token_latency_s",
               "time_to_first_token_s", "verify_cost_ratio", "draft_cost_ratio", "predicted_speedup",
               "mean_acceptance_length", "acceptance_rate")
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--cases", nargs="+", default=["speed"], metavar="SPEC",
                        help="suites, suite/case ids or TOML paths (default: the speed suite)")
    parser.add_argument("--runs", type=int, default=20, help="unchanged runs per case (default 20)")
    parser.add_argument("--slowdowns", default="0.05,0.10,0.20", help="fractions of T(1) added per call")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None,
                        help="run every case on this device (cpu also sets float32); default: each case's own")
    parser.add_argument("--no-graphs-off", action="store_true", help="skip the cuda_graphs=False regression")
    parser.add_argument("--max-seconds", type=float, default=540.0,
                        help="start no run that would end later than this after start (default 540)")
    parser.add_argument("--warmup-runs", type=int, default=1,
                        help="untimed runs of each case before its baseline: a process's first run is slower")
    parser.add_argument("--max-new-tokens", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--num-prompts", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        args.slowdowns = sorted({float(x) for x in args.slowdowns.split(",") if x.strip()})
    except ValueError:
        parser.error(f"--slowdowns {args.slowdowns!r}: expected comma-separated numbers such as 0.05,0.10")
    if any(not 0 < f < 10 for f in args.slowdowns) or args.runs < 0:
        parser.error("--slowdowns must be fractions > 0 (and < 10); --runs must be >= 0")
    return args


def graphs_off_target(case):
    """The case's static engine with CUDA graphs off (the real regression), and the proposer rebuilt for it."""
    from specbench.checkpoints.tiny import BUILTIN_TARGETS
    from specbench.engine.static_target import StaticTarget

    dtype = parse_dtype(case.dtype)
    if case.target in BUILTIN_TARGETS:
        model = BUILTIN_TARGETS[case.target](dtype).to(case.device)
        target = StaticTarget.from_hf_model(model, cuda_graphs=False)
    else:
        target = StaticTarget.from_pretrained(expand_ref(case.target), dtype=dtype, device=case.device,
                                              cuda_graphs=False)
    return target, build_proposer(case, target)


def slowed_proposer(proposer, spin: Spin) -> Slowed:
    """``proposer`` with ``spin`` after each ``propose``, in the slot form the decode loop calls: a per-sequence
    proposer as the one slot Decoder would make of it (Decoder takes any other object for a slot proposer)."""
    return Slowed(PerSlotProposer([proposer]) if isinstance(proposer, Proposer) else proposer, "propose", spin)


def unavailable(case) -> str | None:
    """Why the case cannot run here (a missing checkpoint, as the suites skip it, or missing hardware), or None."""
    return missing_checkpoint(case) or unmet_requirements(case)


def prepare(case, args):
    """The case with the command line's overrides applied and speed gating forced on."""
    overrides = {"device": args.device, "max_new_tokens": args.max_new_tokens, "num_prompts": args.num_prompts}
    if args.device == "cpu":
        overrides["dtype"] = "float32"
    case, _ = with_overrides(case, overrides)
    return dataclasses.replace(case, gate_speed=True)  # gate_speed is not OVERRIDABLE: set on a copy


def select_cases(args) -> tuple[list, dict]:
    """(cases to run, {case id: why skipped})."""
    chosen, skipped = [], {}
    for spec in args.cases:
        for case in find_case(spec):
            case = prepare(case, args)
            reason = unavailable(case)
            if reason:
                skipped[case.case_id] = reason
                print(f"skip {case.case_id}: {reason}", flush=True)
            else:
                chosen.append(case)
    return chosen, skipped


def failed_checks(report) -> list[dict]:
    return [{"name": c.name, "status": c.status, "measured": c.measured, "baseline": c.baseline,
             "message": c.message()} for c in report.failures]


def deviation(measured, baseline) -> float:
    finite = all(isinstance(v, (int, float)) and math.isfinite(v) for v in (measured, baseline))
    return abs(measured / baseline - 1) if finite and baseline else math.nan


def error_line(case_id: str, err: BaseException) -> str:
    """A device fault's one line (harness.fault_line), else the error's type and first line, traceback printed."""
    fault = case_fault(err)
    if fault is None:
        traceback.print_exc()
        fault = {"type": type(err).__name__, "message": (str(err).strip().splitlines() or [""])[0]}
    return fault_line(case_id, fault)


def timed_run(case, target, tokenizer, proposer) -> tuple[dict, float]:
    start = time.perf_counter()
    result = run_case(case, progress=False, target=target, tokenizer=tokenizer, proposer=proposer).to_dict()
    return result, time.perf_counter() - start


class Trial:
    """The output document, the clock and the budget of one invocation."""

    def __init__(self, args, argv):
        self.args, self.start = args, time.perf_counter()
        self.path = Path(args.out_dir) / "speed_gate_trial.json"
        self.command = "python bench/speed_gate_trial.py " + shlex.join(argv if argv is not None else sys.argv[1:])
        self.doc = {"runs": args.runs, "false_failures": 0, "false_failure_checks": {}, "cases": {}, "injected": [],
                    "smallest_caught": {place: None for place in PLACES}, "tolerances": {}, "env": None,
                    "seconds": 0.0, "stopped_early": False, "gate_speed_forced": True, "slowdowns": args.slowdowns,
                    "max_seconds": args.max_seconds, "cuda_sleep_cycles_per_s": None, "skipped": {}, "errors": {}}

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def fits(self, expected: float, deadline: float) -> bool:
        """Whether a run of ``expected`` seconds would end before ``deadline`` (seconds since start)."""
        return self.elapsed() + expected <= min(deadline, self.args.max_seconds)

    def error(self, key: str, err: BaseException) -> None:
        """Record and print why the run or case ``key`` failed; free what it left on the device."""
        self.doc["errors"][key] = error_line(key, err)
        print(self.doc["errors"][key], flush=True)
        free_device_memory()

    def save(self) -> None:
        self.doc["seconds"] = self.elapsed()
        for place in PLACES:
            self.doc["smallest_caught"][place] = smallest_caught(self.doc["injected"], place)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.path, strict_json.dumps(self.doc, indent=2) + "\n")

    def say(self, text: str) -> None:
        print(f"[{self.elapsed():6.1f}s] {text}", flush=True)


def smallest_caught(injected: list[dict], place: str) -> float | None:
    """The smallest fraction whose injected run at ``place`` was caught in every case that ran ``place``."""
    runs = [r for r in injected if r["where"] == place]
    cases = {r["case"] for r in runs}
    for f in sorted({r["slowdown"] for r in runs}):
        at_f = {r["case"]: r["caught"] for r in runs if r["slowdown"] == f}
        if set(at_f) == cases and all(at_f.values()):
            return f
    return None


def schedule(case, proposer, args) -> list[tuple[str, object]]:
    """Jobs of a case after its baseline: unchanged runs interleaved with the injected ones."""
    unchanged = [("unchanged", i) for i in range(args.runs)]
    injected = [(place, f) for f in args.slowdowns for place in PLACES if place == "verify" or proposer is not None]
    if not args.no_graphs_off and case.engine == "static" and case.device.startswith("cuda"):
        injected.append(("graphs_off", None))
    jobs = []
    for i in range(max(len(unchanged), len(injected))):
        jobs += unchanged[i:i + 1] + injected[i:i + 1]
    return jobs


def record(trial, state, kind, value, result, report) -> str:
    """Add one gated run to the document; the verdict for its progress line."""
    metrics, base, failed = result["metrics"], state["baseline"], failed_checks(report)
    names = ", ".join(c["name"] for c in failed)
    row = {"failed_checks": failed, **{name: metrics.get(name) for name in SPEED_METRICS},
           "t1_s": statistics.median(r["t1_s"] for r in result["repeats"]), "seconds": state["last_seconds"]}
    if kind != "unchanged":
        trial.doc["injected"].append({"case": state["case_id"], "where": kind, "slowdown": value,
                                      "caught": not report.passed, **row,
                                      "measured_slowdown": 1 - metrics["tokens_per_s"] / base["tokens_per_s"]})
        return f"CAUGHT {names}" if failed else "MISSED"
    entry = trial.doc["cases"][state["case_id"]]
    entry["unchanged"].append({"run": value, "passed": report.passed, **row})
    state["unchanged_results"].append(result)
    for name in SPEED_METRICS:
        dev, old = deviation(metrics.get(name), base.get(name)), entry["max_abs_deviation"].get(name)
        if math.isfinite(dev) and (old is None or dev > old):
            entry["max_abs_deviation"][name] = dev
    trial.doc["false_failures"] += not report.passed
    for check in failed:
        counts = trial.doc["false_failure_checks"]
        counts[check["name"]] = counts.get(check["name"], 0) + 1
    return "PASS" if report.passed else f"FALSE FAILURE {names}"


def run_job(trial, case, state, job) -> None:
    """One scheduled run of ``case``, gated against its baseline entry and recorded."""
    kind, value = job
    target, proposer, tokenizer = state["target"], state["proposer"], state["tokenizer"]
    if kind in PLACES:
        spin = Spin(case.device, value * state["baseline"]["t1_s"], trial.doc["cuda_sleep_cycles_per_s"])
        target = Slowed(target, "verify", spin) if kind == "verify" else target
        proposer = slowed_proposer(proposer, spin) if kind == "proposer" else proposer
    if kind == "graphs_off":
        target, proposer = graphs_off_target(case)
    result, state["last_seconds"] = timed_run(case, target, tokenizer, proposer)
    if kind == "graphs_off":
        target = proposer = None
        free_device_memory()  # the second engine's weights and cache
    verdict = record(trial, state, kind, value, result, compare_entry(result, state["entry"]))
    label = (f"unchanged {value + 1}/{trial.args.runs}" if kind == "unchanged"
             else kind if value is None else f"{kind} +{value:.0%} T(1)")
    change = result["metrics"]["tokens_per_s"] / state["baseline"]["tokens_per_s"] - 1
    trial.say(f"{case.case_id} {label}: {state['last_seconds']:.1f}s, {result['metrics']['tokens_per_s']:.1f} tok/s "
              f"({change:+.1%}), speedup {result['metrics']['speedup']:.3f}: {verdict}")


def expected_seconds(state, job) -> float:
    """A guess at the job's duration: the baseline's, stretched by the injected fraction (graphs off: twice)."""
    kind, value = job  # value: the run's index for "unchanged", the injected fraction for a place
    stretch = 1.0 if kind == "unchanged" else 2.0 if kind == "graphs_off" else 1.0 + value
    return state["baseline"]["seconds"] * stretch


def baseline(trial, case, state) -> None:
    """Warm-up run(s), then the baseline run: its entry, T(1) and key metrics go into ``state`` and the document."""
    target, tokenizer, proposer = state["target"], state["tokenizer"], state["proposer"]
    for _ in range(trial.args.warmup_runs):  # first-run costs the harness's own 4-token warm-up leaves
        trial.say(f"{case.case_id} warm-up run: {timed_run(case, target, tokenizer, proposer)[1]:.1f}s")
    first, seconds = timed_run(case, target, tokenizer, proposer)
    state["entry"], state["last_seconds"] = baseline_entry(first, command=trial.command), seconds
    state["unchanged_results"] = [first]  # the baseline run is an unchanged run too
    t1 = statistics.median(r["t1_s"] for r in first["repeats"])
    state["baseline"] = {**{name: first["metrics"].get(name) for name in KEY_METRICS}, "t1_s": t1,
                         "seconds": seconds, "load_seconds": state["load_seconds"]}
    trial.doc["cases"][case.case_id] = {"baseline": state["baseline"], "unchanged": [], "max_abs_deviation": {}}
    trial.doc["tolerances"][case.case_id] = resolve_tolerances(case.tolerances)
    trial.doc["env"] = trial.doc["env"] or first["env"]
    trial.say(f"{case.case_id} baseline: {seconds:.1f}s, {first['metrics']['tokens_per_s']:.1f} tok/s, "
              f"speedup {first['metrics']['speedup']:.3f}, T(1) {t1 * 1e3:.2f} ms")


def trial_case(trial, case, deadline: float) -> None:
    """Baseline, then the case's schedule until done or its time share is spent."""
    started = time.perf_counter()
    target, tokenizer = load_target(case)
    state = {"case_id": case.case_id, "target": target, "tokenizer": tokenizer,
             "proposer": build_proposer(case, target), "load_seconds": time.perf_counter() - started}
    baseline(trial, case, state)
    trial.save()
    jobs = schedule(case, state["proposer"], trial.args)
    for done, job in enumerate(jobs):
        if not trial.fits(expected_seconds(state, job), deadline):
            trial.doc["stopped_early"] = True
            trial.doc["cases"][case.case_id]["jobs_not_run"] = len(jobs) - done
            trial.say(f"{case.case_id}: out of time, {len(jobs) - done} run(s) not started")
            break
        try:
            run_job(trial, case, state, job)
        except Exception as err:  # noqa: BLE001 - one failed run (a graphs-off OOM) must not cost the rest
            trial.error(f"{case.case_id} {job[0]} {job[1]}", err)
        trial.save()
    stability(trial, case.case_id, state["unchanged_results"])


def stability(trial, case_id: str, results: list[dict]) -> None:
    """Spread of each speed metric over the baseline and unchanged runs, and every run gated against every other."""
    entry = trial.doc["cases"][case_id]
    entry["spread"] = metric_spread(results, SPEED_METRICS)
    entry["pairwise"] = pairwise_false_failures(results)
    pairs = entry["pairwise"]
    trial.say(f"{case_id}: {pairs['failing_pairs']}/{pairs['pairs']} ordered pairs of unchanged runs fail "
              f"{pairs['by_check'] or ''}")
    trial.save()


def table(doc: dict) -> str:
    """Unchanged runs per case, then each injected run, then the verdict line."""
    w = max([len(c) for c in doc["cases"]] + [4])
    show = lambda v: "-" if v is None else f"{v:.1%}"  # noqa: E731
    lines = [f"{'case':{w}} {'tok/s':>8} {'speedup':>8} {'false':>7} {'max dev tok/s':>14} {'speedup':>8}"]
    for case_id, entry in doc["cases"].items():
        base, runs, dev = entry["baseline"], entry["unchanged"], entry["max_abs_deviation"]
        false = f"{sum(not r['passed'] for r in runs)}/{len(runs)}"
        lines.append(f"{case_id:{w}} {base['tokens_per_s']:8.1f} {base['speedup']:8.3f} {false:>7} "
                     f"{show(dev.get('tokens_per_s')):>14} {show(dev.get('speedup')):>8}")
    lines.append(f"{'case':{w}} {'where':10} {'f':>5} {'tok/s -':>8} verdict")
    for r in doc["injected"]:
        f = "-" if r["slowdown"] is None else f"{r['slowdown']:.2f}"
        names = ", ".join(c["name"] for c in r["failed_checks"])
        lines.append(f"{r['case']:{w}} {r['where']:10} {f:>5} {show(r['measured_slowdown']):>8} "
                     + (f"caught ({names})" if r["caught"] else "MISSED"))
    lines.append(f"false failures: {doc['false_failures']}; smallest caught: {doc['smallest_caught']}; errors: "
                 f"{len(doc['errors'])}; {doc['seconds']:.0f} s" + (" (stopped early)" if doc["stopped_early"] else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    trial = Trial(args, argv)
    cases, trial.doc["skipped"] = select_cases(args)
    if any(c.device.startswith("cuda") for c in cases) and torch.cuda.is_available():
        trial.doc["cuda_sleep_cycles_per_s"] = calibrate_cuda_sleep()
        print(f"torch.cuda._sleep: {trial.doc['cuda_sleep_cycles_per_s']:.3g} cycles/s", flush=True)
    for i, case in enumerate(cases):
        share = (args.max_seconds - trial.elapsed()) / (len(cases) - i)
        if not trial.fits(0.0, args.max_seconds):
            trial.doc["stopped_early"] = True
            break
        try:
            trial_case(trial, case, trial.elapsed() + share)
        except Exception as err:  # noqa: BLE001 - one case failing to load or run must not cost the others
            trial.error(case.case_id, err)
        free_device_memory()  # the case's target, proposer and captured graphs are garbage now
        trial.save()
    trial.save()  # also when no case ran
    print(table(trial.doc), flush=True)
    return 0 if trial.doc["cases"] else 1


if __name__ == "__main__":
    sys.exit(main())
