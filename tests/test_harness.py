"""The harness end to end on the reference model: reproducibility, a broken proposer caught by the
gate against the stored baseline, and the GPU tier's collection on a CPU machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from specbench.gating.baselines import compare
from specbench.cases import find_case
from specbench.run.harness import run_case

ROOT = Path(__file__).resolve().parent.parent


def small(case, **changes):
    from dataclasses import replace

    return replace(case, **changes)


def test_same_seed_same_quality_metrics():
    (case,) = find_case("demo/tiny-ngram-k3")
    case = small(case, max_new_tokens=24, prompts={"name": "synthetic", "num_prompts": 3})
    first, second = run_case(case, progress=False).to_dict(), run_case(case, progress=False).to_dict()
    for name in ("acceptance_rate", "mean_acceptance_length", "per_position_acceptance_rate", "num_accepted_tokens"):
        assert first["metrics"][name] == second["metrics"][name]
    assert [r["output_token_ids"] for r in first["requests"]] == [r["output_token_ids"] for r in second["requests"]]


def test_a_broken_proposer_fails_its_gate(monkeypatch):
    """Drafts shifted by one position (head i's token proposed at position i + 1) must fail the
    stored medusa/chain-k3 baseline, and the message must say which metric, by how much."""
    from specbench.proposers.medusa import MedusaProposer

    def shifted(self, head_logits):
        top1 = head_logits.argmax(dim=-1).T  # (n, K) every slot's chain
        return top1.roll(1, dims=1)  # position 0 gets the last head's token, and so on

    monkeypatch.setattr(MedusaProposer, "tokens_from_logits", shifted)
    (case,) = find_case("medusa/chain-k3")
    result = run_case(case, progress=False).to_dict()
    assert result["correctness"]["exact"]  # greedy verification stays lossless whatever is drafted
    report = compare(result, ROOT / "baselines")
    assert not report.passed
    check = report.check("acceptance_rate")
    assert check.status == "regression"
    message = check.message()
    # the stored baseline is 0.292 (baselines/medusa.json); shifted drafts accept far less
    assert check.measured < 0.5 * check.baseline
    assert message.startswith("medusa/chain-k3: acceptance_rate regressed: measured 0.0")
    assert f"< baseline {check.baseline:.3f} (tolerance 5%, 99% CI [" in message


def test_gpu_tier_collects_and_skips_on_cpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the GPU tier would run, not skip")
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "suites", "-m", "large_gpu", "-q", "-rs", "-p", "no:xdist", "-p", "no:cacheprovider"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert completed.returncode == 0, completed.stdout[-2000:]
    assert "no CUDA device" in completed.stdout
    assert " passed" not in completed.stdout.splitlines()[-1]  # every GPU case skipped, none ran
