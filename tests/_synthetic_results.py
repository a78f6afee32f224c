"""Synthetic run results in the RESULT_SCHEMA shape, for the baseline and gate tests.

A chain of K draft tokens per step; request r accepts each next position with probability q_r, where
q_r is fixed by the prompt (prompt difficulty, the same in every run) and the draws depend on ``seed``
(sampling noise). Aggregates come from specbench.metrics, so they follow the project's definitions.
"""

from __future__ import annotations

import copy
import random

from specbench.metrics import RequestTiming, SpecCounters, aggregate
from specbench.run.speed import repeat_record, speed_over_repeats


def make_result(seed: int = 0, *, num_requests: int = 40, accept_scale: float = 1.0, speed_scale: float = 1.0,
                hardware_class: str = "cpu", dtype: str = "float32", num_speculative_tokens: int = 3,
                max_new_tokens: int = 64, name: str = "medusa-chain-k3", suite: str = "medusa",
                gate_speed: bool | None = True, num_repeats: int = 1, repeat_drift: float = 0.0,
                verify_scale: float = 1.0, draft_scale: float = 1.0) -> dict:
    """``num_repeats`` repeats of the prompt set; repeat j's speed is scaled by ``1 + repeat_drift * (j - mid)``
    (host drift between repeats); ``verify_scale`` / ``draft_scale`` scale T(K+1) / the draft cost."""
    case = {
        "name": name, "suite": suite, "target": "specbench-ref/gsm8k-tiny",
        "proposer": {"name": "medusa", "num_speculative_tokens": num_speculative_tokens},
        "prompts": {"name": "gsm8k", "num_prompts": num_requests, "n_shot": 1},
        "sampling": {"temperature": 0.0, "top_p": 1.0, "acceptance": "auto"},
        "dtype": dtype, "device": "cpu", "max_new_tokens": max_new_tokens, "seed": 0, "ignore_eos": False,
        "gate_speed": gate_speed,  # these synthetic timings are controlled, so gate them even on "cpu"
    }
    counters, timings, requests, repeats = [], [], [], []
    for j in range(num_repeats):
        drift = 1.0 + repeat_drift * (j - (num_repeats - 1) / 2)
        rows = _requests(seed, j, num_requests, accept_scale, speed_scale * drift, num_speculative_tokens, max_new_tokens)
        for c, timing, request in rows:
            requests.append(request)
            if j == 0:
                counters.append(c)
                timings.append(timing)
        rng = random.Random(seed * 7919 + j)
        t1 = 0.02 / (speed_scale * drift) * rng.gauss(1.0, 0.01)
        costs = {"t1_s": t1, "verify_s": 1.15 * verify_scale * t1 * rng.gauss(1.0, 0.01),
                 "draft_s": 0.05 * draft_scale * t1 * rng.gauss(1.0, 0.01), "verify_width": num_speculative_tokens + 1}
        repeats.append(repeat_record(j, requests[-num_requests:], costs))
    metrics = aggregate(counters, timings)
    metrics.update(speed_over_repeats(repeats))
    return {
        "schema": 2, "case": case, "case_id": f"{suite}/{name}", "metrics": metrics, "requests": requests,
        "correctness": {"checked": True, "exact": True, "match_fraction": 1.0, "first_divergence": [None] * num_requests},
        "env": {"hardware_class": hardware_class, "git_commit": "0123abc", "torch": "2.13", "dtype": dtype},
        "created_at": "2026-11-30T10:00:00Z", "repeats": repeats, "flags": [],
    }


def _requests(seed: int, repeat: int, num_requests: int, accept_scale: float, speed_scale: float,
              num_speculative_tokens: int, max_new_tokens: int) -> list:
    """(counters, timing, request record) per request of one repeat; counters do not depend on the repeat."""
    rows = []
    for i in range(num_requests):
        difficulty = random.Random(1000 + i).uniform(0.75, 1.25)  # a property of prompt i, not of the run
        accept_prob = min(0.95, 0.6 * difficulty * accept_scale)
        rng = random.Random(seed * 100_003 + i)
        c = SpecCounters()
        emitted = 0
        while emitted < max_new_tokens:
            accepted = 0
            while accepted < num_speculative_tokens and rng.random() < accept_prob:
                accepted += 1
            c.record_step(num_speculative_tokens, accepted)
            emitted += accepted + 1
        timing_rng = random.Random((seed * 100_003 + i) * 31 + repeat) if repeat else rng
        tokens_per_s = 40.0 * speed_scale * timing_rng.gauss(1.0, 0.05)
        plain_tokens_per_s = 25.0 * speed_scale * timing_rng.gauss(1.0, 0.05) / (1.0 if speed_scale else 1.0)
        ttft = 0.05 / speed_scale * timing_rng.gauss(1.0, 0.05)
        timing = RequestTiming(max_new_tokens, ttft, max_new_tokens / tokens_per_s)
        plain_ptl = (max_new_tokens / plain_tokens_per_s - ttft) / (max_new_tokens - 1)
        rows.append((c, timing, {
            "prompt_id": f"gsm8k-{i}", "repeat": repeat, "output_token_ids": list(range(max_new_tokens)),
            "plain_output_token_ids": list(range(max_new_tokens)),
            "num_drafts": c.num_drafts, "num_draft_tokens": c.num_draft_tokens,
            "num_accepted_tokens": c.num_accepted_tokens, "accepted_per_position": list(c.accepted_per_position),
            "acceptance_rate": c.acceptance_rate, "mean_acceptance_length": c.mean_acceptance_length,
            "tokens_per_s": timing.tokens_per_s, "plain_tokens_per_s": plain_tokens_per_s,
            "time_to_first_token_s": ttft, "per_token_latency_s": timing.per_token_latency_s,
            "plain_per_token_latency_s": plain_ptl,
        }))
    return rows


def with_divergence(result: dict, request_index: int, position: int, *, match_fraction: float) -> dict:
    """A copy of ``result`` whose request ``request_index`` first differs from plain decoding at ``position``."""
    out = copy.deepcopy(result)
    out["correctness"]["exact"] = False
    out["correctness"]["match_fraction"] = match_fraction
    out["correctness"]["first_divergence"][request_index] = position
    return out
