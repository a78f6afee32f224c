"""The EAGLE proposer over B slots: on a tiny random Llama with random EAGLE-1/2 and EAGLE-3 heads (fp32, CPU, greedy),
every request of a run at B = 1, 3 and B larger than the queue drafts exactly what the proposer drafts for one slot
alone on the eager reference target and produces the tokens and counters it produces there, for the chain, the
static and the dynamic tree (mixed prompt lengths, EOS at different steps, refills); ``for_batch`` builds it; the head
runs 1 + (depth - 1) forwards per propose call whatever B and propose reads nothing back; the same on the reference
target's shipped heads."""

from __future__ import annotations

import pytest
import torch

from specbench.eagle.captured import CATCH_UP
from specbench.eagle.draft_head import BatchedDraftKVCache, DraftKVCache
from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.hf_target import HFTarget
from specbench.engine.static_target import StaticTarget
from specbench.engine.proposer import for_batch
from specbench.proposers.eagle import EagleProposer
from specbench.proposers.eagle3 import Eagle3Proposer
from _prompts import random_prompt, repetitive_prompt
from _recording import decode_alone_recording
from test_batched_engine import assert_each_request_as_alone, eos_mid_run, reference_eager  # noqa: F401 (a fixture)
from test_batched_host_sync import counted_run
from _host_reads import HostReads
from test_eagle import SMALL_TREE, random_head
from test_batched_graphs import FakeCapture as TargetCapture
from test_eagle_graphs import FakeCapture
from test_eagle3 import deep_llama, random_head3
from test_static_target import build

MAX_NEW = 20
MODES = {"chain": dict(num_speculative_tokens=3), "static-tree": dict(tree=SMALL_TREE),
         "dynamic-tree": dict(top_k=3, depth=4, total_tokens=12)}
HEADS = ("eagle", "eagle3")


@pytest.fixture(scope="module")
def tiny():
    """Per head kind: (its static target, the eager reference over the same model, a factory of proposers over one
    shared head for a target (of its batch size) and options), prompts."""
    prompts = [repetitive_prompt(0), random_prompt(5, 1), random_prompt(21, 3), random_prompt(9, 4), random_prompt(2, 5)]
    eagle_model, eagle3_model = build("llama"), deep_llama()
    head, head3 = random_head(with_embed=False), random_head3(draft_vocab=96)  # the target's embedding; a small draft vocab
    makers = {
        "eagle": (StaticTarget.from_hf_model(eagle_model), HFTarget(eagle_model),
                  lambda target, options: EagleProposer.from_options(target, head=head, **options)),
        "eagle3": (StaticTarget.from_hf_model(eagle3_model), HFTarget(eagle3_model),
                   lambda target, options: Eagle3Proposer.from_options(target, head=head3, **options)),
    }
    return makers, prompts


def decode_batched_recording(static, make, prompts, config, batch_size: int):
    """The prompts through Decoder with ``for_batch``'s form of the proposer; (results, decoder, each
    request's drafts, per propose call (active slots, head forwards))."""
    proposer = for_batch(make(), batch_size)
    assert isinstance(proposer, EagleProposer) and proposer.batch_size == batch_size
    target = static.with_batch_size(batch_size)  # EAGLE-3's aux layers carried over from the one the head asked
    request_of, drafts, calls, forwards = {}, [[] for _ in prompts], [], []
    begin, propose, step = proposer.begin_request, proposer.propose, proposer.head.step_batched

    def begin_request(slot, prompt_ids):
        request_of[slot] = next(i for i, p in enumerate(prompts) if torch.equal(p, prompt_ids.cpu()))
        begin(slot, prompt_ids)

    def propose_recording(states):
        before = len(forwards)
        out = propose(states)
        calls.append((len(states), len(forwards) - before))
        for slot, d in out.items():
            drafts[request_of[slot]].append(d.tokens.tolist())
        return out

    def step_counted(*args):
        forwards.append(args[3].shape)  # (B, W) slots: always all B rows
        return step(*args)

    proposer.begin_request, proposer.propose = begin_request, propose_recording
    proposer.head.step_batched = step_counted
    try:
        decoder = Decoder(target, proposer, config)
        results = decoder.generate_all(prompts)
    finally:
        del proposer.head.step_batched  # the shared head's own method again
    assert {shape[0] for shape in forwards} == {batch_size}
    return results, decoder, drafts, calls


def expected_forwards(proposer: EagleProposer) -> int:
    """One catch-up, then one forward per expansion depth: K - 1 for the chain, the tree's depth - 1 levels."""
    if proposer.mode == "dynamic":
        return proposer.depth
    return 1 + (proposer.num_nodes - 1 if proposer.mode == "chain" else len(proposer.plan.levels))


@pytest.mark.parametrize("kind", HEADS)
@pytest.mark.parametrize("mode", sorted(MODES))
def test_batched_eagle_equals_the_eager_reference_run(tiny, kind, mode):
    makers, prompts = tiny
    static, eager, make_with = makers[kind]
    make = lambda: make_with(static, MODES[mode])  # noqa: E731
    eos = eos_mid_run(eager, prompts, MAX_NEW)
    config = GenerationConfig(max_new_tokens=MAX_NEW, eos_token_ids=(eos,))
    alone, alone_drafts = decode_alone_recording(eager, lambda: make_with(eager, MODES[mode]), prompts, config)
    assert len({p.numel() for p in prompts}) == len(prompts)  # mixed prompt lengths
    assert {r.finish_reason for r in alone} == {"eos", "length"}
    assert sum(r.counters.num_drafts for r in alone) > 0  # random heads: rejected (the reference heads get accepted)
    per_call = None
    for batch_size in (1, 3, 7):  # 7 > the 5 prompts: idle slots from the start
        batched, decoder, drafts, calls = decode_batched_recording(static, make, prompts, config, batch_size)
        assert drafts == alone_drafts, batch_size  # every draft of every request, token for token
        assert_each_request_as_alone(batched, alone)
        assert decoder.stats.num_refills == max(0, len(prompts) - batch_size)
        assert len(calls) == decoder.stats.num_steps
        per_call = expected_forwards(decoder.proposer)
        assert {forwards for _, forwards in calls} == {per_call}, calls  # whatever B and the active slots
        if batch_size > 1:
            assert max(active for active, _ in calls) == min(batch_size, len(prompts))
    assert per_call == (4 if mode == "dynamic-tree" else 3)  # K = 3, SMALL_TREE of depth 3: 1 + 2; depth 4: 1 + 3


@pytest.mark.parametrize("kind", HEADS)
def test_for_batch_builds_the_batch_size_in_every_mode(tiny, kind):
    makers, _ = tiny
    static, _, make_with = makers[kind]
    for mode, options in MODES.items():
        single = make_with(static, options)
        batched = for_batch(single, 4)
        assert isinstance(batched, type(single)) and batched.batch_size == 4, mode
        assert batched.head is single.head and batched.cache.kv.shape[1] == 4  # the head shared, its own cache
        described = batched.describe()
        assert described["name"] == kind and described["batching"].startswith("batched head")
        assert batched.max_draft_tokens == single.max_draft_tokens
    assert for_batch(None, 2) is None


@pytest.mark.parametrize("mode", sorted(MODES))
def test_propose_reads_nothing_back_and_a_step_once(tiny, mode, monkeypatch):
    """Argmax / top-k on the device, catch-up starts and counts from host-known lengths: no host read in propose;
    every step reads the device once, a dynamic tree's depths riding on the step's readback."""
    makers, prompts = tiny
    static, eager, make_with = makers["eagle"]
    config = GenerationConfig(max_new_tokens=12, ignore_eos=True)
    alone, _ = decode_alone_recording(eager, lambda: make_with(eager, MODES[mode]), prompts, config)
    propose, in_propose = EagleProposer.propose, []

    def counted_propose(self, states):
        with HostReads(where=True) as reads:
            out = propose(self, states)
        in_propose.append(reads.reads)
        return out

    monkeypatch.setattr(EagleProposer, "propose", counted_propose)
    batched, decoder, steps = counted_run(static, lambda target: make_with(target, MODES[mode]), prompts, config, 3,
                                          monkeypatch, ahead=False)  # queued ahead: the test below
    assert isinstance(decoder.proposer, EagleProposer) and decoder.proposer.batch_size == 3
    assert_each_request_as_alone(batched, alone)
    assert len(in_propose) >= len(steps) == decoder.stats.num_steps > 0
    assert not any(in_propose), [r for r in in_propose if r][:1]
    assert set(steps) == {(1, 1)}, steps


def decode_queued(static, make, prompts, config, batch_size: int, graphs: bool):
    """The prompts with every greedy step queued one ahead of the host's reads (as on a GPU), the target's steps and
    (``graphs``) the draft's replayed through the CPU stand-ins; (results, decoder, each request's drafts, per
    propose: did it begin a request?)."""
    target = static.with_batch_size(batch_size, cuda_graphs=graphs, graph_backend=TargetCapture() if graphs else None)
    proposer = for_batch(make(target, FakeCapture() if graphs else None), batch_size)
    request_of, drafts, begun, proposes = {}, [[] for _ in prompts], [], []
    begin, propose = proposer.begin_request, proposer.propose_queued

    def begin_request(slot, prompt_ids):
        request_of[slot] = next(i for i, p in enumerate(prompts) if torch.equal(p, prompt_ids.cpu()))
        begun.append(slot)
        begin(slot, prompt_ids)

    def propose_queued(history, lengths):
        proposes.append(bool(begun))
        begun.clear()
        out = propose(history, lengths)
        for slot, draft in out.items():
            drafts[request_of[slot]].append(draft.tokens.tolist())
        return out

    proposer.begin_request, proposer.propose_queued = begin_request, propose_queued
    decoder = Decoder(target, proposer, config)
    decoder.queue_ahead = True
    results = decoder.generate_all(prompts)
    assert decoder._ahead and proposer.captured.enabled == graphs
    return results, decoder, drafts, proposes


def assert_drafts_as_alone(drafts, alone_drafts) -> None:
    """Every draft of every request as alone, token for token; queued ahead, a step queued after a request's end
    drafts once more for it (dropped)."""
    assert len(drafts) == len(alone_drafts)
    for got, want in zip(drafts, alone_drafts):
        assert got[: len(want)] == want and len(got) <= len(want) + 1


@pytest.mark.parametrize("kind", HEADS)
@pytest.mark.parametrize("mode", sorted(MODES))
def test_steps_queued_ahead_catch_up_on_the_device_and_decode_as_alone(tiny, kind, mode, monkeypatch):
    """Queued ahead, each slot's catch-up is formed on the device from the history (the host's lengths lag a step):
    drafts, tokens and counters as alone at B = 1 and 3, each step reading the one before it once; with graphs, every
    propose that begins no request replays the one catch-up graph of the deepest path + 1 and captures nothing."""
    makers, prompts = tiny
    static, eager, make_with = makers[kind]
    eos = eos_mid_run(eager, prompts, MAX_NEW)
    config = GenerationConfig(max_new_tokens=MAX_NEW, eos_token_ids=(eos,))
    alone, alone_drafts = decode_alone_recording(eager, lambda: make_with(eager, MODES[mode]), prompts, config)
    make = lambda target, backend=None: make_with(target, {**MODES[mode], "graph_backend": backend})  # noqa: E731
    make(static)  # an EAGLE-3 head asks for its features before the batched targets copy static's aux layers
    batched, decoder, steps = counted_run(static, make, prompts, config, 3, monkeypatch)
    assert_each_request_as_alone(batched, alone)
    assert steps[0] == (0, 1) and set(steps[1:]) == {(1, 1)}, steps
    for batch_size, graphs in ((1, False), (3, True)):
        batched, decoder, drafts, proposes = decode_queued(static, make, prompts, config, batch_size, graphs)
        assert_each_request_as_alone(batched, alone)
        assert_drafts_as_alone(drafts, alone_drafts)
    captured = decoder.proposer.captured.graphs
    replays = {w: n - 1 for (k, w), n in captured.replays.items() if k == CATCH_UP and n > 1}  # less reserve's
    assert replays == {decoder.proposer.max_depth + 1: proposes.count(False)} and proposes.count(True) > 1
    assert set(captured.captures.values()) == {1}  # each captured once, by reserve


def test_a_dynamic_tree_of_unknown_chain_shape_queues_ahead_reading_once_per_step(tiny, monkeypatch):
    """total_tokens <= depth with top_k > 1: whether a draft is one path only the device knows, so queued ahead (greedy)
    it verifies as a tree, and a step still reads the device once."""
    makers, prompts = tiny
    static, eager, make_with = makers["eagle"]
    options = dict(top_k=2, depth=4, total_tokens=3)
    config = GenerationConfig(max_new_tokens=12, ignore_eos=True)
    alone, _ = decode_alone_recording(eager, lambda: make_with(eager, options), prompts, config)
    batched, decoder, steps = counted_run(static, lambda target: make_with(target, options), prompts, config, 3,
                                          monkeypatch)
    assert_each_request_as_alone(batched, alone)
    assert steps[0] == (0, 1) and set(steps[1:]) == {(1, 1)}, steps


def test_features_of_the_wrong_width_are_refused_naming_set_aux_layers(tiny):
    """An EAGLE-3 head on a batched target without the aux layers would read H-wide hidden states."""
    makers, prompts = tiny
    static, _, make_with = makers["eagle3"]
    proposer = for_batch(make_with(static, MODES["chain"]), 2)
    batched = static.with_batch_size(2)
    assert batched.aux_layers == static.aux_layers != ()  # carried over from the static target the head set them on
    batched.set_aux_layers(())
    decoder = Decoder(batched, proposer, GenerationConfig(max_new_tokens=4))
    with pytest.raises(ValueError, match=r"reads 192-wide features, slot 0 has 64 .*set_aux_layers"):
        decoder.generate_all(prompts[:2])


# --- the reference target and its shipped heads ----------------------------------------------------------


REFERENCE = {  # as specbench/cases/eagle.toml's heads, with the static tree of eagle1-tree-63 for both kinds
    "eagle-chain-k3": (EagleProposer, "specbench-ref/gsm8k-tiny-eagle", dict(num_speculative_tokens=3)),
    "eagle-tree-63": (EagleProposer, "specbench-ref/gsm8k-tiny-eagle", dict(tree="gsm8k-tiny-63")),
    "eagle3-chain-k3": (Eagle3Proposer, "specbench-ref/gsm8k-tiny-eagle3", dict(num_speculative_tokens=3)),
    "eagle3-tree-63": (Eagle3Proposer, "specbench-ref/gsm8k-tiny-eagle3", dict(tree="gsm8k-tiny-63")),
    "eagle2-dynamic": (EagleProposer, "specbench-ref/gsm8k-tiny-eagle", dict(top_k=8, depth=6, total_tokens=60)),
    "eagle3-dynamic": (Eagle3Proposer, "specbench-ref/gsm8k-tiny-eagle3", dict(top_k=8, depth=6, total_tokens=60)),
}


@pytest.fixture(scope="module")
def reference():
    from transformers import AutoTokenizer

    from specbench.checkpoints.resolve import resolve_model_dir
    from specbench.prompts import load_prompts

    static = StaticTarget.from_pretrained("specbench-ref/gsm8k-tiny", dtype=torch.float32, device="cpu")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir("specbench-ref/gsm8k-tiny"))
    prompts = [torch.tensor(p.token_ids) for p in load_prompts("gsm8k-embedded", num_prompts=4, tokenizer=tokenizer)]
    return static, prompts, GenerationConfig(max_new_tokens=48, eos_token_ids=(tokenizer.eos_token_id,))


@pytest.mark.parametrize("label", sorted(REFERENCE))
def test_reference_heads_batched_equal_the_eager_reference_run(reference, reference_eager, label):
    """The shipped heads get whole runs accepted, so the ragged catch-up adds several positions per slot."""
    static, prompts, config = reference
    cls, path, options = REFERENCE[label]
    for target in (static, reference_eager):  # an EAGLE-3 head asked them for its features; EAGLE-1 reads none
        target.set_aux_layers(())
    head = cls.from_options(static, path=path, **options).head
    make = lambda target=static: cls.from_options(target, head=head, **options)  # noqa: E731
    alone, alone_drafts = decode_alone_recording(reference_eager, lambda: make(reference_eager), prompts, config)
    assert {r.finish_reason for r in alone} == {"eos", "length"}  # EOS at different steps, one runs to the length
    assert sum(r.counters.num_accepted_tokens for r in alone) > 0
    assert any(r.counters.num_accepted_tokens < r.counters.num_draft_tokens for r in alone)  # rejections too
    for batch_size in (1, 3, 6):  # 6 > the 4 prompts
        batched, decoder, drafts, calls = decode_batched_recording(static, make, prompts, config, batch_size)
        assert drafts == alone_drafts, batch_size
        assert_each_request_as_alone(batched, alone)
        assert {forwards for _, forwards in calls} == {expected_forwards(decoder.proposer)}
    # the same three slots drafting through captured steps (the CPU stand-in for CUDA graphs), ragged catch-ups
    # padded to the widest slot: each (kind, width) captured once, by reserve, and replayed
    graphed = lambda: cls.from_options(static, head=head, cuda_graphs=True, graph_backend=FakeCapture(), **options)  # noqa: E731
    batched, decoder, drafts, calls = decode_batched_recording(static, graphed, prompts, config, 3)
    assert drafts == alone_drafts
    assert_each_request_as_alone(batched, alone)
    graphs = decoder.proposer.captured.graphs
    assert graphs.enabled and set(graphs.captures.values()) == {1}
    widths = set(range(1, decoder.proposer.max_depth + 2))  # accepted + 1: every catch-up a step can bring
    assert {width for kind, width in graphs.captures if kind == CATCH_UP} == widths
    assert sum(n for (kind, _), n in graphs.replays.items() if kind == CATCH_UP) > len(widths)  # replayed in decoding
    # queued ahead of the host's reads (as on a GPU): catch-ups of whole accepted runs formed on the device
    queued = lambda target, backend: cls.from_options(target, head=head, graph_backend=backend, **options)  # noqa: E731
    for graphs in (False, True):
        batched, _, drafts, _ = decode_queued(static, queued, prompts, config, 3, graphs)
        assert_each_request_as_alone(batched, alone)
        assert_drafts_as_alone(drafts, alone_drafts)


def test_a_growing_draft_cache_keeps_the_expansion_entries_past_the_committed_lengths():
    """A tree expansion writes its nodes past each slot's committed length and the next depth reads them: growing
    the cache mid-expansion must keep them (both the one-slot and the B-slot cache)."""
    batched = BatchedDraftKVCache(2, 1, 4, dtype=torch.float32, device="cpu", capacity=6)
    batched.kv.copy_(torch.arange(batched.kv.numel(), dtype=torch.float32).view_as(batched.kv))
    batched.lengths = [2, 0]
    before = batched.kv.clone()
    batched.reserve(9)
    assert batched.capacity == 12 and torch.equal(batched.kv[:, :, :, :6], before)
    single = DraftKVCache(1, 4, dtype=torch.float32, device="cpu", capacity=6)
    single.kv.copy_(torch.arange(single.kv.numel(), dtype=torch.float32).view_as(single.kv))
    before, single.length = single.kv.clone(), 1
    single.reserve(7)
    assert single.capacity == 12 and torch.equal(single.kv[:, :, :6], before)
