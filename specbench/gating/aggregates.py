"""A stored result's quality aggregates recomputed from its per-request counters: a result file is input, and one
whose acceptance rate (say) does not follow from its own requests was edited or damaged, not measured."""

from __future__ import annotations

import math

from specbench.metrics import SpecCounters

# the run-level metrics that are pure functions of the pooled per-request counters (docs/metrics.md#aggregation)
RECOMPUTED = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "acceptance_rate", "mean_acceptance_length",
              "per_position_acceptance_rate")
_COUNTER_FIELDS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_position")
_REL_TOLERANCE = 1e-6  # the same floats recomputed agree to the last bit; this allows a writer's rounding to 6 digits


def recomputed(result: dict) -> dict | None:
    """RECOMPUTED from the counters of the result's first repeat (every repeat decodes the same tokens, so the
    harness pools the first: specbench/run/sequence.py); None when its requests do not carry the counters."""
    requests = result.get("requests")
    if not isinstance(requests, list) or not requests:
        return None
    first = [r for r in requests if isinstance(r, dict) and r.get("repeat", 0) in (0, None)]
    if not first or not all(all(key in r for key in _COUNTER_FIELDS) for r in first):
        return None
    total = SpecCounters()
    for r in first:
        try:
            total = total.merge(SpecCounters(int(r["num_drafts"]), int(r["num_draft_tokens"]),
                                             int(r["num_accepted_tokens"]), [int(x) for x in r["accepted_per_position"]]))
        except (TypeError, ValueError):
            return None  # a malformed counter: what is wrong is said by the schema checks, not here
    out = total.to_dict()
    return {key: out[key] for key in RECOMPUTED}


def _agree(stored, computed) -> bool:
    if isinstance(computed, list):
        return isinstance(stored, list) and len(stored) == len(computed) and all(map(_agree, stored, computed))
    if not isinstance(stored, (int, float)) or isinstance(stored, bool):
        return False
    if math.isnan(computed):
        return math.isnan(stored)
    return math.isclose(stored, computed, rel_tol=_REL_TOLERANCE, abs_tol=1e-12)


def contradictions(result: dict) -> list[tuple[str, object, object]]:
    """(metric, stored, recomputed) for every RECOMPUTED metric the result states that its requests contradict."""
    computed = recomputed(result)
    metrics = result.get("metrics")
    if computed is None or not isinstance(metrics, dict):
        return []
    return [(key, metrics[key], value) for key, value in computed.items()
            if key in metrics and metrics[key] is not None and not _agree(metrics[key], value)]
