"""Speed figures of a run over its repeats: per-repeat records, medians, same-run ratios, predicted speedup.

A case decodes its prompt set ``repeats`` times (docs/metrics.md#repeats). Each repeat yields one record:
its mean tok/s (speculative and plain), speedup, decode-phase speedup, latencies, and the step costs
measured right after it (T(1), the draft's verify and propose times, as ratios to T(1)). The run's speed
metrics are the medians over repeats; with one repeat they are that repeat's figures. From the run's own
MAL and step costs, ``predicted_speedup = MAL / (T(K+1)/T(1) + draft/T(1))`` is what the decode phase
should reach if verification and drafting were all a step cost; a measured decode-phase speedup more than
``PREDICTION_TOLERANCE`` away from it is flagged as a measurement problem (a cost the model does not see).
"""

from __future__ import annotations

import math
import statistics

PREDICTION_TOLERANCE = 0.10
# what a repeat record holds besides its index and raw step costs; each becomes the median metric of the run
REPEAT_METRICS = ("tokens_per_s", "plain_tokens_per_s", "speedup", "decode_speedup", "time_to_first_token_s",
                  "per_token_latency_s", "verify_cost_ratio", "draft_cost_ratio", "predicted_speedup")


def _finite(values) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def _mean(values) -> float:
    values = _finite(values)
    return sum(values) / len(values) if values else math.nan


def _ratio_of_sums(pairs) -> float:
    """sum(num) / sum(den) over the pairs where both are finite (the gates' ratio estimator)."""
    kept = [(n, d) for n, d in pairs if n is not None and d is not None and math.isfinite(n) and math.isfinite(d)]
    den = sum(d for _, d in kept)
    return sum(n for n, _ in kept) / den if kept and den > 0 else math.nan


def mean_acceptance_length(requests: list[dict]) -> float:
    """1 + accepted / drafts pooled over ``requests`` (1.0 when nothing was drafted)."""
    drafts = sum(r.get("num_drafts") or 0 for r in requests)
    return 1.0 + sum(r.get("num_accepted_tokens") or 0 for r in requests) / drafts if drafts else 1.0


def repeat_record(repeat: int, requests: list[dict], costs) -> dict:
    """One repeat's speed figures from its request records and its step costs (``StepCosts`` or its dict)."""
    costs = costs.to_dict() if hasattr(costs, "to_dict") else dict(costs)
    spec_rate, plain_rate = _mean(r.get("tokens_per_s") for r in requests), _mean(r.get("plain_tokens_per_s") for r in requests)
    t1 = costs["t1_s"]
    verify_ratio, draft_ratio = costs["verify_s"] / t1, costs["draft_s"] / t1
    return {
        "repeat": repeat,
        "tokens_per_s": spec_rate,
        "plain_tokens_per_s": plain_rate,
        "speedup": spec_rate / plain_rate if plain_rate > 0 else math.nan,
        # decode phase only (no prefill): plain seconds per token over speculative seconds per token
        "decode_speedup": _ratio_of_sums((r.get("plain_per_token_latency_s"), r.get("per_token_latency_s")) for r in requests),
        "time_to_first_token_s": _mean(r.get("time_to_first_token_s") for r in requests),
        "per_token_latency_s": _mean(r.get("per_token_latency_s") for r in requests),
        "t1_s": t1, "verify_s": costs["verify_s"], "draft_s": costs["draft_s"], "verify_width": costs["verify_width"],
        "verify_cost_ratio": verify_ratio,
        "draft_cost_ratio": draft_ratio,
        "predicted_speedup": mean_acceptance_length(requests) / (verify_ratio + draft_ratio),
    }


def speed_over_repeats(repeats: list[dict], extra: tuple[str, ...] = (), measured: str = "decode_speedup") -> dict:
    """The run's speed metrics: the median of each REPEAT_METRICS figure (and of ``extra`` ones) over ``repeats``,
    and the relative error of the ``measured`` speedup (MEASURED_SPEEDUPS) against the predicted one."""
    out: dict = {"num_repeats": len(repeats)}
    for name in REPEAT_METRICS + tuple(extra):
        values = _finite(r.get(name) for r in repeats)
        out[name] = statistics.median(values) if values else math.nan
    step = _finite(r.get("t1_s") for r in repeats)
    out["step_latency_s"] = statistics.median(step) if step else math.nan  # T(1): docs/metrics.md#step-costs
    out["speedup_prediction_error"] = prediction_error(out, measured)
    return out


# the measured speedup a prediction is checked against: a one-request run's decode phase, a batch point's
# throughput ratio at the same B (run/batch.py)
MEASURED_SPEEDUPS = {"decode_speedup": "decode-phase speedup", "batch_speedup": "batch speedup"}


def prediction_error(metrics: dict, measured: str = "decode_speedup") -> float:
    """``metrics[measured] / predicted_speedup - 1`` (NaN when either is unknown)."""
    predicted, value = metrics["predicted_speedup"], metrics[measured]
    return value / predicted - 1 if predicted > 0 and math.isfinite(value) else math.nan


def measurement_flags(metrics: dict, tolerance: float = PREDICTION_TOLERANCE, measured: str = "decode_speedup") -> list[dict]:
    """``[{"kind", "message"}]``: the measurement problems a run's metrics show (empty when none); ``measured``
    names the speedup ``speedup_prediction_error`` was taken against (MEASURED_SPEEDUPS)."""
    error = metrics.get("speedup_prediction_error")
    if error is None or not math.isfinite(error) or abs(error) <= tolerance:
        return []
    return [{
        "kind": "speedup_prediction",
        "message": (
            f"measured {MEASURED_SPEEDUPS[measured]} {metrics[measured]:.3f} is {error:+.0%} off the "
            f"{metrics['predicted_speedup']:.3f} its step costs predict (MAL {metrics.get('mean_acceptance_length', math.nan):.3f} / "
            f"(verify {metrics['verify_cost_ratio']:.3f} + draft {metrics['draft_cost_ratio']:.3f} plain steps)); beyond "
            f"{tolerance:.0%}: a per-step cost the step costs do not see (host work between steps, a proposer "
            "that caches), or a noisy measurement"
        ),
    }]
