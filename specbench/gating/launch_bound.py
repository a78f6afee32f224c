"""Which runs' speed figures measure the host rather than the proposer: a tiny reference target on CUDA, whose step
is a few hundred microseconds of kernel launches (docs/metrics.md#launch-bound-cases). The CLI's table and the
reports put LAUNCH_BOUND_WORDS next to such a run's speedup."""

from __future__ import annotations

# the shipped tiny targets: the zoo's 6.85 M-parameter reference (specbench/references.py) and the random demo Llama
# (specbench/checkpoints/tiny.py), named by prefix so that this module imports neither
TINY_TARGET_PREFIXES = ("specbench-ref/", "specbench-tiny/")
LAUNCH_BOUND_METRICS = ("speedup", "tokens_per_s")  # the figures that carry the words beside them
LAUNCH_BOUND_WORDS = "launch-bound: host overhead, not the proposer's speed"
LAUNCH_BOUND_NOTE = ("launch-bound: a tiny reference target on CUDA, whose step is a few hundred microseconds of "
                     "kernel launches; its speedup measures the host's work per step, not the proposer's speed on a "
                     "real target (the speed suite's 7B cases measure that; docs/metrics.md#launch-bound-cases)")


def launch_bound(case: dict | None) -> bool:
    """Whether a run of ``case`` (a result's case dict) is launch-bound: a shipped tiny target on a CUDA device.
    On the CPU every step is compute, and a target given by path is not judged (the 7B and 1B synthetic ones are not
    launch-bound)."""
    case = case or {}
    target, device = str(case.get("target") or ""), str(case.get("device") or "")
    return device.startswith("cuda") and target.startswith(TINY_TARGET_PREFIXES)
