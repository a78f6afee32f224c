"""Decode latency per case with pytest-benchmark (pedantic: fixed rounds, one warm-up round).

``Decoder.generate`` synchronises the device before it returns, so each round's wall time covers
the GPU work. Figures are reported, not asserted: speed is gated by the harness against baselines
recorded on the same hardware class (``specbench run`` / the suites). Under pytest-xdist,
pytest-benchmark disables timing and each benchmark runs once as a smoke test.
"""

from __future__ import annotations

import pytest

from specbench.harness import build_proposer, generation_config, load_prompt_ids, load_target
from specbench.pytest_plugin import case_params, skip_unless_available

LATENCY_CASES = [p for p in case_params("medusa") if p.values[0].name in (
    "chain-k3", "tree-63", "chain-k3-cuda-fp32", "tree-63-cuda-bf16", "synth-7b-tree-63-bf16")]


@pytest.mark.parametrize("case", LATENCY_CASES)
@pytest.mark.parametrize("method", ["plain", "speculative"])
def test_decode_latency(case, method, benchmark):
    skip_unless_available(case)
    from specbench.engine.decode import Decoder

    target, tokenizer = load_target(case)
    proposer = build_proposer(case, target) if method == "speculative" else None
    decoder = Decoder(target, proposer, generation_config(case, tokenizer))
    prompts, _ = load_prompt_ids(case, tokenizer, target.vocab_size)
    prompt = prompts[0][1]
    benchmark.group = case.case_id
    benchmark.extra_info.update(case_id=case.case_id, method=method, device=case.device, dtype=case.dtype)
    result = benchmark.pedantic(decoder.generate, args=(prompt,), rounds=5, warmup_rounds=1, iterations=1)
    benchmark.extra_info["output_tokens"] = len(result.output_token_ids)
    benchmark.extra_info["mean_acceptance_length"] = result.counters.mean_acceptance_length
    assert len(result.output_token_ids) >= 1
