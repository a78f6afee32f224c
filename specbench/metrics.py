"""Speculative-decoding counters and the metrics derived from them (docs/metrics.md).

Definitions, kept identical for chains and trees:
- a *draft* is one verification step that carried at least one draft token;
- ``num_draft_tokens`` adds, per draft, the depth of the drafted tree (the length of its longest
  candidate path), so a chain of K tokens counts K, as vLLM counts it, and a tree counts the
  tokens one accepted path could at most contribute;
- ``num_accepted_tokens`` counts draft tokens accepted; the target's own bonus/correction token
  is never counted;
- ``acceptance_rate`` = accepted / draft tokens (NaN when nothing was drafted);
- ``mean_acceptance_length`` = 1 + accepted / drafts: tokens emitted per target forward
  (plain decoding scores 1.0);
- ``per_position_acceptance_rate[i]`` = drafts whose position i was accepted / drafts.
Counters count what was verified, including tokens later cut by ``max_new_tokens`` or EOS.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

METRIC_NAMES = (
    "num_drafts",
    "num_draft_tokens",
    "num_accepted_tokens",
    "acceptance_rate",
    "mean_acceptance_length",
    "per_position_acceptance_rate",
    "time_to_first_token_s",
    "per_token_latency_s",
    "tokens_per_s",
    "peak_memory_bytes",
)


@dataclass
class SpecCounters:
    """Counters of one request (or of a whole run, after :meth:`merge`)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # accepted_per_position[i]: drafts in which draft position i (0-based) was accepted.
    accepted_per_position: list[int] = field(default_factory=list)
    num_target_forwards: int = 0

    def record_step(self, draft_depth: int, num_accepted: int) -> None:
        """Count one verification step that drafted ``draft_depth`` positions (0 = plain step)."""
        if num_accepted > draft_depth:
            raise ValueError(f"num_accepted={num_accepted} exceeds draft depth {draft_depth}")
        self.num_target_forwards += 1
        if draft_depth == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += draft_depth
        self.num_accepted_tokens += num_accepted
        if len(self.accepted_per_position) < draft_depth:
            self.accepted_per_position.extend([0] * (draft_depth - len(self.accepted_per_position)))
        for position in range(num_accepted):
            self.accepted_per_position[position] += 1

    def merge(self, other: "SpecCounters") -> "SpecCounters":
        """Return the sum of two counters (aggregating requests)."""
        width = max(len(self.accepted_per_position), len(other.accepted_per_position))
        pad = lambda xs: xs + [0] * (width - len(xs))  # noqa: E731
        return SpecCounters(
            num_drafts=self.num_drafts + other.num_drafts,
            num_draft_tokens=self.num_draft_tokens + other.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens + other.num_accepted_tokens,
            accepted_per_position=[a + b for a, b in zip(pad(self.accepted_per_position), pad(other.accepted_per_position))],
            num_target_forwards=self.num_target_forwards + other.num_target_forwards,
        )

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else math.nan

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def per_position_acceptance_rate(self) -> list[float]:
        if not self.num_drafts:
            return []
        return [count / self.num_drafts for count in self.accepted_per_position]

    def to_dict(self) -> dict:
        out = asdict(self)
        out["acceptance_rate"] = self.acceptance_rate
        out["mean_acceptance_length"] = self.mean_acceptance_length
        out["per_position_acceptance_rate"] = self.per_position_acceptance_rate
        return out


@dataclass
class RequestTiming:
    """Wall-clock figures of one request, measured with device synchronisation."""

    num_output_tokens: int
    time_to_first_token_s: float
    total_s: float
    peak_memory_bytes: int | None = None

    @property
    def per_token_latency_s(self) -> float:
        """Mean time per output token after the first (NaN with a single token)."""
        if self.num_output_tokens <= 1:
            return math.nan
        return (self.total_s - self.time_to_first_token_s) / (self.num_output_tokens - 1)

    @property
    def tokens_per_s(self) -> float:
        return self.num_output_tokens / self.total_s if self.total_s > 0 else math.nan

    def to_dict(self) -> dict:
        out = asdict(self)
        out["per_token_latency_s"] = self.per_token_latency_s
        out["tokens_per_s"] = self.tokens_per_s
        return out


def aggregate(counters: list[SpecCounters], timings: list[RequestTiming]) -> dict:
    """Run-level metrics: pooled counters, and per-request means for speed (docs/metrics.md)."""
    total = SpecCounters()
    for c in counters:
        total = total.merge(c)
    out = total.to_dict()
    finite_mean = lambda xs: (sum(xs) / len(xs)) if xs else math.nan  # noqa: E731
    out["time_to_first_token_s"] = finite_mean([t.time_to_first_token_s for t in timings])
    out["per_token_latency_s"] = finite_mean(
        [t.per_token_latency_s for t in timings if not math.isnan(t.per_token_latency_s)]
    )
    out["tokens_per_s"] = finite_mean([t.tokens_per_s for t in timings if not math.isnan(t.tokens_per_s)])
    peaks = [t.peak_memory_bytes for t in timings if t.peak_memory_bytes is not None]
    out["peak_memory_bytes"] = max(peaks) if peaks else None
    out["num_requests"] = len(counters)
    out["num_output_tokens"] = sum(t.num_output_tokens for t in timings)
    return out


def common_prefix(a: list[int], b: list[int]) -> int:
    """Tokens two outputs share before they first differ (the shorter length when one is a prefix of the other):
    the lossless check's ``first_divergence`` and ``match_fraction`` (docs/metrics.md#lossless-check), and where an
    engine under test first parts from the reference engine."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))
