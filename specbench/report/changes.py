"""Change detection over the results history: find the commit where a metric stepped to a worse level and
stayed there, per case × metric × hardware class, rather than comparing only the last run with a baseline.

The rule (one series = the runs of one case, one metric, one hardware class, oldest first, undefined
values dropped; candidates are commit boundaries, i.e. the first run of each commit):

1. ``before`` = up to WINDOW (5) runs just before the boundary, ``after`` = up to WINDOW runs from it on;
   each needs at least MIN_RUNS (3) to be reported, so a step is flagged once two more runs have confirmed
   it (the last run alone is the gates' job).
2. Worse by more than the tolerance: the relative change of the medians, (median(after) - median(before))
   / |median(before)|, lies beyond ``gates`` tolerance of the metric in its bad direction
   (``gates.DIRECTIONS``: a drop for rates and speeds, a rise for latencies). Medians, so one bad run (a
   noisy neighbour, a throttled GPU) inside either window moves nothing.
3. Larger than the noise: |median(after) - median(before)| > NOISE_MULTIPLE (3) × σ × sqrt(1/n_before +
   1/n_after), σ the pooled spread of both windows around their own medians (1.4826 × MAD, the normal σ
   for normal noise, blind to outliers). Deterministic series (σ = 0) pass on the tolerance alone.
4. A step also makes the neighbouring boundaries pass 2 and 3 (their windows hold mostly the same runs),
   so candidates are ranked by Welch's t of the window means, which peaks at the true step because any
   shifted boundary mixes one level into the other window, and a candidate is kept only when no
   higher-ranked one lies within WINDOW runs of it. Boundaries with fewer than MIN_RUNS runs after them
   take part in this ranking (a single run after them borrows the before-window's spread) but are not yet
   reported: otherwise a step two runs from the end would be flagged one commit early, at the boundary
   whose after-window already holds a majority of the new level.

Improvements are never flagged. Two steps closer than WINDOW runs count as one.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from specbench.gating.gates import DIRECTIONS, HIGHER_IS_BETTER, resolve_tolerances

DETECTED_METRICS = ("acceptance_rate", "mean_acceptance_length", "tokens_per_s", "speedup",
                    "time_to_first_token_s", "per_token_latency_s")
WINDOW = 5
MIN_RUNS = 3
NOISE_MULTIPLE = 3.0
MAD_TO_SIGMA = 1.4826  # σ of normal noise = 1.4826 × its median absolute deviation


@dataclass
class Regression:
    """A step to a worse level of ``metric`` first seen at ``commit`` (values are window medians)."""

    case_id: str
    metric: str
    hardware_class: str
    commit: str | None
    previous_commit: str | None
    created_at: str
    before: float
    after: float
    relative_change: float  # after / before - 1, signed
    tolerance: float
    direction: str
    num_before: int
    num_after: int
    score: float  # Welch's t of the windows (inf for noiseless series)

    def key(self) -> tuple:
        return (self.case_id, self.metric, self.hardware_class, self.commit)

    def message(self) -> str:
        return (f"{self.case_id}: {self.metric} on {self.hardware_class} stepped from {self.before:.4g} to "
                f"{self.after:.4g} ({self.relative_change * 100:+.1f}%, tolerance {self.tolerance * 100:g}%) "
                f"at commit {self.commit} (previous {self.previous_commit}; medians of {self.num_before} runs "
                f"before, {self.num_after} from it)")

    def to_dict(self) -> dict:
        out = asdict(self)
        out["case"] = out.pop("case_id")
        out["score"] = None if math.isinf(self.score) else self.score
        out["message"] = self.message()
        return out


def _welch_t(before: np.ndarray, after: np.ndarray) -> float:
    # a single run after the boundary has no spread of its own: assume the before-window's
    var_after = after.var(ddof=1) if len(after) > 1 else before.var(ddof=1)
    spread = before.var(ddof=1) / len(before) + var_after / len(after)
    difference = abs(after.mean() - before.mean())
    if spread <= 0:
        return math.inf if difference > 0 else 0.0
    return difference / math.sqrt(spread)


def find_steps(values, boundaries, *, direction: str, tolerance: float, window: int = WINDOW,
               min_runs: int = MIN_RUNS, noise_multiple: float = NOISE_MULTIPLE) -> list[dict]:
    """Worsening steps of one series (module docstring): dicts with index, before, after, change, score.

    ``values``: the series, oldest first, all finite; ``boundaries``: indices where a new commit starts.
    Boundaries with fewer than ``min_runs`` runs after them still compete in the ranking (rule 4), so a
    step two runs from the end keeps the boundary before it from being flagged in its place; they are
    reported once enough runs confirm them.
    """
    x = np.asarray(values, dtype=float)  # (n,)
    contenders = []
    for k in boundaries:
        before, after = x[max(0, k - window):k], x[k:k + window]
        if len(before) < min_runs or len(after) < 1:
            continue
        median_before, median_after = float(np.median(before)), float(np.median(after))
        if median_before == 0:
            continue  # no relative change from zero
        change = (median_after - median_before) / abs(median_before)
        worse = -change if direction == HIGHER_IS_BETTER else change
        if not worse > tolerance:
            continue
        deviations = np.concatenate([np.abs(before - median_before), np.abs(after - median_after)])
        sigma = MAD_TO_SIGMA * float(np.median(deviations))
        if abs(median_after - median_before) <= noise_multiple * sigma * math.sqrt(1 / len(before) + 1 / len(after)):
            continue
        contenders.append({"index": k, "before": median_before, "after": median_after, "change": change,
                           "num_before": len(before), "num_after": len(after), "score": _welch_t(before, after)})
    kept = []
    for c in sorted(contenders, key=lambda c: (-c["score"], c["index"])):
        if all(abs(c["index"] - k["index"]) >= window for k in kept):
            kept.append(c)
    return sorted((c for c in kept if c["num_after"] >= min_runs), key=lambda c: c["index"])


def detect_regressions(history, *, metrics=DETECTED_METRICS, tolerances: dict | None = None,
                       baseline_tolerances: dict | None = None, window: int = WINDOW, min_runs: int = MIN_RUNS,
                       noise_multiple: float = NOISE_MULTIPLE) -> list[Regression]:
    """Step regressions in a :func:`specbench.gating.history.load_history` frame, sorted by case, metric,
    hardware class and time.

    Tolerances per case, as the gates layer them: gates.DEFAULT_TOLERANCES, then ``baseline_tolerances
    [case_id]`` (a baseline file's per-case overrides), then the latest run's case ``tolerances``, then
    ``tolerances``.
    """
    found = []
    if history.empty:
        return found
    for (case_id, hardware_class), runs in history.groupby(["case_id", "hardware_class"], sort=True):
        case_definition = runs["case_definition"].iloc[-1] or {}
        tol = resolve_tolerances((baseline_tolerances or {}).get(case_id), case_definition.get("tolerances"),
                                 tolerances)
        for metric in metrics:
            if metric not in runs:
                continue
            series = runs[np.isfinite(runs[metric].to_numpy(dtype=float))]
            commits = series["git_commit"].tolist()
            # a run without a commit is its own candidate: nothing says it shares code with its neighbour
            boundaries = [k for k in range(1, len(series)) if commits[k] is None or commits[k] != commits[k - 1]]
            for step in find_steps(series[metric].to_numpy(dtype=float), boundaries, direction=DIRECTIONS[metric],
                                   tolerance=tol[metric], window=window, min_runs=min_runs,
                                   noise_multiple=noise_multiple):
                k = step["index"]
                found.append(Regression(
                    case_id=case_id, metric=metric, hardware_class=hardware_class, commit=commits[k],
                    previous_commit=commits[k - 1], created_at=series["created_at"].iloc[k].isoformat(),
                    before=step["before"], after=step["after"], relative_change=step["change"], tolerance=tol[metric],
                    direction=DIRECTIONS[metric], num_before=step["num_before"], num_after=step["num_after"],
                    score=step["score"]))
    order = {m: i for i, m in enumerate(metrics)}
    return sorted(found, key=lambda r: (r.case_id, order[r.metric], r.hardware_class, r.created_at))
