"""Counters and derived metrics follow docs/metrics.md exactly."""

from __future__ import annotations

import math

import pytest

from specbench.metrics import RequestTiming, SpecCounters, aggregate


def test_definitions_on_a_worked_example():
    counters = SpecCounters()
    counters.record_step(draft_depth=3, num_accepted=2)
    counters.record_step(draft_depth=3, num_accepted=0)
    counters.record_step(draft_depth=0, num_accepted=0)  # a plain step: not a draft
    counters.record_step(draft_depth=3, num_accepted=3)
    assert (counters.num_drafts, counters.num_draft_tokens, counters.num_accepted_tokens) == (3, 9, 5)
    assert counters.acceptance_rate == pytest.approx(5 / 9)
    assert counters.mean_acceptance_length == pytest.approx(1 + 5 / 3)
    assert counters.per_position_acceptance_rate == pytest.approx([2 / 3, 2 / 3, 1 / 3])
    assert counters.num_target_forwards == 4


def test_nothing_drafted():
    counters = SpecCounters()
    counters.record_step(0, 0)
    assert math.isnan(counters.acceptance_rate)
    assert counters.mean_acceptance_length == 1.0
    assert counters.per_position_acceptance_rate == []


def test_accepting_more_than_drafted_is_a_bug():
    with pytest.raises(ValueError, match="exceeds draft depth"):
        SpecCounters().record_step(2, 3)


def test_aggregate_pools_counters_and_averages_speed():
    a, b = SpecCounters(), SpecCounters()
    a.record_step(2, 2)
    b.record_step(4, 1)
    timings = [RequestTiming(10, 0.1, 1.0), RequestTiming(30, 0.2, 1.0)]
    out = aggregate([a, b], timings)
    assert out["acceptance_rate"] == pytest.approx(3 / 6)  # pooled, not a mean of ratios
    assert out["per_position_acceptance_rate"] == pytest.approx([1.0, 0.5, 0.0, 0.0])
    assert out["tokens_per_s"] == pytest.approx(20.0)  # mean of per-request 10 and 30 tok/s
    assert out["per_token_latency_s"] == pytest.approx(((0.9 / 9) + (0.8 / 29)) / 2)
    assert out["peak_memory_bytes"] is None
