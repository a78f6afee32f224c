"""Whether a run's GPU ran at the clocks of its baseline's: the note a speed verdict carries when they differ
(the clocks are recorded in each result's environment by specbench.env; docs/metrics.md#gates)."""

from __future__ import annotations


def clock_difference(run_env: dict, baseline_env: dict, *, tolerance: float = 0.05) -> str | None:
    """A one-line note when the run's GPU ran at other clocks than its baseline's: the SM or memory
    clock more than ``tolerance`` (relative) apart, another pstate, or a throttle reason other than
    gpu_idle that the baseline lacked. None when they agree or either lacks clocks (old baselines)."""
    run, base = (run_env or {}).get("gpu_clocks"), (baseline_env or {}).get("gpu_clocks")
    if not isinstance(run, dict) or not isinstance(base, dict):
        return None
    parts = [_clock_part("SM", run.get("sm_clock_mhz"), base.get("sm_clock_mhz"), tolerance),
             _clock_part("memory", run.get("memory_clock_mhz"), base.get("memory_clock_mhz"), tolerance),
             _pstate_part(run.get("pstate"), base.get("pstate")),
             _throttle_part(run.get("throttle_reasons"), base.get("throttle_reasons"))]
    parts = [part for part in parts if part]
    if not parts:
        return None
    return f"GPU clocks differ from the baseline's: {', '.join(parts)}; speed figures are not comparable"


def _clock_part(label: str, run: float | None, base: float | None, tolerance: float) -> str | None:
    if run is None or base is None or base <= 0 or abs(run - base) / base <= tolerance:
        return None
    return f"{label} {run:g} MHz vs {base:g} MHz"


def _pstate_part(run: str | None, base: str | None) -> str | None:
    return f"pstate {run} vs {base}" if run and base and run != base else None


def _throttle_part(run: list[str] | None, base: list[str] | None) -> str | None:
    if run is None or base is None:  # unknown on either side: no claim about what changed
        return None
    new = [name for name in run if name != "gpu_idle" and name not in base]
    return f"throttled by {'+'.join(new)} (the baseline was not)" if new else None
