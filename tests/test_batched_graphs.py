"""Graph capture of the static engine's steps (engine/graph_capture.py): the bookkeeping on the CPU through a stand-in
graph that replays the step's recorded ops into its static outputs (tests/_op_tape.py; one capture per (kind, width, span), later steps replay
it, buffers refreshed, graphs dropped with the cache), decoding through it token for token as the eager reference
HFTarget at B = 1 and 3, and on CUDA the captured engine against the eager one and HFTarget."""

from __future__ import annotations

import pytest
import torch

from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.graph_capture import StepGraphs
from specbench.engine.hf_target import HFTarget
from specbench.engine.static_cache import attention_span, attention_spans
from specbench.engine.static_target import StaticTarget
from specbench.engine.step_inputs import SlotInput
from specbench.engine.proposer import for_batch
from test_batched_engine import (assert_each_request_as_alone, decode_alone, eos_mid_run, random_heads,
                                 tiny_llama_model, tiny_proposers)
from _op_tape import record
from _prompts import random_prompt, repetitive_prompt


class ReplayingGraph:
    """A CUDA graph's contract on the CPU: ``replay()`` runs again the ops its capture recorded (tests/_op_tape.py:
    Python's decisions frozen, no host read) over the inputs it was captured with and writes the results into the
    same output tensors; it fails if the target's cache moved since the capture (a real graph would read freed
    memory)."""

    def __init__(self, forward, inputs):
        owner = getattr(getattr(forward, "func", forward), "__self__", None)  # a bound method, or a partial of one
        self.owner = owner
        self.cache_ptr = None if owner is None else owner._cache.kv.data_ptr()
        self.tape, self.outputs = record(forward, inputs)

    def replay(self) -> None:
        if self.owner is not None:
            assert self.owner._cache.kv.data_ptr() == self.cache_ptr, "replayed a graph captured over another cache"
        self.tape.replay()


class FakeCapture:
    """The GraphBackend a target gets instead of CUDA's: counts captures and pool releases."""

    def __init__(self):
        self.graphs: list[ReplayingGraph] = []
        self.pools_released = 0

    def capture(self, forward, inputs):
        graph = ReplayingGraph(forward, inputs)  # its outputs: what the captured step wrote, as a CUDA graph's
        self.graphs.append(graph)
        return graph, graph.outputs

    def release_pool(self) -> None:
        self.pools_released += 1


# --- the helper's bookkeeping ----------------------------------------------------------------------------


def test_step_graphs_capture_once_per_key_and_replay_refreshed_buffers():
    backend = FakeCapture()
    graphs = StepGraphs(backend)
    buffer = torch.tensor([1.0, 2.0])  # (2,) a static input
    calls = []

    def forward(inputs):
        calls.append(1)
        return (inputs * 2,)

    first = graphs.run(("plain", 1), buffer, forward)
    assert torch.equal(first[0], torch.tensor([2.0, 4.0]))
    buffer.copy_(torch.tensor([5.0, 7.0]))  # refreshed in place: the same graph, new values
    second = graphs.run(("plain", 1), buffer, forward)
    assert second[0] is first[0] and torch.equal(second[0], torch.tensor([10.0, 14.0]))
    assert graphs.captures == {("plain", 1): 1} and graphs.replays == {("plain", 1): 2} and len(backend.graphs) == 1
    graphs.run(("chain", 4), buffer, forward)
    other = torch.zeros(2)
    graphs.run(("plain", 1), other, forward)  # reallocated inputs: the key is captured again over them
    assert graphs.captures == {("plain", 1): 2, ("chain", 4): 1} and ("plain", 1) in graphs
    graphs.drop()
    assert not graphs.captured and backend.pools_released == 1
    eager = StepGraphs(backend, enabled=False)
    assert torch.equal(eager.run(("plain", 1), buffer, forward)[0], buffer * 2) and not eager.captures
    assert not StepGraphs.for_device(torch.device("cpu"), True).enabled  # CPU: eager unless a backend is given


def test_cpu_targets_run_eagerly_by_default_and_with_graphs_off():
    static = StaticTarget.from_hf_model(tiny_llama_model())
    assert not static.cuda_graphs and static.capture_seconds == 0.0
    assert not static.with_batch_size(2).cuda_graphs
    off = static.with_batch_size(2, cuda_graphs=False, graph_backend=FakeCapture())
    assert not off.cuda_graphs


@pytest.fixture(scope="module")
def tiny():
    model = tiny_llama_model()
    prompts = [repetitive_prompt(0), random_prompt(5, 1), repetitive_prompt(2), random_prompt(21, 3), random_prompt(2, 4)]
    return model, StaticTarget.from_hf_model(model), random_heads(), prompts, HFTarget(model)


def run_batched(target, proposer, prompts, config):
    return Decoder(target, proposer, config).generate_all(prompts)


@pytest.mark.parametrize("label", ["plain", "ngram", "medusa-chain", "medusa-tree"])
def test_decoding_through_captured_steps_equals_eager_and_the_reference(tiny, label):
    _, static, heads, prompts, hf = tiny
    proposer_for = tiny_proposers(heads)[label]
    config = GenerationConfig(max_new_tokens=12, ignore_eos=True)
    alone = decode_alone(hf, proposer_for, prompts, config)  # the eager reference, one request at a time
    for batch_size in (1, 3):
        backend = FakeCapture()
        graphed = static.with_batch_size(batch_size, cuda_graphs=True, graph_backend=backend)
        eager = static.with_batch_size(batch_size, cuda_graphs=False)
        got = run_batched(graphed, for_batch(proposer_for(static), batch_size), prompts, config)
        want = run_batched(eager, for_batch(proposer_for(static), batch_size), prompts, config)
        assert_each_request_as_alone(got, alone)
        assert_each_request_as_alone(want, alone)
        steps = {(kind, width): n for kind, widths in graphed.verify_widths.items() for width, n in widths.items()}
        captures, replays = graphed.graphs.captures, graphed.graphs.replays
        # the decoder captured every (kind, width, span) before its run (prepare_steps): each once, none while decoding
        assert all(n == 1 for n in captures.values()) and len(backend.graphs) == len(captures)
        assert {key[:2] for key in captures} >= set(steps), (captures, steps)
        shortest, capacity = min(p.numel() for p in prompts), graphed.cache_capacity
        for kind, width, span in captures:
            assert span in attention_spans(shortest + width, capacity)
        assert sum(replays.values()) == len(captures) + sum(steps.values())  # one replay per capture, then the steps
        assert any(n > 1 and span < capacity for (_, _, span), n in replays.items())  # steps read less than the cache
        expected_kinds = {"plain": {"plain"}, "ngram": {"plain", "chain"}, "medusa-chain": {"chain"},
                          "medusa-tree": {"tree"}}[label]
        assert {kind for kind, _ in steps} <= expected_kinds and steps


def test_one_request_at_a_time_with_per_sequence_proposers_decodes_as_the_reference(tiny):
    """The one-sequence form (a case's loop): batch size 1, each request its own run, the per-sequence proposer as
    the one slot; the cache sized once, so the graphs captured over it live through every request."""
    _, static, heads, prompts, hf = tiny
    backend = FakeCapture()
    graphed = StaticTarget(static.module, static.config, max_context=static.max_context, graph_backend=backend)
    assert graphed.cuda_graphs and graphed.batch_size == 1
    graphed.reserve(80, 0)  # the largest cache first: a cache that grows drops the graphs captured on it
    for proposer_for in tiny_proposers(heads).values():
        config = GenerationConfig(max_new_tokens=10, ignore_eos=True)
        for prompt in prompts[:3]:
            want = Decoder(hf, proposer_for(hf), config).generate(prompt)
            got = Decoder(graphed, proposer_for(graphed), config).generate(prompt)
            assert got.output_token_ids == want.output_token_ids and got.counters == want.counters
    assert {kind for kind, _, _ in graphed.graphs.captured} == {"plain", "chain", "tree"}
    assert backend.pools_released == 1  # the first cache only: no request's reserve() grew it
    assert all(n == 1 for n in graphed.graphs.captures.values())
    # every replay of a plain key is a step, but for the one right after its capture (prepare_steps, before a request)
    plain = [key for key in graphed.graphs.captures if key[0] == "plain"]
    assert sum(graphed.graphs.replays[key] for key in plain) == sum(graphed.verify_widths["plain"].values()) + len(plain)


def test_outputs_are_copies_and_a_new_cache_or_aux_layers_drop_the_graphs(tiny):
    _, static, _, prompts, _ = tiny
    backend = FakeCapture()
    target = static.with_batch_size(2, cuda_graphs=True, graph_backend=backend)
    target.reserve(40, 3)
    for slot in (0, 1):
        target.prefill(slot, prompts[slot])
    chain = [SlotInput(torch.tensor([3, 4, 5, 6]), torch.arange(4)), SlotInput(torch.tensor([7, 8]), torch.arange(2))]
    first = target.verify(chain)
    kept = first.logits.clone()
    target.commit([[0], [0]])
    second = target.verify([SlotInput(torch.tensor([9, 1, 2, 3]), torch.arange(4)), None])
    target.commit([[0, 1], None])
    assert torch.equal(first.logits, kept)  # the replay overwrote the graph's outputs, not what verify handed out
    assert not torch.equal(second.logits[0], first.logits[0])  # the refreshed buffers were read
    (key,) = target.graphs.captures  # one (kind, width, span): both steps' longest slot needs the same span
    assert key == ("chain", 4, attention_span(prompts[0].numel() + 4, 40)) and target.graphs.replays == {key: 2}
    target.reserve(80, 3)  # a larger cache: the graphs read the old one's addresses
    assert not target.graphs.captured and backend.pools_released == 2  # (the first reserve dropped none yet)
    target.prefill(0, prompts[0])
    target.verify([SlotInput(torch.tensor([3]), torch.zeros(1, dtype=torch.long)), None])
    target.commit([[0], None])
    target.set_aux_layers((1,))
    assert not target.graphs.captured and backend.pools_released == 3
    assert {key[:2]: n for key, n in target.graphs.captures.items()} == {("chain", 4): 1, ("plain", 1): 1}


# --- CUDA: the real capture --------------------------------------------------------------------------------


@pytest.mark.large_gpu(min_gb=1)
@pytest.mark.parametrize("compile", [False, True])
def test_cuda_captured_engine_equals_eager_and_the_reference(compile):
    """On a GPU: the static engine replaying CUDA graphs (fp32, tiny random Llama, B = 1 and 3 over ragged prompts,
    EOS ending requests at different steps) emits every request's greedy tokens and counters as the eager static
    engine and the eager reference HFTarget. Plain and Medusa steps are queued ahead of their reads there, as on
    any GPU (docs/engines.md#steps-queued-ahead): slots end and refill while the next step is in flight."""
    model = tiny_llama_model().to("cuda")
    static = StaticTarget.from_hf_model(model, compile=compile)
    assert static.cuda_graphs
    hf = HFTarget(model)
    heads = random_heads().to("cuda")
    prompts = [repetitive_prompt(0), random_prompt(5, 1), repetitive_prompt(2), random_prompt(21, 3), random_prompt(2, 4)]
    config = GenerationConfig(max_new_tokens=16, eos_token_ids=(eos_mid_run(hf, prompts, 16),))
    for label, proposer_for in tiny_proposers(heads).items():
        alone = decode_alone(hf, proposer_for, prompts, config)
        assert {r.finish_reason for r in alone} == {"eos", "length"}, label
        for batch_size in (1, 3):
            graphed = static.with_batch_size(batch_size)
            eager = static.with_batch_size(batch_size, cuda_graphs=False)
            assert graphed.cuda_graphs and not eager.cuda_graphs
            got = run_batched(graphed, for_batch(proposer_for(static), batch_size), prompts, config)
            want = run_batched(eager, for_batch(proposer_for(static), batch_size), prompts, config)
            assert_each_request_as_alone(want, alone)
            assert_each_request_as_alone(got, alone)
            assert graphed.graphs.captured and all(n == 1 for n in graphed.graphs.captures.values()), label
            assert graphed.capture_seconds > 0
            if batch_size == 1:  # every admission is one prompt: each replays its bucket's prefill graph
                assert sum(graphed.prefill_graphs.graphs.replays.values()) >= len(prompts), label
