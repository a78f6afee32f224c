"""Speed-gate trial: does the speed gate catch a 10% slowdown, and does it never fail an unchanged run?

For each case: load the target and build the proposer once, run the case once as the in-memory baseline
(``baseline_entry``), then gate against it with ``compare_entry``:

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
every run. On a GPU box, in one call (the synth steps' time is outside --max-seconds: lower it to fit):

    specbench zoo synth /tmp/synth --device cuda && specbench zoo synth /tmp/synth1b --shape 1b --device cuda \\
      && SPECBENCH_SYNTH_DIR=/tmp/synth SPECBENCH_SYNTH_1B_DIR=/tmp/synth1b python bench/speed_gate_trial.py OUT

    python bench/speed_gate_trial.py OUT [--cases SPEC ...] [--runs 20] [--slowdowns 0.05,0.10,0.20]
        [--device cuda|cpu] [--no-graphs-off] [--max-seconds 540]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import math
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specbench import strict_json  # noqa: E402
from specbench.atomic_write import write_text_atomic  # noqa: E402
from specbench.cases import expand_ref, find_case, unmet_requirements, with_overrides  # noqa: E402
from specbench.gating.gates import SPEED_METRICS, compare_entry, resolve_tolerances  # noqa: E402
from specbench.gating.regenerate import baseline_entry  # noqa: E402
from specbench.harness import (  # noqa: E402
    build_proposer, case_fault, fault_line, free_device_memory, load_target, parse_dtype, run_case,
)

PLACES = ("verify", "proposer")
KEY_METRICS = ("tokens_per_s", "plain_tokens_per_s", "speedup", "decode_speedup", "per_token_latency_s",
               "time_to_first_token_s", "verify_cost_ratio", "draft_cost_ratio", "predicted_speedup",
               "mean_acceptance_length", "acceptance_rate")
CALIBRATION_CYCLES = 50_000_000  # tens of milliseconds of _sleep on any recent GPU


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--cases", nargs="+", default=["speed"], metavar="SPEC",
                        help="suites, suite/case ids or TOML paths (default: the speed suite)")
    parser.add_argument("--runs", type=int, default=20, help="unchanged runs per case (default 20)")
    parser.add_argument("--slowdowns", default="0.05,0.10,0.20",
                        help="comma-separated fractions of T(1) added per verify / propose call")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None,
                        help="run every case on this device (cpu also sets float32); default: each case's own")
    parser.add_argument("--no-graphs-off", action="store_true", help="skip the cuda_graphs=False regression")
    parser.add_argument("--max-seconds", type=float, default=540.0,
                        help="start no run that would end later than this after start (default 540)")
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


# -- injected work ---------------------------------------------------------------------------------

def calibrate_cuda_sleep(trials: int = 3) -> float:
    """GPU cycles per second of ``torch.cuda._sleep``: the fastest of ``trials`` timed sleeps."""
    torch.cuda._sleep(1000)  # first launch out of the timing
    torch.cuda.synchronize()
    best = math.inf
    for _ in range(trials):
        torch.cuda.synchronize()
        start = time.perf_counter()
        torch.cuda._sleep(CALIBRATION_CYCLES)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return CALIBRATION_CYCLES / best


class Spin:
    """``seconds`` of extra work per call: a GPU spin on the current stream (CUDA), else a host busy-wait."""

    def __init__(self, device: str, seconds: float, cycles_per_s: float | None):
        self.seconds = seconds
        self.cycles = int(seconds * cycles_per_s) if device.startswith("cuda") and cycles_per_s else None

    def __call__(self) -> None:
        if self.cycles is not None:
            torch.cuda._sleep(self.cycles)  # queued after the call's kernels; the next sync waits for it
            return
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            pass


class SlowTarget:
    """The target, every attribute delegated, with ``spin`` after each ``verify``."""

    def __init__(self, inner, spin: Spin):
        self._inner, self._spin = inner, spin

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def verify(self, *args, **kwargs):
        out = self._inner.verify(*args, **kwargs)
        self._spin()
        return out


class SlowProposer:
    """The proposer, every attribute delegated, with ``spin`` after each ``propose``."""

    def __init__(self, inner, spin: Spin):
        self._inner, self._spin = inner, spin

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def propose(self, state):
        draft = self._inner.propose(state)
        self._spin()
        return draft


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


# -- cases -----------------------------------------------------------------------------------------

def unavailable(case) -> str | None:
    """Why the case's target or proposer checkpoint is not here (skip_unless_available's test), or None."""
    from specbench.checkpoints.resolve import ModelUnavailable, resolve_model_dir
    from specbench.checkpoints.tiny import BUILTIN_TARGETS
    from specbench.references import ReferenceMissing

    refs = [("target", case.target)] if case.target not in BUILTIN_TARGETS else []
    if case.proposer.get("path"):
        refs.append(("proposer.path", case.proposer["path"]))
    for key, ref in refs:
        try:
            resolve_model_dir(expand_ref(ref, key=key))
        except (ModelUnavailable, ReferenceMissing, ValueError) as err:
            return str(err)
    return unmet_requirements(case)


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


# -- one run ---------------------------------------------------------------------------------------

def failed_checks(report) -> list[dict]:
    return [{"name": c.name, "status": c.status, "measured": c.measured, "baseline": c.baseline,
             "message": c.message()} for c in report.failures]


def key_metrics(result: dict) -> dict:
    return {name: result["metrics"].get(name) for name in KEY_METRICS}


def median_t1(result: dict) -> float:
    return statistics.median(r["t1_s"] for r in result["repeats"])


def deviation(measured, baseline) -> float:
    ok = all(isinstance(v, (int, float)) and math.isfinite(v) for v in (measured, baseline)) and baseline
    return abs(measured / baseline - 1) if ok else math.nan


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

    def save(self) -> None:
        self.doc["seconds"] = self.elapsed()
        for place in PLACES:
            self.doc["smallest_caught"][place] = smallest_caught(self.doc["injected"], place)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.path, strict_json.dumps(self.doc, indent=2) + "\n")

    def progress(self, case_id: str, label: str, seconds: float, result: dict, base: dict, verdict: str) -> None:
        m = result["metrics"]
        change = m["tokens_per_s"] / base["tokens_per_s"] - 1 if base["tokens_per_s"] else math.nan
        print(f"[{self.elapsed():6.1f}s] {case_id} {label}: {seconds:.1f}s, {m['tokens_per_s']:.1f} tok/s "
              f"({change:+.1%}), speedup {m['speedup']:.3f}: {verdict}", flush=True)


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


def record_unchanged(trial, case_id, state, index, result, report) -> str:
    entry, base = state["entry_doc"], state["baseline"]
    failed = failed_checks(report)
    entry["unchanged"].append({"run": index, "passed": report.passed, "failed_checks": failed,
                               "tokens_per_s": result["metrics"]["tokens_per_s"],
                               "speedup": result["metrics"]["speedup"], "seconds": state["last_seconds"]})
    for name in SPEED_METRICS:
        dev = deviation(result["metrics"].get(name), base.get(name))
        old = entry["max_abs_deviation"].get(name)
        if math.isfinite(dev) and (old is None or dev > old):
            entry["max_abs_deviation"][name] = dev
    if not report.passed:
        trial.doc["false_failures"] += 1
        for check in failed:
            counts = trial.doc["false_failure_checks"]
            counts[check["name"]] = counts.get(check["name"], 0) + 1
    return "PASS" if report.passed else "FALSE FAILURE " + ", ".join(c["name"] for c in failed)


def record_injected(trial, case_id, state, where, f, result, report) -> str:
    base_rate = state["baseline"]["tokens_per_s"]
    failed = failed_checks(report)
    trial.doc["injected"].append({
        "case": case_id, "where": where, "slowdown": f, "caught": not report.passed, "failed_checks": failed,
        "measured_slowdown": 1 - result["metrics"]["tokens_per_s"] / base_rate if base_rate else math.nan,
        "tokens_per_s": result["metrics"]["tokens_per_s"], "speedup": result["metrics"]["speedup"],
        "seconds": state["last_seconds"]})
    return ("CAUGHT " + ", ".join(c["name"] for c in failed)) if failed else "MISSED"


def run_job(trial, case, state, job) -> None:
    """One scheduled run of ``case``, gated against its baseline entry and recorded."""
    kind, value = job
    target, proposer, tokenizer = state["target"], state["proposer"], state["tokenizer"]
    if kind in PLACES:
        spin = Spin(case.device, value * state["t1"], trial.doc["cuda_sleep_cycles_per_s"])
        target = SlowTarget(target, spin) if kind == "verify" else target
        proposer = SlowProposer(proposer, spin) if kind == "proposer" else proposer
    if kind == "graphs_off":
        target, proposer = graphs_off_target(case)
    result, state["last_seconds"] = timed_run(case, target, tokenizer, proposer)
    if kind == "graphs_off":
        target = proposer = None
        free_device_memory()
    report = compare_entry(result, state["entry"])
    if kind == "unchanged":
        verdict = record_unchanged(trial, case.case_id, state, value, result, report)
        label = f"unchanged {value + 1}/{trial.args.runs}"
    else:
        verdict = record_injected(trial, case.case_id, state, kind, value, result, report)
        label = kind if value is None else f"{kind} +{value:.0%} T(1)"
    trial.progress(case.case_id, label, state["last_seconds"], result, state["baseline"], verdict)


def expected_seconds(state, job) -> float:
    base = state["baseline_seconds"]
    kind, value = job
    return base * 2 if kind == "graphs_off" else base * (1 + (value or 0.0))


def trial_case(trial, case, deadline: float) -> None:
    """Baseline, then the case's schedule until done or its time share is spent."""
    started = time.perf_counter()
    target, tokenizer = load_target(case)
    proposer = build_proposer(case, target)
    load_seconds = time.perf_counter() - started
    state = {"target": target, "tokenizer": tokenizer, "proposer": proposer}
    first, state["baseline_seconds"] = timed_run(case, target, tokenizer, proposer)
    state["last_seconds"] = state["baseline_seconds"]
    state["entry"] = baseline_entry(first, command=trial.command)
    state["t1"] = median_t1(first)
    state["baseline"] = {**key_metrics(first), "t1_s": state["t1"], "seconds": state["baseline_seconds"],
                         "load_seconds": load_seconds}
    state["entry_doc"] = trial.doc["cases"][case.case_id] = {"baseline": state["baseline"], "unchanged": [],
                                                             "max_abs_deviation": {}}
    trial.doc["tolerances"][case.case_id] = resolve_tolerances(case.tolerances)
    trial.doc["env"] = trial.doc["env"] or first["env"]
    print(f"[{trial.elapsed():6.1f}s] {case.case_id} baseline: {state['baseline_seconds']:.1f}s, "
          f"{first['metrics']['tokens_per_s']:.1f} tok/s, speedup {first['metrics']['speedup']:.3f}, "
          f"T(1) {state['t1'] * 1e3:.2f} ms", flush=True)
    trial.save()
    jobs = schedule(case, proposer, trial.args)
    for done, job in enumerate(jobs):
        if not trial.fits(expected_seconds(state, job), deadline):
            trial.doc["stopped_early"] = True
            state["entry_doc"]["jobs_not_run"] = len(jobs) - done
            print(f"[{trial.elapsed():6.1f}s] {case.case_id}: out of time, {len(jobs) - done} run(s) not started",
                  flush=True)
            break
        run_job(trial, case, state, job)
        trial.save()


def table(doc: dict) -> str:
    lines = [f"{'case':44} {'tok/s':>8} {'speedup':>8} {'false':>6} {'max|dev| tok/s':>15} {'speedup':>8}"]
    for case_id, entry in doc["cases"].items():
        if "baseline" not in entry:
            continue
        base, runs, dev = entry["baseline"], entry["unchanged"], entry["max_abs_deviation"]
        false = sum(not r["passed"] for r in runs)
        show = lambda v: f"{v:.1%}" if v is not None else "-"  # noqa: E731
        lines.append(f"{case_id:44} {base['tokens_per_s']:8.1f} {base['speedup']:8.3f} {false:>2}/{len(runs):<3} "
                     f"{show(dev.get('tokens_per_s')):>15} {show(dev.get('speedup')):>8}")
    lines.append(f"{'case':44} {'where':10} {'f':>5} {'measured':>9} verdict")
    for r in doc["injected"]:
        f = "-" if r["slowdown"] is None else f"{r['slowdown']:.2f}"
        names = ", ".join(c["name"] for c in r["failed_checks"])
        lines.append(f"{r['case']:44} {r['where']:10} {f:>5} {r['measured_slowdown']:9.1%} "
                     f"{'caught (' + names + ')' if r['caught'] else 'MISSED'}")
    lines.append(f"false failures: {doc['false_failures']}; smallest caught: {doc['smallest_caught']}; "
                 f"{doc['seconds']:.0f} s" + (" (stopped early)" if doc["stopped_early"] else ""))
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
        except RuntimeError as err:
            fault = case_fault(err)
            if fault is None:
                raise
            trial.doc["errors"][case.case_id] = fault_line(case.case_id, fault)
            print(trial.doc["errors"][case.case_id], flush=True)
        free_device_memory()
        trial.save()
    trial.save()
    print(table(trial.doc), flush=True)
    return 0 if trial.doc["cases"] else 1


if __name__ == "__main__":
    sys.exit(main())
