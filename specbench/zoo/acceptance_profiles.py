"""Acceptance profiles of the synthetic EAGLE heads and draft model that `specbench zoo synth` writes: the published
per-position rates they follow, and the miss pattern along the target's successor cycle that realises a profile
exactly (docs/zoo.md#proposer-profiles). No torch: the command line reads the defaults."""

from __future__ import annotations

import math

# Spec-Bench, Vicuna-7B, A100, greedy, batch 1: EAGLE-2 reaches MAL 4.34. Spread over the dynamic tree's depth 6 with
# one conditional acceptance p per depth (1 + p + ... + p^6 = 4.34, p = 0.8345): rate_i = p^i
EAGLE2_VICUNA_7B = (0.8345, 0.6965, 0.5812, 0.4851, 0.4048, 0.3378)
# vLLM's EAGLE-3 regression baseline, Llama-3.1-8B, K = 3 (a top-1 chain): MAL 2.60, per position as published
EAGLE3_LLAMA_31_8B_K3 = (0.7296, 0.5208, 0.3545)
# vLLM's draft-model reference, Qwen3-1.7B drafted by Qwen3-0.6B, K = 3: AL 3.7, acceptance 0.90. One conditional
# acceptance p per position (1 + p + p^2 + p^3 = 3.7, p = 0.9482): rate_i = p^i
DRAFT_QWEN3_K3 = (0.9482, 0.8992, 0.8526)


def check_profile(per_position, flag: str) -> tuple[float, ...]:
    """``per_position`` as floats, refused (ValueError naming ``flag`` and the value) unless it is non-empty, in
    [0, 1] and non-increasing: position i + 1 is reached only through position i."""
    profile = tuple(float(p) for p in per_position)
    if not profile:
        raise ValueError(f"{flag}: give at least one per-position acceptance rate, got none")
    bad = [p for p in profile if not 0.0 <= p <= 1.0]  # also refuses nan
    if bad:
        raise ValueError(f"{flag}: per-position acceptance rates must lie in [0, 1], got {bad[0]!r} in {list(profile)}")
    rising = [i for i in range(1, len(profile)) if profile[i] > profile[i - 1]]
    if rising:
        i = rising[0]
        raise ValueError(f"{flag}: per-position acceptance rates must not increase (position {i + 1} is reached only "
                         f"through position {i}), got {profile[i - 1]} then {profile[i]} in {list(profile)}")
    return profile


def accepted_length_shares(per_position: tuple[float, ...]) -> list[float]:
    """(D + 1,) the share of steps accepting exactly a tokens, a = 0..D, of a profile of depth D."""
    reached = [1.0, *per_position, 0.0]
    return [reached[a] - reached[a + 1] for a in range(len(per_position) + 1)]


def _segment_counts(num_ordinary: int, shares: list[float]) -> list[int]:
    """How many segments of each accepted length: the shares apportioned (largest remainder) over as many segments
    as the cycle's length holds at the profile's MAL, then single segments moved one length up or down until the
    lengths add up to exactly ``num_ordinary`` (each move changes one position's rate by one segment)."""
    depth = len(shares) - 1
    mean_length = sum(share * (a + 1) for a, share in enumerate(shares))  # MAL: tokens one segment covers
    total = max(1, round(num_ordinary / mean_length))
    ideal = [total * share for share in shares]
    counts = [math.floor(x) for x in ideal]
    for a in sorted(range(depth + 1), key=lambda a: counts[a] - ideal[a])[: total - sum(counts)]:
        counts[a] += 1
    excess = sum(n * (a + 1) for a, n in enumerate(counts)) - num_ordinary
    while excess:
        step = -1 if excess > 0 else 1  # shorten a segment, or lengthen one
        movable = [a for a in range(depth + 1) if counts[a] and 0 <= a + step <= depth]
        # the move from the most over-represented length to its least represented neighbour
        a = max(movable, key=lambda a: (counts[a] - ideal[a]) - (counts[a + step] - ideal[a + step]))
        counts[a] -= 1
        counts[a + step] += 1
        excess += step
    return counts


def plan_segments(num_ordinary: int, per_position: tuple[float, ...]) -> list[int]:
    """The accepted length of each segment laid end to end around the cycle of ``num_ordinary`` tokens.

    A segment of accepted length a is a run of a tokens the proposer continues right, then one it misses: a step
    that starts at the segment's first token accepts exactly a tokens (a = D: all, its miss never drafted from) and
    the next step starts at the next segment. The counts per length follow the shares (_segment_counts); they are
    laid in a low-discrepancy order (each next segment is the length furthest behind its share so far), so every
    stretch of the text keeps the profile."""
    counts = _segment_counts(num_ordinary, accepted_length_shares(per_position))
    total, used, segments = sum(counts), [0] * len(counts), []
    for k in range(1, total + 1):
        a = max((a for a in range(len(counts)) if used[a] < counts[a]),
                key=lambda a: (k * counts[a] / total - used[a], -a))
        used[a] += 1
        segments.append(a)
    return segments


def miss_positions(segments: list[int]) -> list[int]:
    """Cycle positions of the tokens the proposer gets wrong: each segment's last."""
    positions, end = [], -1
    for a in segments:
        end += a + 1
        positions.append(end)
    return positions


def built_profile(segments: list[int], depth: int) -> list[float]:
    """(depth,) per-position acceptance of one walk around the whole cycle: the share of segments reaching i."""
    return [sum(a >= i for a in segments) / len(segments) for i in range(1, depth + 1)]


def proposer_profile_record(per_position: tuple[float, ...], num_ordinary: int) -> dict:
    """What synth_record.json says about one profile proposer: requested, built over the cycle, its MAL."""
    segments = plan_segments(num_ordinary, per_position)
    built = built_profile(segments, len(per_position))
    return {"requested_per_position_acceptance": list(per_position),
            "built_per_position_acceptance": [round(p, 6) for p in built],
            "expected_mean_acceptance_length": round(1.0 + sum(built), 6), "depth": len(per_position),
            "num_missed_tokens": len(segments)}
