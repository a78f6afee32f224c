"""The static target on CUDA (marked large_gpu), at batch size 1: CUDA-graph replay, torch.compile's fused stages and
a host-held draft decode token for token as the eager static forward or the transformers target, on the reference
model."""

from __future__ import annotations

import pytest
import torch

from specbench.checkpoints.resolve import load_target_model
from specbench.engine.hf_target import HFTarget
from specbench.engine.static_target import StaticTarget
from specbench.proposers.medusa import MedusaProposer
from specbench.proposers.ngram import NgramProposer
from _prompts import repetitive_prompt
from test_static_target import MAX_NEW, assert_same_decoding, decode


@pytest.mark.large_gpu(min_gb=1)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_replay_equals_the_eager_forward(dtype):
    """Graph capture must change nothing but launch count: the same tokens and counters as the eager
    static forward (same kernels, same order) for plain, chain and tree steps on the reference model."""
    model = load_target_model("specbench-ref/gsm8k-tiny", dtype=dtype, device="cuda")
    graphed = StaticTarget.from_hf_model(model, compile=False)
    eager = StaticTarget.from_hf_model(model, cuda_graphs=False, compile=False)
    assert graphed.cuda_graphs and not eager.cuda_graphs
    prompt = torch.tensor(list(range(5, 40)))
    for target in (graphed, eager):  # the largest cache first: a cache that grows drops the graphs captured on it
        target.reserve(prompt.numel() + MAX_NEW + 2 * 63, 0)  # queued ahead (CUDA), a run holds two steps' drafts
    heads = MedusaProposer.from_options(graphed, path="specbench-ref/gsm8k-tiny-medusa", num_speculative_tokens=3).heads
    for options in ({"num_speculative_tokens": 3}, {"tree": "gsm8k-tiny-63"}):
        for use in (None, options):
            want = decode(eager, use and MedusaProposer.from_options(eager, heads=heads, **use), prompt, reserve=True)
            got = decode(graphed, use and MedusaProposer.from_options(graphed, heads=heads, **use), prompt, reserve=True)
            assert got.output_token_ids == want.output_token_ids
            assert got.counters == want.counters
    assert {kind for kind, _, _ in graphed.graphs.captured} == {"plain", "chain", "tree"}  # keys (kind, width, span)
    assert all(n == 1 for n in graphed.graphs.captures.values()) and graphed.capture_seconds > 0


@pytest.mark.large_gpu(min_gb=1)
def test_a_host_held_draft_decodes_on_cuda_as_through_transformers():
    """n-gram drafts live on the host: on CUDA the root and the draft go up in one copy and a chain's verification
    reads no parents; tokens and counters must equal the transformers target's (fp32, reference model)."""
    model = load_target_model("specbench-ref/gsm8k-tiny", dtype=torch.float32, device="cuda")
    static = StaticTarget.from_hf_model(model, compile=False)
    prompts = [repetitive_prompt(seed, vocab_size=model.config.vocab_size) for seed in range(3)]
    drafts = assert_same_decoding(HFTarget(model), static, lambda t: NgramProposer(num_speculative_tokens=3),
                                  prompts, reserve=True)
    assert drafts > 0 and any(kind == "chain" for kind, _, _ in static.graphs.captured)  # drafted through a graph


@pytest.mark.large_gpu(min_gb=1)
def test_compiled_graphs_decode_as_the_eager_forward():
    """torch.compile fuses kernels and may reorder fp32 sums (~1e-6); the reference model's greedy margins
    are far wider, so tokens and counters must still equal the eager static forward's."""
    model = load_target_model("specbench-ref/gsm8k-tiny", dtype=torch.float32, device="cuda")
    compiled = StaticTarget.from_hf_model(model)  # on CUDA the stages are compiled unless compile=False
    eager = StaticTarget.from_hf_model(model, cuda_graphs=False, compile=False)
    assert compiled.compiled and not eager.compiled
    prompt = torch.tensor(list(range(5, 40)))
    heads = MedusaProposer.from_options(compiled, path="specbench-ref/gsm8k-tiny-medusa", num_speculative_tokens=3).heads
    for target in (compiled, eager):
        target.reserve(prompt.numel() + MAX_NEW + 63, 0)
    for use in (None, {"num_speculative_tokens": 3}, {"tree": "gsm8k-tiny-63"}):
        want = decode(eager, use and MedusaProposer.from_options(eager, heads=heads, **use), prompt, reserve=True)
        got = decode(compiled, use and MedusaProposer.from_options(compiled, heads=heads, **use), prompt, reserve=True)
        assert got.output_token_ids == want.output_token_ids
        assert got.counters == want.counters
