"""The single-sequence static engine's prefill through a graph per padded width (engine/prefill_graphs.py, the CPU
stand-in of a CUDA graph): the cache and outputs are the eager prefill's, greedy decoding is unchanged, the decode
loop captures before its clock starts, aux streams survive, and the draft model's own target keeps prefills eager;
its step graphs are prepared before a request too (prepare_steps)."""

from __future__ import annotations

import pytest
import torch

from _prompts import random_prompt
from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.graph_capture import StepGraphs
from specbench.engine.prefill_graphs import CapturedPrefill
from specbench.engine.static_target import StaticTarget
from specbench.proposers import draft_model
from specbench.proposers.ngram import NgramProposer
from test_batched_engine import tiny_llama_model
from test_batched_graphs import FakeCapture

PROMPTS = [random_prompt(9, 1), random_prompt(3, 2), random_prompt(17, 3), random_prompt(40, 4)]  # buckets 16, 16, 32, 64


def targets(capacity: int = 96) -> tuple[StaticTarget, StaticTarget]:
    """(eager, captured): the same weights; the second's prefills replay the CPU stand-in of a CUDA graph."""
    model = tiny_llama_model()
    eager, captured = StaticTarget.from_hf_model(model), StaticTarget.from_hf_model(model)
    captured.prefill_graphs = CapturedPrefill(captured.module, StepGraphs(FakeCapture()))
    for target in (eager, captured):
        target.reserve(capacity)
    return eager, captured


def test_a_captured_prefill_leaves_the_cache_and_outputs_as_the_eager_one():
    eager, captured = targets()
    for prompt in PROMPTS + PROMPTS[:1]:
        want, got = eager.prefill(prompt), captured.prefill(prompt)
        n = prompt.numel()
        assert captured.cache_length == eager.cache_length == n
        torch.testing.assert_close(captured._cache.kv[:, :, :, :n], eager._cache.kv[:, :, :, :n])
        torch.testing.assert_close(got.hidden_states, want.hidden_states)
        torch.testing.assert_close(got.logits, want.logits)
        assert got.logits.shape == want.logits.shape == (1, eager.vocab_size)
    assert captured.prefill_graphs.graphs.captures == {("prefill", 16): 1, ("prefill", 32): 1, ("prefill", 64): 1}
    assert captured.capture_seconds > 0


def test_greedy_decoding_with_captured_prefills_is_unchanged_and_captures_before_the_clock():
    eager, captured = targets()
    calls = []
    for name in ("prepare_prefills", "prepare_steps", "prefill"):
        method = getattr(captured, name)
        setattr(captured, name, lambda *a, _m=method, _n=name: (calls.append(_n), _m(*a))[1])
    config = GenerationConfig(max_new_tokens=12, ignore_eos=True)
    for prompt in PROMPTS:
        want = Decoder(eager, NgramProposer(num_speculative_tokens=3), config).generate(prompt)
        got = Decoder(captured, NgramProposer(num_speculative_tokens=3), config).generate(prompt)
        assert got.output_token_ids == want.output_token_ids and got.counters == want.counters
    # each request prepares its prompt's bucket and its step graphs (captured then, untimed) before the timed prefill
    assert calls == ["prepare_prefills", "prepare_steps", "prefill"] * len(PROMPTS)
    assert captured.prefill_graphs.graphs.captures == {("prefill", 16): 1, ("prefill", 32): 1, ("prefill", 64): 1}


def test_aux_streams_come_through_a_captured_prefill_and_new_aux_layers_drop_its_graphs():
    eager, captured = targets()
    captured.prefill(PROMPTS[0])
    for target in (eager, captured):
        target.set_aux_layers((0, 1))
    assert ("prefill", 16) not in captured.prefill_graphs.graphs  # their outputs changed: captured anew on next use
    want, got = eager.prefill(PROMPTS[1]), captured.prefill(PROMPTS[1])
    assert got.aux_hidden_states.shape == (PROMPTS[1].numel(), 2 * eager.module.shape.hidden_size)
    torch.testing.assert_close(got.aux_hidden_states, want.aux_hidden_states)
    assert captured.prefill_graphs.graphs.captures[("prefill", 16)] == 2


def test_every_sized_step_kind_is_captured_before_a_request_and_none_while_decoding():
    model = tiny_llama_model()
    target = StaticTarget(StaticTarget.from_hf_model(model).module, model.config, graph_backend=FakeCapture())
    with pytest.raises(ValueError, match="prepare_steps before reserve"):
        target.prepare_steps()
    target.reserve(64, 3)
    target.prepare_steps()
    assert set(target._graphs.captures) == {"plain", "chain", "tree"}  # each sized kind, before any step
    prepared = dict(target._graphs.captures)
    config = GenerationConfig(max_new_tokens=12, ignore_eos=True)
    want = Decoder(StaticTarget.from_hf_model(model), NgramProposer(num_speculative_tokens=3), config).generate(PROMPTS[0])
    got = Decoder(target, NgramProposer(num_speculative_tokens=3), config).generate(PROMPTS[0])
    assert got.output_token_ids == want.output_token_ids and got.counters == want.counters
    assert dict(target._graphs.captures) == prepared  # the request replayed them: nothing captured while timed


def test_prepare_prefills_needs_a_reserved_cache():
    with pytest.raises(ValueError, match="prepare_prefills before reserve"):
        StaticTarget.from_hf_model(tiny_llama_model()).prepare_prefills([3])


def test_the_draft_models_own_target_keeps_its_prefills_eager(monkeypatch):
    """Its prefill runs inside the first timed propose of a request, where a capture must not land."""
    seen = {}
    monkeypatch.setattr(StaticTarget, "from_pretrained", classmethod(lambda cls, path, **kw: seen.update(kw) or "draft"))
    target = StaticTarget.from_hf_model(tiny_llama_model())
    assert draft_model._load_draft("some/draft", target) == "draft"
    assert seen["prefill_graphs"] is False and seen["dtype"] == target.dtype


@pytest.mark.large_gpu(min_gb=1)
def test_cuda_captured_prefills_decode_as_eager_prefills():
    """On a GPU (fp32): the prefill graphs' padded, replayed prefill gives every request the greedy tokens and counters
    of the eager prefill, speculative (n-gram) and plain, and each bucket is captured once."""
    model = tiny_llama_model().to("cuda")
    captured, eager = StaticTarget.from_hf_model(model), StaticTarget.from_hf_model(model, prefill_graphs=False)
    assert captured.prefill_graphs.graphs.enabled and not eager.prefill_graphs.graphs.enabled
    for target in (captured, eager):
        target.reserve(96)  # room for the 40-token prompt's bucket (64); its own request reserves only 59 entries
    config = GenerationConfig(max_new_tokens=16, ignore_eos=True)
    for proposer in (None, NgramProposer(num_speculative_tokens=3)):
        for prompt in PROMPTS:
            want = Decoder(eager, proposer, config).generate(prompt)
            got = Decoder(captured, proposer, config).generate(prompt)
            assert got.output_token_ids == want.output_token_ids and got.counters == want.counters
    graphs = captured.prefill_graphs.graphs
    assert graphs.captures == {("prefill", 16): 1, ("prefill", 32): 1, ("prefill", 64): 1}
    assert sum(graphs.replays.values()) >= 2 * len(PROMPTS)
