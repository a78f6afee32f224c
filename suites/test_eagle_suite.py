"""EAGLE suite: the reference target drafted by its own EAGLE-1/2 and EAGLE-3 heads (chain, static tree, dynamic
tree), acceptance, lossless decoding and latency per case, gated against baselines/eagle.json (CPU tier; CUDA
twins with -m large_gpu). Named test_eagle_suite: tests/test_eagle.py holds the EAGLE unit tests."""

from __future__ import annotations

import pytest

from specbench.pytest_plugin import case_params, skip_unless_available


@pytest.mark.parametrize("case", case_params("eagle"))
def test_eagle_case(case, specbench_run):
    skip_unless_available(case)
    result = specbench_run(case)
    metrics = result["metrics"]
    print(f"{result['case_id']}: acceptance {metrics['acceptance_rate']:.3f}, MAL {metrics['mean_acceptance_length']:.2f}, "
          f"draft cost {metrics['draft_cost_ratio']:.2f} target steps")
