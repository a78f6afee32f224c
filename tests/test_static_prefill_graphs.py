"""One prompt's prefill through a graph per padded width (engine/prefill_graphs.py, the CPU stand-in of a CUDA graph):
the slot's cache and the outputs are the eager prefill's, the other slots untouched, one capture per bucket and eager
where the bucket exceeds the cache; greedy decoding is unchanged, the decode loop captures before its clock starts
(prepare_prefills, which writes no slot), aux streams survive, and the draft model's own target keeps prefills eager."""

from __future__ import annotations

import pytest
import torch

from _prompts import random_prompt
from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.graph_capture import StepGraphs
from specbench.engine.prefill_graphs import CapturedPrefill, bucket
from specbench.engine.static_target import StaticTarget
from specbench.proposers import draft_model
from specbench.proposers.ngram import NgramProposer
from test_batched_engine import tiny_llama_model
from test_batched_graphs import FakeCapture

PROMPTS = [random_prompt(9, 1), random_prompt(3, 2), random_prompt(17, 3), random_prompt(40, 4)]  # buckets 16, 16, 32, 64
BUCKETS = {("prefill", 16): 1, ("prefill", 32): 1, ("prefill", 64): 1}  # PROMPTS' captures: one per bucket


def targets(capacity: int = 96, batch_size: int = 1) -> tuple[StaticTarget, StaticTarget]:
    """(eager, captured): the same weights; the second's one-prompt prefills replay the CPU stand-in of a CUDA graph."""
    model = tiny_llama_model()
    eager, captured = (StaticTarget.from_hf_model(model, batch_size=batch_size) for _ in range(2))
    captured.prefill_graphs = CapturedPrefill(captured.module, StepGraphs(FakeCapture()))
    for target in (eager, captured):
        target.reserve(capacity)
    return eager, captured


def test_a_captured_prefill_leaves_the_slot_as_the_eager_one_and_replays_per_bucket():
    eager, captured = targets(batch_size=2)
    for prompt in PROMPTS + PROMPTS[:1]:  # buckets 16, 16, 32, 64, 16: into slot 1
        want, got = eager.prefill(1, prompt), captured.prefill(1, prompt)
        n = prompt.numel()
        assert captured.cache_length(1) == eager.cache_length(1) == n
        torch.testing.assert_close(captured._cache.kv[:, :, 1, :, :n], eager._cache.kv[:, :, 1, :, :n])
        torch.testing.assert_close(got.hidden_states, want.hidden_states)
        torch.testing.assert_close(got.logits, want.logits)
        assert got.logits.shape == want.logits.shape == (1, eager.vocab_size)
        assert got.logits.argmax(-1).tolist() == want.logits.argmax(-1).tolist()
    assert not captured._cache.kv[:, :, 0].any() and captured.cache_length(0) == 0  # slot 0 never written
    graphs = captured.prefill_graphs.graphs
    assert graphs.captures == BUCKETS
    assert graphs.replays == {("prefill", 16): 3, ("prefill", 32): 1, ("prefill", 64): 1}
    assert captured.capture_seconds > 0
    assert bucket(1) == 16 and bucket(16) == 16 and bucket(17) == 32 and bucket(33) == 64


def test_a_prompt_whose_bucket_exceeds_the_cache_is_prefilled_eagerly():
    _, captured = targets(capacity=24)
    captured.prefill(0, PROMPTS[2])  # 17 tokens: bucket 32 > 24 entries
    assert not captured.prefill_graphs.graphs.captures and captured.cache_length(0) == 17


def test_decoding_with_captured_prefills_is_unchanged_and_captures_before_the_clock():
    eager, captured = targets()
    calls = []
    for name in ("prepare_prefills", "prepare_steps", "prefill"):
        method = getattr(captured, name)
        setattr(captured, name, lambda *a, _m=method, _n=name: (calls.append(_n), _m(*a))[1])
    config = GenerationConfig(max_new_tokens=12, ignore_eos=True)
    for prompt in PROMPTS:  # one request per run, speculative
        want = Decoder(eager, NgramProposer(num_speculative_tokens=3), config).generate(prompt)
        got = Decoder(captured, NgramProposer(num_speculative_tokens=3), config).generate(prompt)
        assert got.output_token_ids == want.output_token_ids and got.counters == want.counters
    # each request prepares its prompt's bucket and its step graphs (captured then, untimed) before the timed prefill
    assert calls == ["prepare_prefills", "prepare_steps", "prefill"] * len(PROMPTS)
    assert captured.prefill_graphs.graphs.captures == BUCKETS
    calls.clear()
    want = Decoder(eager, None, config).generate_all(PROMPTS)  # a queue, plain: at B = 1 each admission is one prompt
    got = Decoder(captured, None, config).generate_all(PROMPTS)
    assert [r.output_token_ids for r in got] == [r.output_token_ids for r in want]
    assert [r.counters for r in got] == [r.counters for r in want]
    assert calls == ["prepare_prefills", "prepare_steps"] + ["prefill"] * len(PROMPTS)  # one preparation per run
    assert captured.prefill_graphs.graphs.captures == BUCKETS  # nothing captured anew


def test_aux_streams_come_through_a_captured_prefill_and_new_aux_layers_drop_its_graphs():
    eager, captured = targets()
    captured.prefill(0, PROMPTS[0])
    for target in (eager, captured):
        target.set_aux_layers((0, 1))
    assert ("prefill", 16) not in captured.prefill_graphs.graphs  # their outputs changed: captured anew on next use
    want, got = eager.prefill(0, PROMPTS[1]), captured.prefill(0, PROMPTS[1])
    assert got.aux_hidden_states.shape == (PROMPTS[1].numel(), 2 * eager.module.shape.hidden_size)
    torch.testing.assert_close(got.aux_hidden_states, want.aux_hidden_states)
    assert captured.prefill_graphs.graphs.captures[("prefill", 16)] == 2


def test_prepared_prefill_graphs_write_no_slot_and_leave_nothing_to_capture_in_a_run():
    with pytest.raises(ValueError, match=r"^prepare_prefills before reserve\(\): size the batched cache first$"):
        StaticTarget.from_hf_model(tiny_llama_model()).prepare_prefills([3])
    _, captured = targets(capacity=64, batch_size=2)
    before = captured._cache.kv.clone()
    captured.prepare_prefills([3, 9, 17, 40, 100])  # buckets 16, 32, 64; 100 tokens (bucket 128) does not fit
    graphs = captured.prefill_graphs.graphs
    assert graphs.captures == BUCKETS
    assert torch.equal(captured._cache.kv, before) and captured.capture_seconds > 0
    config = GenerationConfig(max_new_tokens=6, ignore_eos=True)
    Decoder(captured, None, config).generate_all(PROMPTS + [random_prompt(5, 9)])
    assert all(n == 1 for n in graphs.captures.values()) and sum(graphs.replays.values()) > len(graphs.captures)


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
    assert graphs.captures == BUCKETS
    assert sum(graphs.replays.values()) >= 2 * len(PROMPTS)
