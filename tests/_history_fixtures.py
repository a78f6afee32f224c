"""A synthetic results history with known injected regressions, for the report tests.

24 commits, three cases, two hardware classes, one run per commit (two at commits 5 and 18: reruns), every
metric with run-to-run noise (quality 1%, speed 2% relative sd: a same-run speedup and a quiet machine).
Speed is drawn independently of acceptance, so each injected change shows only where it is put:

- ACCEPTANCE_CASE: acceptance rate x0.8 (ACCEPTANCE_FACTOR) from commit 12 on, on both hardware classes
  (MAL = 1 + K x rate follows: 2.8 -> 2.44, -12.9%).
- SPEED_CASE: tokens/s x0.7 (SPEED_FACTOR) from commit 16 on, on the GPU class only (speedup x0.7, s/token
  x1.43 follow; plain decoding and time to first token unchanged).
- STEADY_CASE, nothing to flag: one bad run (tokens/s x0.5, TTFT x2 at commit 9 on cpu), acceptance x1.1 from
  commit 14 (an improvement), and a machine 8% slower from commit 8 on cpu (spec and plain alike: tokens/s
  within its 15% tolerance, speedup unchanged).

Baselines hold the noise-free levels before any change.
"""

from __future__ import annotations

import hashlib
import random
from datetime import datetime, timedelta, timezone

from specbench.gating.regenerate import update_baseline
from specbench.gating.history import append_results

GPU = "NVIDIA H200"
HARDWARE_CLASSES = ("cpu", GPU)
ACCEPTANCE_CASE, SPEED_CASE, STEADY_CASE = "demo/tiny-ngram-k3", "medusa/medusa-chain-k3", "medusa/medusa-tree-63"
CASES = (ACCEPTANCE_CASE, SPEED_CASE, STEADY_CASE)
NUM_COMMITS = 24
RERUN_COMMITS = (5, 18)
ACCEPTANCE_DROP_AT, SPEED_DROP_AT = 12, 16
ACCEPTANCE_FACTOR, SPEED_FACTOR = 0.8, 0.7  # the injected regressions
GPU_DRIVER = "570.86.15"
K = 3  # draft tokens per step
POSITION_WEIGHTS = (1.3, 1.0, 0.7)  # per-position rate = acceptance rate x weight; the weights average 1
START = datetime(2026, 11, 1, tzinfo=timezone.utc)
LEVELS = {  # noise-free (acceptance rate, spec tok/s, plain tok/s) per hardware class
    ACCEPTANCE_CASE: {"cpu": (0.60, 40.0, 25.0), GPU: (0.60, 400.0, 250.0)},
    SPEED_CASE: {"cpu": (0.55, 35.0, 24.0), GPU: (0.55, 300.0, 200.0)},
    STEADY_CASE: {"cpu": (0.70, 45.0, 25.0), GPU: (0.70, 450.0, 260.0)},
}
TTFT_S = {"cpu": 0.05, GPU: 0.005}


def commit(i: int) -> str:
    return hashlib.sha1(f"commit {i}".encode()).hexdigest()


def expected_regressions() -> set[tuple[str, str, str, str]]:
    """(case, metric, hardware class, commit) of every injected regression, and nothing else."""
    drop, speed = commit(ACCEPTANCE_DROP_AT), commit(SPEED_DROP_AT)
    return ({(ACCEPTANCE_CASE, m, hw, drop) for m in ("acceptance_rate", "mean_acceptance_length")
             for hw in HARDWARE_CLASSES}
            | {(SPEED_CASE, m, GPU, speed) for m in ("tokens_per_s", "speedup", "per_token_latency_s")})


def case_definition(case_id: str) -> dict:
    suite, name = case_id.split("/")
    return {"name": name, "suite": suite, "target": "specbench-ref/gsm8k-tiny",
            "proposer": {"name": "ngram" if suite == "demo" else "medusa", "num_speculative_tokens": K},
            "prompts": {"name": "gsm8k", "num_prompts": 10, "n_shot": 1},
            "sampling": {"temperature": 0.0, "top_p": 1.0, "acceptance": "auto"},
            "dtype": "float32", "device": "cpu", "max_new_tokens": 64, "seed": 0, "ignore_eos": False}


def synthetic_result(case_id: str, hardware_class: str, commit_id: str, created_at: datetime, *, acceptance: float,
                     tokens_per_s: float, plain_tokens_per_s: float, ttft: float) -> dict:
    """A RESULT_SCHEMA dict with consistent aggregates (no per-request data: the gates use tolerances)."""
    return {
        "schema": 1, "case": case_definition(case_id), "case_id": case_id,
        "metrics": {
            "num_drafts": 100, "num_draft_tokens": 100 * K, "num_accepted_tokens": round(100 * K * acceptance),
            "acceptance_rate": acceptance, "mean_acceptance_length": 1 + K * acceptance,
            "per_position_acceptance_rate": [acceptance * w for w in POSITION_WEIGHTS],
            "time_to_first_token_s": ttft, "per_token_latency_s": 1 / tokens_per_s, "tokens_per_s": tokens_per_s,
            "peak_memory_bytes": None, "plain_tokens_per_s": plain_tokens_per_s,
            "speedup": tokens_per_s / plain_tokens_per_s, "num_requests": 10, "num_output_tokens": 640,
        },
        "requests": [],
        "correctness": {"checked": True, "exact": True, "match_fraction": 1.0, "first_divergence": []},
        "env": {"hardware_class": hardware_class, "git_commit": commit_id, "git_dirty": False, "torch": "2.13.0",
                "transformers": "5.24.0", "python": "3.11.2", "dtype": "float32",
                "gpu_name": None if hardware_class == "cpu" else hardware_class,
                "driver_version": None if hardware_class == "cpu" else GPU_DRIVER,
                "cuda_version": None if hardware_class == "cpu" else "12.8"},
        "details": {}, "created_at": created_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def history_results(seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    noisy = lambda value, sd: value * (1 + rng.gauss(0.0, sd))  # noqa: E731
    results = []
    for i in range(NUM_COMMITS):
        for rerun in range(2 if i in RERUN_COMMITS else 1):
            when = START + timedelta(hours=6 * i, minutes=20 * rerun)
            for c, case_id in enumerate(CASES):
                for h, hw in enumerate(HARDWARE_CLASSES):
                    acceptance, spec, plain = LEVELS[case_id][hw]
                    ttft = TTFT_S[hw]
                    if case_id == ACCEPTANCE_CASE and i >= ACCEPTANCE_DROP_AT:
                        acceptance *= ACCEPTANCE_FACTOR
                    if case_id == SPEED_CASE and hw == GPU and i >= SPEED_DROP_AT:
                        spec *= SPEED_FACTOR
                    if case_id == STEADY_CASE:
                        if i >= 14:
                            acceptance *= 1.1
                        if hw == "cpu" and i >= 8:
                            spec, plain = spec * 0.92, plain * 0.92
                        if hw == "cpu" and i == 9:
                            spec, ttft = spec * 0.5, ttft * 2
                    results.append(synthetic_result(
                        case_id, hw, commit(i), when + timedelta(seconds=10 * c + h),
                        acceptance=noisy(acceptance, 0.01), tokens_per_s=noisy(spec, 0.02),
                        plain_tokens_per_s=noisy(plain, 0.02), ttft=noisy(ttft, 0.02)))
    return results


def build_history(history_dir, baselines_dir=None, seed: int = 0) -> list[dict]:
    """Write the history (and, if given, baselines at the noise-free starting levels); returns the results."""
    results = history_results(seed)
    append_results(history_dir, results)
    if baselines_dir is not None:
        for case_id in CASES:
            for hw in HARDWARE_CLASSES:
                acceptance, spec, plain = LEVELS[case_id][hw]
                base = synthetic_result(case_id, hw, commit(0), START, acceptance=acceptance, tokens_per_s=spec,
                                        plain_tokens_per_s=plain, ttft=TTFT_S[hw])
                update_baseline(base, baselines_dir, command="tests/_history_fixtures.py", reason="test")
    return results


def latest(results: list[dict], case_id: str, hardware_class: str) -> dict:
    """The last run of a case on a hardware class."""
    return [r for r in results if r["case_id"] == case_id and r["env"]["hardware_class"] == hardware_class][-1]


def write_records(history_dir: str, writer: int, count: int, start=None) -> None:
    """One concurrent writer: ``count`` single-record appends, records 0.5-16 KiB (beyond PIPE_BUF, where
    unsynchronised appends can interleave), case ``conc/w<writer>``, record number in ``num_requests``."""
    if start is not None:
        start.wait()  # all writers released together
    rng = random.Random(writer)
    for i in range(count):
        result = synthetic_result(f"conc/w{writer}", "cpu", commit(i), START + timedelta(seconds=i), acceptance=0.5,
                                  tokens_per_s=10.0, plain_tokens_per_s=8.0, ttft=0.1)
        result["metrics"]["num_requests"] = i
        result["details"] = {"padding": "x" * rng.randrange(512, 16 * 1024)}
        append_results(history_dir, [result])
