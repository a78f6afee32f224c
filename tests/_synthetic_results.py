"""Synthetic run results in the RESULT_SCHEMA shape, for the baseline and gate tests.

A chain of K draft tokens per step; request r accepts each next position with probability q_r, where
q_r is fixed by the prompt (prompt difficulty, the same in every run) and the draws depend on ``seed``
(sampling noise). Aggregates come from specbench.metrics, so they follow the project's definitions.
"""

from __future__ import annotations

import copy
import random

from specbench.metrics import RequestTiming, SpecCounters, aggregate


def make_result(seed: int = 0, *, num_requests: int = 40, accept_scale: float = 1.0, speed_scale: float = 1.0,
                hardware_class: str = "cpu", dtype: str = "float32", num_speculative_tokens: int = 3,
                max_new_tokens: int = 64, name: str = "medusa-chain-k3", suite: str = "medusa",
                gate_speed: bool | None = True) -> dict:
    case = {
        "name": name, "suite": suite, "target": "specbench-ref/gsm8k-tiny",
        "proposer": {"name": "medusa", "num_speculative_tokens": num_speculative_tokens},
        "prompts": {"name": "gsm8k", "num_prompts": num_requests, "n_shot": 1},
        "sampling": {"temperature": 0.0, "top_p": 1.0, "acceptance": "auto"},
        "dtype": dtype, "device": "cpu", "max_new_tokens": max_new_tokens, "seed": 0, "ignore_eos": False,
        "gate_speed": gate_speed,  # these synthetic timings are controlled, so gate them even on "cpu"
    }
    counters, timings, requests = [], [], []
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
        tokens_per_s = 40.0 * speed_scale * rng.gauss(1.0, 0.05)
        plain_tokens_per_s = 25.0 * rng.gauss(1.0, 0.05)
        ttft = 0.05 / speed_scale * rng.gauss(1.0, 0.05)
        timing = RequestTiming(max_new_tokens, ttft, max_new_tokens / tokens_per_s)
        counters.append(c)
        timings.append(timing)
        requests.append({
            "prompt_id": f"gsm8k-{i}", "output_token_ids": list(range(max_new_tokens)),
            "plain_output_token_ids": list(range(max_new_tokens)),
            "num_drafts": c.num_drafts, "num_draft_tokens": c.num_draft_tokens,
            "num_accepted_tokens": c.num_accepted_tokens, "accepted_per_position": list(c.accepted_per_position),
            "acceptance_rate": c.acceptance_rate, "mean_acceptance_length": c.mean_acceptance_length,
            "tokens_per_s": timing.tokens_per_s, "plain_tokens_per_s": plain_tokens_per_s,
            "time_to_first_token_s": ttft,
        })
    metrics = aggregate(counters, timings)
    metrics["plain_tokens_per_s"] = sum(r["plain_tokens_per_s"] for r in requests) / num_requests
    metrics["speedup"] = metrics["tokens_per_s"] / metrics["plain_tokens_per_s"]
    return {
        "schema": 1, "case": case, "case_id": f"{suite}/{name}", "metrics": metrics, "requests": requests,
        "correctness": {"checked": True, "exact": True, "match_fraction": 1.0, "first_divergence": [None] * num_requests},
        "env": {"hardware_class": hardware_class, "git_commit": "0123abc", "torch": "2.13", "dtype": dtype},
        "created_at": "2026-11-30T10:00:00Z",
    }


def with_divergence(result: dict, request_index: int, position: int, *, match_fraction: float) -> dict:
    """A copy of ``result`` whose request ``request_index`` first differs from plain decoding at ``position``."""
    out = copy.deepcopy(result)
    out["correctness"]["exact"] = False
    out["correctness"]["match_fraction"] = match_fraction
    out["correctness"]["first_divergence"][request_index] = position
    return out
