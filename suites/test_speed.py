"""Speed suite: GPU-bound cases (synthetic 7B and 1B Llama shapes on the static engine: plain, Medusa chain and tree;
on the 7B also EAGLE-2's dynamic tree, an EAGLE-3 chain and a draft model over profile heads) gated tightly against
baselines/speed.json, with repeats; skips without a GPU or the synthetic weights, naming what is missing."""

from __future__ import annotations

import pytest

from specbench.pytest_plugin import case_params, skip_unless_available


@pytest.mark.parametrize("case", case_params("speed"))
def test_speed_case(case, specbench_run):
    skip_unless_available(case)
    result = specbench_run(case)
    metrics = result["metrics"]
    print(f"{result['case_id']}: {metrics['tokens_per_s']:.1f} tok/s, speedup {metrics['speedup']:.3f}, decode-phase "
          f"{metrics['decode_speedup']:.3f} (predicted {metrics['predicted_speedup']:.3f}), MAL "
          f"{metrics['mean_acceptance_length']:.2f}, T(K+1)/T(1) {metrics['verify_cost_ratio']:.3f}, draft cost "
          f"{metrics['draft_cost_ratio']:.3f} T(1)")
