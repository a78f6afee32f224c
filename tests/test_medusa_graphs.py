"""Medusa's heads through a captured graph (medusa/captured.py, docs/engines.md#captured-medusa-heads): on the CPU
through a stand-in graph that replays the heads' recorded ops (tests/_op_tape.py, which refuses a host read inside
the region, as CUDA's capture does). One graph per batch size, captured in ``reserve`` before decoding, replayed at
every propose; greedy decoding through it equals the eager proposer and the reference token for token and counter
for counter, chain and tree, at B = 1 and 3, queued ahead or read step by step, with slots draining at the end."""

from __future__ import annotations

import pytest
import torch

from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.proposer import ProposerState, for_batch
from specbench.engine.static_target import StaticTarget
from specbench.medusa import captured as captured_module
from specbench.proposers import medusa as medusa_module
from specbench.proposers.medusa import MedusaProposer
from specbench.engine.hf_target import HFTarget
from test_batched_engine import (SMALL_TREE, assert_each_request_as_alone, decode_alone, eos_mid_run, random_heads,
                                 tiny_llama_model)
from _op_tape import record
from _prompts import random_prompt, repetitive_prompt


class TapeCapture:
    """The GraphBackend the heads get instead of CUDA's: each capture is a tape of the region's ops."""

    def __init__(self):
        self.graphs = []

    def capture(self, forward, inputs):
        graph, outputs = record(forward, inputs)
        self.graphs.append(graph)
        return graph, outputs

    def release_pool(self) -> None:
        pass


SHAPES = {"chain": dict(num_speculative_tokens=3), "tree": dict(tree=SMALL_TREE)}


@pytest.fixture(scope="module")
def tiny():
    model = tiny_llama_model()
    prompts = [repetitive_prompt(0), random_prompt(5, 1), repetitive_prompt(2), random_prompt(21, 3), random_prompt(2, 4)]
    return model, StaticTarget.from_hf_model(model), random_heads(), prompts


def medusa(target, heads, shape, backend=None) -> MedusaProposer:
    heads = heads.to(device=target.device, dtype=target.dtype)
    return MedusaProposer(heads, target.lm_head, **SHAPES[shape], cuda_graphs=backend is not None, graph_backend=backend)


def counting(proposer) -> list:
    calls, inner = [], proposer.propose

    def propose(states):
        calls.append(len(states))
        return inner(states)

    proposer.propose = propose
    return calls


@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("ahead", [False, True])
def test_decoding_through_the_captured_heads_equals_eager_and_the_reference(tiny, shape, ahead):
    model, static, heads, prompts = tiny
    config = GenerationConfig(max_new_tokens=10, ignore_eos=True)
    hf = HFTarget(model)
    alone = decode_alone(hf, lambda target: medusa(target, heads, shape), prompts, config)
    for batch_size in (1, 3):
        target = static.with_batch_size(batch_size)
        backend = TapeCapture()
        captured = medusa(target, heads, shape, backend)
        calls = counting(captured)
        decoder = Decoder(target, for_batch(captured, batch_size), config)
        decoder.queue_ahead = ahead  # on the CPU the loop reads each step unless told otherwise
        decoder.prepare(prompts)
        assert captured.captured.graphs.captures == {batch_size: 1} and not calls  # captured before any step
        got = decoder.generate_all(prompts)
        eager = Decoder(target, for_batch(medusa(target, heads, shape), batch_size), config).generate_all(prompts)
        assert_each_request_as_alone(got, alone)
        assert_each_request_as_alone(eager, alone)
        graphs = captured.captured.graphs
        assert graphs.captures == {batch_size: 1} and len(backend.graphs) == 1  # none while decoding
        assert graphs.replays[batch_size] == len(calls) + 1  # the capture's own replay, then one per propose
        if batch_size == 3:  # 5 requests on 3 slots: the last steps draft for fewer slots through the same graph
            assert max(calls) == 3 and min(calls) < 3


def test_a_propose_with_more_slots_than_prepared_runs_eagerly_and_tokens_are_copies(tiny):
    _, static, heads, prompts = tiny
    target = static.with_batch_size(2)
    captured, eager = medusa(target, heads, "tree", TapeCapture()), medusa(target, heads, "tree")
    captured.with_batch_size(2).reserve(64)
    hidden = torch.randn(3, target.hidden_size, generator=torch.Generator().manual_seed(0)).to(target.dtype)  # (3, H)
    states = {b: ProposerState(None, hidden[b]) for b in range(3)}
    for subset in ({0: states[0], 1: states[1]}, states):  # 2 rows: the graph; 3 rows: more than it holds, eagerly
        got, want = captured.propose(subset), eager.propose(subset)
        assert all(torch.equal(got[b].tokens, want[b].tokens) for b in subset)
    assert captured.captured.graphs.replays == {2: 2}  # the capture's and the 2-slot propose's
    draft = captured.propose({0: states[0]})[0]
    before = draft.tokens.clone()
    captured.propose({0: states[2]})  # another replay overwrites the graph's output, not an earlier draft
    assert torch.equal(draft.tokens, before) and not torch.equal(captured.propose({0: states[2]})[0].tokens, before)


def test_the_registry_captures_only_when_switched_on_and_the_target_captures(tiny, monkeypatch):
    _, static, heads, _ = tiny
    asked, real = [], medusa_module.CapturedHeads
    monkeypatch.setattr(medusa_module, "CapturedHeads", lambda *args, **kwargs: asked.append(kwargs["enabled"]) or
                        real(*args, **kwargs))
    graphed = StaticTarget(static.module, static.config, max_context=static.max_context, graph_backend=TapeCapture())
    assert graphed.cuda_graphs and not static.cuda_graphs
    MedusaProposer.from_options(graphed, heads=heads, num_speculative_tokens=3)  # the committed default: off
    monkeypatch.setattr(medusa_module, "CAPTURE_HEADS", True)
    MedusaProposer.from_options(static, heads=heads, num_speculative_tokens=3)  # a target without graphs: eager
    MedusaProposer.from_options(graphed, heads=heads, num_speculative_tokens=3)
    assert asked == [False, False, True]
    assert MedusaProposer.from_options(graphed.with_batch_size(3), heads=heads, num_speculative_tokens=3).batch_size == 3
    assert captured_module.CAPTURE_HEADS is False and medusa_module.CAPTURE_HEADS is True  # only the patch flipped it


@pytest.mark.large_gpu(min_gb=1)
@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_cuda_captured_heads_decode_as_the_reference(shape):
    """On a GPU: the heads through real CUDA graphs (fp32, tiny random Llama, B = 1 and 3, EOS at different steps,
    steps queued ahead as on any GPU) emit every request's tokens and counters as the eager reference."""
    model = tiny_llama_model().to("cuda")
    static, hf, heads = StaticTarget.from_hf_model(model), HFTarget(model), random_heads().to("cuda")
    prompts = [repetitive_prompt(0), random_prompt(5, 1), repetitive_prompt(2), random_prompt(21, 3), random_prompt(2, 4)]
    config = GenerationConfig(max_new_tokens=16, eos_token_ids=(eos_mid_run(hf, prompts, 16),))
    alone = decode_alone(hf, lambda target: medusa(target, heads, shape), prompts, config)
    for batch_size in (1, 3):
        target = static.with_batch_size(batch_size)
        captured = MedusaProposer(heads, target.lm_head, **SHAPES[shape], cuda_graphs=True)
        assert_each_request_as_alone(Decoder(target, for_batch(captured, batch_size), config).generate_all(prompts), alone)
        assert captured.captured.graphs.captures == {batch_size: 1} and captured.capture_seconds > 0
