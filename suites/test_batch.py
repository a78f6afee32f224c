"""Batch suite: one case per point of a batch-size curve, acceptance (which must not depend on B), batch speedup
and throughput gated per point against baselines/batch.json (CPU tier; the 7B curve with -m large_gpu)."""

from __future__ import annotations

import pytest

from specbench.pytest_plugin import case_params, skip_unless_available


@pytest.mark.parametrize("case", case_params("batch"))
def test_batch_point(case, specbench_run):
    skip_unless_available(case)
    result = specbench_run(case)
    metrics = result["metrics"]
    print(f"{result['case_id']}: B={metrics['batch_size']}, {metrics['throughput_tokens_per_s']:.1f} tok/s, "
          f"batch speedup {metrics['batch_speedup']:.3f}, MAL {metrics['mean_acceptance_length']:.2f}")
