"""Where a case's draft cost goes: run one case (`specbench run`) with every step-cost measurement's ``propose`` calls
labelled, print the draft cost / T(1) of each measurement, and profile one more measurement after the first (CPU ops
and CUDA kernels inside ``propose``, torch.profiler; its chrome trace goes to OUT_DIR). Works in this tree and in 5483910's (the
single-sequence engine, whose step costs lived in specbench/engine/step_costs.py): run it inside an archive with
`bench/in_archive.py` to compare the two on one machine (bench/results/h100-2026-12-07b: the 1B Medusa heads cost
0.24 of T(1) at 5483910 and 0.36-0.56 at 2b48030).

    python bench/propose_profile.py OUT_DIR speed/synth-1b-chain-k3 [specbench run options, e.g. --num-prompts 2]
    python bench/in_archive.py .ab/5483910.tar.gz python3 $PWD/bench/propose_profile.py $OUT/base \
        speed/synth-1b-chain-k3

Writes OUT_DIR/run.json (the run's result), step_costs_profile.txt and step_costs_trace.json.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

# the modules that call measure_step_costs, in this tree and in 5483910's
CALLERS = ("specbench.run.sequence", "specbench.run.batch", "specbench.case_loop", "specbench.batch_run")


def _labelled(proposer) -> None:
    """Every ``propose`` of ``proposer`` inside a "propose" profiler range (an instance attribute: the class stays)."""
    if proposer is None or "propose" in vars(proposer):
        return
    original = proposer.propose

    @functools.wraps(original)
    def propose(*args, **kwargs):
        with record_function("propose"):
            return original(*args, **kwargs)

    proposer.propose = propose


def inside_propose(events) -> str:
    """Per ``propose`` call: the CPU ops it ran (calls, self CPU us) and the kernels they launched (count, GPU us)."""
    calls = [e for e in events if e.name == "propose"]
    ops: dict[str, list[float]] = {}
    kernels: dict[str, list[float]] = {}
    stack = [child for call in calls for child in call.cpu_children]
    while stack:
        event = stack.pop()
        stack.extend(event.cpu_children)
        ops.setdefault(event.name, []).append(event.self_cpu_time_total)
        for kernel in getattr(event, "kernels", []):
            kernels.setdefault(kernel.name, []).append(kernel.duration)
    n = max(len(calls), 1)
    wall = sum(call.cpu_time_total for call in calls) / n
    lines = [f"inside propose: {len(calls)} calls, {wall:.1f} us CPU each (with the profiler's overhead); per call:"]
    lines += [f"  op {name}: {len(times) / n:.1f} calls, {sum(times) / n:.1f} us self CPU"
              for name, times in sorted(ops.items(), key=lambda item: -sum(item[1]))]
    lines += [f"  kernel {name[:90]}: {len(times) / n:.1f} launches, {sum(times) / n:.1f} us GPU"
              for name, times in sorted(kernels.items(), key=lambda item: -sum(item[1]))]
    return "\n".join(lines)


def patch(out_dir: Path, measured: list) -> list:
    """Wrap measure_step_costs where the tree's run code imported it; returns (module, original) per patched module."""
    patched = []
    for name in CALLERS:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        original = getattr(module, "measure_step_costs", None)
        if original is None or getattr(original, "_profiled", False):
            continue

        def wrapped(target, proposer, *args, _original=original, **kwargs):
            _labelled(proposer)
            costs = _original(target, proposer, *args, **kwargs)
            measured.append(costs)
            print(f"step costs {len(measured)}: T(1) {costs.t1_s * 1e3:.3f} ms, propose {costs.draft_s * 1e3:.3f} ms "
                  f"({costs.draft_s / costs.t1_s:.3f} of T(1))", flush=True)
            if len(measured) == 1:  # profile one more measurement after the first (the profiler stays out of figures)
                activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
                with profile(activities=activities) as prof:
                    _original(target, proposer, *args, **kwargs)
                prof.export_chrome_trace(str(out_dir / "step_costs_trace.json"))
                sort = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
                report = inside_propose(prof.events()) + "\n\nthe whole measurement:\n" + prof.key_averages().table(
                    sort_by=sort, row_limit=25)
                (out_dir / "step_costs_profile.txt").write_text(report + "\n")
                print(report, flush=True)
            return costs

        wrapped._profiled = True
        module.measure_step_costs = wrapped
        patched.append((module, original))
    return patched


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    out_dir = Path(argv[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, os.getcwd())  # the tree this runs in (an archive's, under bench/in_archive.py)
    measured: list = []
    patched = patch(out_dir, measured)
    if not patched:
        print(f"propose_profile.py: none of {', '.join(CALLERS)} imports measure_step_costs in this tree",
              file=sys.stderr)
        return 2
    from specbench.cli import main as specbench_main

    try:
        return specbench_main(["run", *argv[1:], "--no-gate", "--no-history", "-q",
                               "--output", str(out_dir / "run.json")])
    finally:
        for module, original in patched:
            module.measure_step_costs = original


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
