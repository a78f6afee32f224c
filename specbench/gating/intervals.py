"""Bootstrap confidence intervals of a run's metrics over its requests (and repeats), against a baseline's.

Every gated metric is a ratio estimator ``offset + sum(num) / sum(den)`` over requests (see
``_estimator``). Whole requests are resampled (tokens within one are not independent), paired by
``prompt_id`` when both runs used the same prompts; the interval is of measured - baseline, shifted
by the baseline value. A run of several repeats is gated on the median over repeats: its interval
resamples repeats, then requests within each (``_two_level``). Step-cost ratios and a batch point's
throughput and batch speedup are rows per repeat (REPEAT_LEVEL_METRICS).
specbench.gating.gates explains how the interval enters a verdict.
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
        # decode phase: plain seconds per token / speculative seconds per token
        "decode_speedup": (lambda r: r.get("plain_per_token_latency_s"), per_token_latency, 0.0, math.nan),
        # step costs: rows are a run's repeat records, not its requests (REPEAT_LEVEL_METRICS)
        "verify_cost_ratio": (lambda r: r.get("verify_s"), lambda r: r.get("t1_s"), 0.0, math.nan),
        "draft_cost_ratio": (lambda r: r.get("draft_s"), lambda r: r.get("t1_s"), 0.0, math.nan),
        "step_latency_s": (lambda r: r.get("t1_s"), one, 0.0, math.nan),
        # a batch point's run-level figures, one per repeat record (each repeat times the whole batched run)
        "batch_speedup": (lambda r: r.get("batch_speedup"), one, 0.0, math.nan),
        "throughput_tokens_per_s": (lambda r: r.get("throughput_tokens_per_s"), one, 0.0, math.nan),
    }[name]


# measured once per repeat: rows are the run's repeat records
REPEAT_LEVEL_METRICS = ("verify_cost_ratio", "draft_cost_ratio", "step_latency_s", "batch_speedup",
                        "throughput_tokens_per_s")


def _rows(requests: list[dict] | None, estimator) -> tuple[list, np.ndarray, np.ndarray] | None:
    """(prompt ids, numerators, denominators) of the requests where both are finite numbers."""
    num_of, den_of, _, _ = estimator
    keys, nums, dens = [], [], []
    for i, r in enumerate(requests or []):
        num, den = num_of(r), den_of(r)
        if num is None or den is None or not (math.isfinite(num) and math.isfinite(den)):
            continue
        keys.append(r.get("prompt_id", r.get("repeat", i)))
        nums.append(float(num))
        dens.append(float(den))
    return (keys, np.asarray(nums), np.asarray(dens)) if keys else None


def repeats_of(requests: list[dict] | None) -> list[list[dict]]:
    """The requests grouped by their ``repeat`` (absent: 0), in repeat order."""
    groups: dict[int, list[dict]] = {}
    for r in requests or []:
        groups.setdefault(int(r.get("repeat") or 0), []).append(r)
    return [groups[k] for k in sorted(groups)]


def first_repeat(requests: list[dict] | None) -> list[dict]:
    """The requests of the first repeat: what quality is computed from (every repeat decodes the same tokens)."""
    groups = repeats_of(requests)
    return groups[0] if groups else []


def _two_level(groups: list[list[dict]], estimator, offset: float, empty: float, rng, num_resamples: int) -> np.ndarray | None:
    """(R,) resampled medians over repeats of the per-repeat estimator: repeats drawn with replacement, and
    within each drawn repeat its requests drawn with replacement (a two-stage bootstrap: the spread between
    repeats, host drift, and between requests, prompt difficulty, both enter)."""
    per_repeat = []
    for group in groups:
        rows = _rows(group, estimator)
        if rows is None:
            continue
        _, num, den = rows
        idx = rng.integers(0, len(num), size=(num_resamples, len(num)))  # (R, n)
        per_repeat.append(_resampled(num, den, idx, offset, empty))  # (R,)
    if len(per_repeat) < 2:
        return None
    stats = np.stack(per_repeat)  # (G, R): each repeat's resampled estimator
    pick = rng.integers(0, len(per_repeat), size=(num_resamples, len(per_repeat)))  # (R, G) repeats drawn
    drawn = stats[pick, np.arange(num_resamples)[:, None]]  # (R, G)
    return np.median(drawn, axis=1)  # (R,)


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
    label = name if position is None else f"{name}[{position}]"
    # a seed per metric, so adding a check never changes another check's interval
    rng = np.random.default_rng([seed, zlib.crc32(label.encode())])
    measured_groups = repeats_of(measured_requests) if name not in REPEAT_LEVEL_METRICS else []
    if len(measured_groups) > 1:  # several repeats: the gated value is their median
        stats = _two_level(measured_groups, estimator, offset, empty, rng, num_resamples)
        if stats is None:
            return None
        shift = 0.0
        base_groups = repeats_of(baseline_requests)
        base_stats = (_two_level(base_groups, estimator, offset, empty, rng, num_resamples) if len(base_groups) > 1
                      else _single_level(_rows(baseline_requests, estimator), offset, empty, rng, num_resamples))
        if base_stats is not None:
            stats, shift = stats - base_stats, baseline_value
        return _quantiles(stats, shift, confidence)
    measured, baseline = _rows(measured_requests, estimator), _rows(baseline_requests, estimator)
    if measured is None or len(measured[0]) < 2:
        return None
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
    return _quantiles(stats, shift, confidence)


def _single_level(rows, offset: float, empty: float, rng, num_resamples: int) -> np.ndarray | None:
    """(R,) resampled estimator over one set of rows (None with fewer than two)."""
    if rows is None or len(rows[0]) < 2:
        return None
    _, num, den = rows
    return _resampled(num, den, rng.integers(0, len(num), size=(num_resamples, len(num))), offset, empty)


def _quantiles(stats: np.ndarray, shift: float, confidence: float) -> tuple[float, float] | None:
    stats = stats[np.isfinite(stats)]
    if stats.size == 0:
        return None
    alpha = 1.0 - confidence
    low, high = np.quantile(stats, [alpha / 2, 1 - alpha / 2])
    # every gated metric is >= 0; clipping the shifted interval there changes no verdict (baseline > 0)
    return max(0.0, float(shift + low)), max(0.0, float(shift + high))
