"""EAGLE drafting through captured graphs on the static engine (eagle/captured.py, docs/eagle.md): on the CPU
through a stand-in graph that replays the step's recorded ops into its static outputs (tests/_op_tape.py), each
step key is captured once and replayed after, and greedy decoding, every draft under ragged acceptance and the counters equal the eager
proposer's for the EAGLE chain, EAGLE-1 static tree and EAGLE-2 / EAGLE-3 dynamic trees; on CUDA the same with real
CUDA graphs."""

from __future__ import annotations

import pytest
import torch

from specbench.eagle import captured as captured_module
from specbench.eagle.captured import CATCH_UP, DRAFT
from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.hf_target import HFTarget
from specbench.engine.static_target import StaticTarget
from specbench.proposers import create_proposer
from specbench.proposers.scripted import ScriptedProposer
from test_batched_graphs import FakeCapture as TargetCapture  # the target's own stand-in
from test_eagle import SMALL_TREE, random_head
from test_eagle3 import deep_llama, random_head3
from test_static_target import VOCAB, build
from _op_tape import record
from _prompts import random_prompt, repetitive_prompt

MAX_NEW = 20
CASES = {  # label -> (proposer name, options, head factory, expansion widths per draft, catch-up widths)
    # catch-up widths: accepted + 1, up to the deepest node + 1 (chain K = 3; SMALL_TREE depth 3; dynamic depth 4)
    "eagle-chain": ("eagle", dict(num_speculative_tokens=3), lambda: random_head(with_embed=False), {1: 2}, {1, 2, 3, 4}),
    "eagle1-static-tree": ("eagle", dict(tree=SMALL_TREE), lambda: random_head(), {2: 2}, {1, 2, 3, 4}),
    "eagle2-dynamic-tree": ("eagle", dict(top_k=3, depth=4, total_tokens=12), lambda: random_head(seed=5, std=0.1), {3: 3},
                            {1, 2, 3, 4, 5}),
    "eagle3-dynamic-tree": ("eagle3", dict(top_k=3, depth=4, total_tokens=12), lambda: random_head3(seed=2), {3: 3},
                            {1, 2, 3, 4, 5}),
}


class ReplayingGraph:
    """A CUDA graph's contract on the CPU: ``replay()`` runs again the ops its capture recorded (tests/_op_tape.py:
    Python's decisions frozen, no host read) over the buffers it was captured with into the same output tensors;
    it fails if the draft cache was reallocated since (a real graph would read freed memory)."""

    def __init__(self, forward, inputs):
        self.owner = forward.__self__  # the CapturedHead
        self.kv = self.owner.cache.kv
        self.tape, self.outputs = record(forward, inputs)

    def replay(self) -> None:
        assert self.owner.cache.kv is self.kv, "replayed a graph captured over another draft cache"
        self.tape.replay()


class FakeCapture:
    """The GraphBackend the proposer gets instead of CUDA's."""

    def __init__(self):
        self.graphs: list[ReplayingGraph] = []

    def capture(self, forward, inputs):
        graph = ReplayingGraph(forward, inputs)
        self.graphs.append(graph)
        return graph, graph.outputs

    def release_pool(self) -> None:
        pass


def build_target(label: str, device="cpu", graph_backend=None, **options) -> StaticTarget:
    model = deep_llama() if label.startswith("eagle3") else build("llama")
    static = StaticTarget.from_hf_model(model.to(device), **options)
    if graph_backend is None:
        return static
    return StaticTarget(static.module, static.config, max_context=static.max_context, graph_backend=graph_backend)


def build_proposer(label: str, target, **options):
    name, mode, head, _, _ = CASES[label]
    return create_proposer(name, target, head=head().to(target.device), **mode, **options)


def counting(proposer) -> list:
    """Count ``proposer.propose`` calls (an instance attribute, which the decoder calls)."""
    calls, inner = [], proposer.propose

    def propose(states):
        calls.append(1)
        return inner(states)

    proposer.propose = propose
    return calls


def oracle_driven(proposer, truth: list[int]) -> list:
    """Run the proposer's own drafting every step, recording its drafts, but hand the decoder an oracle chain of 3
    wrong at chosen positions, so the catch-up takes 1 to 4 new positions (ragged acceptance)."""
    oracle = ScriptedProposer(truth, 3, VOCAB, wrong_positions={2, 7, 8, 13})
    drafts, inner, begin = [], proposer.propose, proposer.begin_request

    def propose(states):
        draft = inner(states)[0]
        drafts.append((draft.tokens.cpu().clone(), draft.parents.cpu().clone()))
        return {0: oracle.propose(states[0])}

    def begin_request(slot, prompt_ids):
        begin(slot, prompt_ids)
        oracle.begin_request(prompt_ids)

    proposer.propose, proposer.begin_request = propose, begin_request
    proposer.queues_ahead = False  # the oracle drafts from the accepted tokens: on a GPU too, steps read one by one
    return drafts


PROMPTS = [random_prompt(12, 1), repetitive_prompt(4), random_prompt(7, 3)]


def decode_all(target, proposer, prompts=PROMPTS):
    proposer.reserve(80)  # the largest draft cache first: a cache that grows drops the graphs over it
    decoder = Decoder(target, proposer, GenerationConfig(max_new_tokens=MAX_NEW))
    return [decoder.generate(p) for p in prompts]


@pytest.mark.parametrize("label", sorted(CASES))
def test_each_kind_and_width_is_captured_once_then_replayed(label):
    target = build_target(label, graph_backend=TargetCapture())  # the static engine, its steps "captured"
    backend = FakeCapture()
    proposer = build_proposer(label, target, graph_backend=backend)
    graphs = proposer.captured.graphs
    assert graphs.enabled and proposer.describe()["draft_graphs"] is True
    calls = counting(proposer)
    proposer.reserve(80)  # captures every drafting graph, before any request
    prepared, seconds = dict(graphs.captures), graphs.capture_seconds
    assert {w for kind, w in prepared if kind == CATCH_UP} == CASES[label][4]
    assert (DRAFT, None) in prepared  # the whole draft, every expansion in it, as one step
    assert {w for kind, w in proposer.captured.buffers if kind != CATCH_UP} == set(CASES[label][3])  # its widths
    assert not calls and seconds > 0  # the dummy request is not a propose the decoder sees
    replayed = graphs.replays.copy()
    decode_all(target, proposer)
    assert graphs.captures == prepared and graphs.capture_seconds == seconds  # nothing captured while decoding
    assert all(n == 1 for n in graphs.captures.values()) and len(backend.graphs) == len(graphs.captures)
    catch_ups = sum(n - replayed[(kind, w)] for (kind, w), n in graphs.replays.items() if kind == CATCH_UP)
    assert graphs.replays[(DRAFT, None)] - replayed[(DRAFT, None)] == len(calls)  # one replay drafts every depth
    assert catch_ups == len(calls) - len(PROMPTS)  # the first catch-up of each request (its prompt) runs eagerly
    assert proposer.describe()["draft_capture_seconds"] == graphs.capture_seconds


def test_a_dynamic_tree_of_fewer_nodes_than_levels_prepares_only_the_reachable_widths():
    """total_tokens 3 < depth 6: no accepted path is longer than 3 nodes, so catch-ups of 1 to 4 are prepared (the
    wider ones would run eagerly, as a real request's never do) and decoding captures nothing more."""
    target = build_target("eagle2-dynamic-tree", graph_backend=TargetCapture())
    proposer = create_proposer("eagle", target, head=random_head(seed=5, std=0.1), top_k=2, depth=6, total_tokens=3,
                               graph_backend=FakeCapture())
    proposer.reserve(80)
    prepared = dict(proposer.captured.graphs.captures)
    assert proposer.max_depth == 3 and {w for kind, w in prepared if kind == CATCH_UP} == {1, 2, 3, 4}
    decode_all(target, proposer)
    assert proposer.captured.graphs.captures == prepared


def test_a_head_beside_a_compiled_target_drafts_with_its_compiled_stages(monkeypatch):
    """With COMPILE_DRAFT off, the draft forward's pointwise stages are the target's (compiled here by inductor's
    C++ backend, Triton on CUDA): outputs and counters as with eager stages (fp32, the tiny models' wide greedy
    margins)."""
    monkeypatch.setattr(captured_module, "COMPILE_DRAFT", False)
    label = "eagle2-dynamic-tree"
    compiled, eager = build_target(label, compile=True), build_target(label, compile=False)
    got_proposer, want_proposer = build_proposer(label, compiled), build_proposer(label, eager)
    assert got_proposer.captured.ops is compiled.ops and compiled.ops.compiled
    assert not want_proposer.captured.ops.compiled
    want, got = decode_all(eager, want_proposer), decode_all(compiled, got_proposer)
    assert [(g.output_token_ids, g.counters) for g in got] == [(w.output_token_ids, w.counters) for w in want]
    assert sum(g.counters.num_drafts for g in got) > 0


@pytest.mark.parametrize("label", sorted(CASES))
def test_a_whole_compiled_draft_step_drafts_and_decodes_as_the_eager_one(label, monkeypatch):
    """COMPILE_DRAFT (eagle/captured.py): beside a compiled target the whole draft step (every expansion and the
    rule between them) is one inductor graph for every drafting rule, traced without a break (fullgraph: the static
    tree's top_k once broke it, a property dynamo cannot run), and so is each replayable
    catch-up width (a request's first, over its prompt, stays eager); it decodes with the eager
    proposer's tokens and counters (fp32, the tiny models' wide greedy margins); beside an eager target it is not
    compiled."""
    monkeypatch.setattr(captured_module, "COMPILE_DRAFT", True)
    compiled, eager = build_target(label, compile=True), build_target(label, compile=False)
    got_proposer, want_proposer = build_proposer(label, compiled), build_proposer(label, eager)
    got_steps, want_steps = got_proposer.captured, want_proposer.captured
    assert got_steps.draft_step != got_steps._grow and got_steps.catch_up_step != got_steps._forward
    assert want_steps.draft_step == want_steps._grow and want_steps.catch_up_step == want_steps._forward
    want, got = decode_all(eager, want_proposer), decode_all(compiled, got_proposer)
    assert [(g.output_token_ids, g.counters) for g in got] == [(w.output_token_ids, w.counters) for w in want]
    assert sum(g.counters.num_drafts for g in got) > 0
    # each head's steps compile under code objects of their own, so proposers never share (and fill) one dynamo cache
    other = build_proposer(label, compiled).captured
    codes = [step._torchdynamo_orig_callable.__code__ for step in (got_steps.draft_step, got_steps.catch_up_step,
                                                                   other.draft_step, other.catch_up_step)]
    shared = (got_steps._grow.__code__, got_steps._forward.__code__)
    assert len({id(code) for code in codes}) == 4 and not any(code is c for code in codes for c in shared)


def test_graphs_follow_the_target():
    """Capture exactly beside a StaticTarget that captures its steps; the eager engine and a CPU target without a
    backend draft eagerly, and a reallocated draft cache drops the graphs."""
    label = "eagle-chain"
    static = build_target(label)
    assert not static.cuda_graphs  # the CPU without a stand-in backend: no graphs for the target
    assert not build_proposer(label, static, graph_backend=FakeCapture()).captured.enabled
    assert not build_proposer(label, HFTarget(build("llama")),
                              graph_backend=FakeCapture()).captured.enabled
    graphed = build_target(label, graph_backend=TargetCapture())
    assert not build_proposer(label, graphed).captured.enabled  # CPU: no CUDA graphs to take
    assert not build_proposer(label, graphed, graph_backend=FakeCapture(), cuda_graphs=False).captured.enabled
    proposer = build_proposer(label, graphed, graph_backend=FakeCapture())
    decode_all(graphed, proposer, PROMPTS[:1])
    before = dict(proposer.captured.graphs.captures)
    proposer.reserve(4 * proposer.cache.capacity)  # a larger draft cache: the graphs over the old one go
    decode_all(graphed, proposer, PROMPTS[:1])
    assert set(proposer.captured.graphs.captures) == set(before)
    assert all(n == 2 for n in proposer.captured.graphs.captures.values())


def assert_same_decoding(target, label, make_backend, want_truth=None):
    """Greedy outputs, counters and (oracle-driven, ragged acceptance) every draft of the captured proposer equal
    the eager proposer's on the same static target."""
    eager = build_proposer(label, target, cuda_graphs=False)
    graphed = build_proposer(label, target, cuda_graphs=True, graph_backend=make_backend())
    assert not eager.captured.enabled and graphed.captured.enabled
    want, got = decode_all(target, eager), decode_all(target, graphed)
    for w, g in zip(want, got):
        assert g.output_token_ids == w.output_token_ids and g.counters == w.counters
    if want_truth is not None:
        assert [w.output_token_ids for w in want] == want_truth
    assert sum(g.counters.num_drafts for g in got) > 0
    truth = want[0].output_token_ids
    eager = build_proposer(label, target, cuda_graphs=False)
    graphed = build_proposer(label, target, cuda_graphs=True, graph_backend=make_backend())
    want_drafts, got_drafts = oracle_driven(eager, truth), oracle_driven(graphed, truth)
    graphed.reserve(80)
    prepared = dict(graphed.captured.graphs.captures)
    want_ragged, got_ragged = decode_all(target, eager, PROMPTS[:1]), decode_all(target, graphed, PROMPTS[:1])
    assert graphed.captured.graphs.captures == prepared  # ragged acceptance, every catch-up width: none captured
    assert got_ragged[0].output_token_ids == want_ragged[0].output_token_ids == truth
    assert got_ragged[0].counters == want_ragged[0].counters
    assert len(got_drafts) == len(want_drafts) > 3
    for (wt, wp), (gt, gp) in zip(want_drafts, got_drafts):
        assert torch.equal(gt, wt) and torch.equal(gp, wp)
    widths = {width for kind, width in graphed.captured.graphs.captures if kind == CATCH_UP}
    assert len(widths) >= 3, widths  # several catch-up widths were captured and replayed
    return graphed


@pytest.mark.parametrize("label", sorted(CASES))
def test_captured_drafting_decodes_and_drafts_as_eagerly(label):
    target = build_target(label, graph_backend=TargetCapture())
    plain = HFTarget(deep_llama() if label.startswith("eagle3") else build("llama"))
    truth = [Decoder(plain, None, GenerationConfig(max_new_tokens=MAX_NEW)).generate(p).output_token_ids for p in PROMPTS]
    assert_same_decoding(target, label, FakeCapture, truth)


def test_three_slots_capture_once_and_draft_as_eagerly():
    """B = 3 over five prompts (refills, idle slots at the end), for every case: reserve captures each (kind, width)
    once over the three-slot draft cache; decoding replays every expansion of every propose and the catch-up of
    every propose that begins no request, captures nothing, and drafts, decodes and counts as the eager proposer."""
    prompts = PROMPTS + [random_prompt(9, 4), repetitive_prompt(2)]
    for label, (_, _, _, _, catch_up_widths) in sorted(CASES.items()):
        one_slot = build_target(label, graph_backend=TargetCapture())
        eager = build_proposer(label, one_slot, cuda_graphs=False).with_batch_size(3)
        graphed = build_proposer(label, one_slot, graph_backend=FakeCapture()).with_batch_size(3)
        target = one_slot.with_batch_size(3, graph_backend=TargetCapture())  # EAGLE-3's aux layers carried over
        graphed.reserve(80)
        graphs = graphed.captured.graphs
        prepared, before = dict(graphs.captures), graphs.replays.copy()
        assert {w for kind, w in prepared if kind == CATCH_UP} == catch_up_widths, label
        runs = []
        for proposer in (eager, graphed):
            drafts, fresh, inner, begin = [], [], proposer.propose, proposer.begin_request
            proposer.begin_request = lambda slot, ids, begin=begin, fresh=fresh: fresh.append(slot) or begin(slot, ids)

            def propose(states, inner=inner, drafts=drafts, fresh=fresh):  # (a request begun since the last?, drafts)
                out = inner(states)
                drafts.append((bool(fresh), {slot: draft.tokens.tolist() for slot, draft in out.items()}))
                fresh.clear()
                return out

            proposer.propose = propose
            results = Decoder(target, proposer, GenerationConfig(max_new_tokens=MAX_NEW)).generate_all(prompts)
            runs.append((results, drafts))
        (want, want_drafts), (got, got_drafts) = runs
        assert got_drafts == want_drafts and len(got_drafts) > len(prompts), label
        assert [(g.output_token_ids, g.counters) for g in got] == [(w.output_token_ids, w.counters) for w in want]
        plain = HFTarget(deep_llama() if label.startswith("eagle3") else build("llama"))
        truth = [Decoder(plain, None, GenerationConfig(max_new_tokens=MAX_NEW)).generate(p).output_token_ids
                 for p in prompts]
        assert [g.output_token_ids for g in got] == truth, label
        assert graphs.captures == prepared, label  # nothing captured while decoding
        replays = {key: n - before[key] for key, n in graphs.replays.items()}
        assert replays[(DRAFT, None)] == len(got_drafts), label  # one replay per propose drafts every depth
        catch_ups = sum(n for (kind, _), n in replays.items() if kind == CATCH_UP)
        assert catch_ups == sum(not begun for begun, _ in got_drafts) > 0, label  # a request's first runs eagerly


# --- CUDA: the real capture --------------------------------------------------------------------------------


@pytest.mark.large_gpu(min_gb=1)
@pytest.mark.parametrize("compile", [False, True, "draft"])
@pytest.mark.parametrize("label", sorted(CASES))
def test_cuda_captured_drafting_decodes_and_drafts_as_eagerly(label, compile, monkeypatch):
    """On a GPU: the EAGLE proposers beside a StaticTarget replaying CUDA graphs (fp32, tiny random Llama) capture
    their own forwards as CUDA graphs, and decode, draft (under ragged acceptance) and count as the eager proposer;
    with compiled stages, and ("draft") with the whole draft and catch-up steps compiled too (COMPILE_DRAFT)."""
    monkeypatch.setattr(captured_module, "COMPILE_DRAFT", compile == "draft")
    target = build_target(label, "cuda", compile=bool(compile))
    assert target.cuda_graphs
    auto = build_proposer(label, target)
    assert auto.captured.enabled and auto.describe()["draft_graphs"] is True  # beside a capturing target: on
    assert (auto.captured.draft_step != auto.captured._grow) == (compile == "draft")
    graphed = assert_same_decoding(target, label, lambda: None)
    graphs = graphed.captured.graphs
    assert graphs.captured and all(n == 1 for n in graphs.captures.values()) and graphs.capture_seconds > 0
