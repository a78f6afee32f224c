"""Bootstrap confidence intervals of a run's metrics over its requests, against a baseline's.

Every gated metric is a ratio estimator ``offset + sum(num) / sum(den)`` over requests (see
``_estimator``). Whole requests are resampled (tokens within one are not independent), paired by
``prompt_id`` when both runs used the same prompts; the interval is of measured - baseline, shifted
by the baseline value. specbench.gating.gates explains how the interval enters a verdict.
"""

from __future__ import annotations

import math
import zlib

import numpy as np

DEFAULT_CONFIDENCE = 0.99
DEFAULT_NUM_RESAMPLES = 2000


def per_token_latency(request: dict) -> float | None:
    """A request's mean seconds per output token after the first, as metrics.RequestTiming defines it.

    Taken from the request when present, else derived from its output length, tok/s and TTFT.
    """
    if request.get("per_token_latency_s") is not None:
        return float(request["per_token_latency_s"])
    num_tokens = len(request.get("output_token_ids") or [])
    tokens_per_s, ttft = request.get("tokens_per_s"), request.get("time_to_first_token_s")
    if num_tokens <= 1 or not tokens_per_s or ttft is None:
        return None
    return (num_tokens / tokens_per_s - ttft) / (num_tokens - 1)


# metric -> (numerator of a request, denominator of a request, offset, value when the denominators sum to 0)
def _estimator(name: str, position: int | None):
    def accepted_at(r):
        counts = r.get("accepted_per_position") or []
        return counts[position] if position < len(counts) else 0

    one = lambda r: 1.0  # noqa: E731
    return {
        "acceptance_rate": (lambda r: r.get("num_accepted_tokens"), lambda r: r.get("num_draft_tokens"), 0.0, math.nan),
        "mean_acceptance_length": (lambda r: r.get("num_accepted_tokens"), lambda r: r.get("num_drafts"), 1.0, 1.0),
        "per_position_acceptance_rate": (accepted_at, lambda r: r.get("num_drafts"), 0.0, math.nan),
        "tokens_per_s": (lambda r: r.get("tokens_per_s"), one, 0.0, math.nan),
        "speedup": (lambda r: r.get("tokens_per_s"), lambda r: r.get("plain_tokens_per_s"), 0.0, math.nan),
        "time_to_first_token_s": (lambda r: r.get("time_to_first_token_s"), one, 0.0, math.nan),
        "per_token_latency_s": (per_token_latency, one, 0.0, math.nan),
    }[name]


def _rows(requests: list[dict] | None, estimator) -> tuple[list, np.ndarray, np.ndarray] | None:
    """(prompt ids, numerators, denominators) of the requests where both are finite numbers."""
    num_of, den_of, _, _ = estimator
    keys, nums, dens = [], [], []
    for i, r in enumerate(requests or []):
        num, den = num_of(r), den_of(r)
        if num is None or den is None or not (math.isfinite(num) and math.isfinite(den)):
            continue
        keys.append(r.get("prompt_id", i))
        nums.append(float(num))
        dens.append(float(den))
    return (keys, np.asarray(nums), np.asarray(dens)) if keys else None


def _resampled(num: np.ndarray, den: np.ndarray, idx: np.ndarray, offset: float, empty: float) -> np.ndarray:
    num_sum, den_sum = num[idx].sum(axis=1), den[idx].sum(axis=1)  # (R,), (R,)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den_sum > 0, offset + num_sum / den_sum, empty)  # (R,)


def bootstrap_interval(measured_requests, baseline_requests, baseline_value: float, name: str, *,
                       position: int | None = None, confidence: float = DEFAULT_CONFIDENCE,
                       num_resamples: int = DEFAULT_NUM_RESAMPLES, seed: int = 0) -> tuple[float, float] | None:
    """Interval for the measured value, adjusted for the baseline's own noise (module docstring)."""
    estimator = _estimator(name, position)
    _, _, offset, empty = estimator
    measured, baseline = _rows(measured_requests, estimator), _rows(baseline_requests, estimator)
    if measured is None or len(measured[0]) < 2:
        return None
    label = name if position is None else f"{name}[{position}]"
    # a seed per metric, so adding a check never changes another check's interval
    rng = np.random.default_rng([seed, zlib.crc32(label.encode())])
    m_keys, m_num, m_den = measured
    idx = rng.integers(0, len(m_keys), size=(num_resamples, len(m_keys)))  # (R, n)
    stats = _resampled(m_num, m_den, idx, offset, empty)  # (R,)
    shift = 0.0
    if baseline is not None and len(baseline[0]) >= 2:
        b_keys, b_num, b_den = baseline
        position_of = {k: i for i, k in enumerate(b_keys)}
        if len(set(m_keys)) == len(m_keys) and len(position_of) == len(b_keys) and set(m_keys) == set(b_keys):
            order = np.asarray([position_of[k] for k in m_keys])
            b_idx = order[idx]  # paired: the same prompts drawn on both sides
        else:
            b_idx = rng.integers(0, len(b_keys), size=(num_resamples, len(b_keys)))
        stats = stats - _resampled(b_num, b_den, b_idx, offset, empty)
        shift = baseline_value
    stats = stats[np.isfinite(stats)]
    if stats.size == 0:
        return None
    alpha = 1.0 - confidence
    low, high = np.quantile(stats, [alpha / 2, 1 - alpha / 2])
    # every gated metric is >= 0; clipping the shifted interval there changes no verdict (baseline > 0)
    return max(0.0, float(shift + low)), max(0.0, float(shift + high))
