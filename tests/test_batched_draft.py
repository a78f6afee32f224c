"""The draft-model proposer of B slots: on the reference model and its draft (fp32, CPU, greedy) every request of a
run at B = 1, 3 and B larger than the queue drafts exactly what the one-slot proposer drafts alone on the eager
reference target and produces the tokens and counters it produces there (mixed prompt lengths, EOS at different
steps, refills); ``for_batch`` builds it; the draft runs K batched forwards per verify step whatever B and the step's
readback stays its one host read; a sampled draft is batched too, each slot sampling what it samples alone."""

from __future__ import annotations

import pytest
import torch

from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.sampling import SamplingParams
from specbench.engine.static_target import StaticTarget
from specbench.engine.proposer import for_batch
from specbench.proposers.draft_model import DraftModelProposer
import test_batched_engine
from test_batched_engine import assert_each_request_as_alone
from _recording import decode_alone_recording
from test_batched_graphs import FakeCapture
from test_batched_host_sync import counted_run

reference = test_batched_engine.reference  # the fixture: the reference target, 4 prompts, its GenerationConfig
reference_eager = test_batched_engine.reference_eager  # the fixture: the eager reference over the same checkpoint

DRAFT = "specbench-ref/gsm8k-tiny-draft"


@pytest.fixture(scope="module")
def draft_model():
    return StaticTarget.from_pretrained(DRAFT, dtype=torch.float32, device="cpu")


def single_proposer(target, draft, k: int, temperature: float = 0.0) -> DraftModelProposer:
    """A one-slot draft-model proposer for ``target`` with its own draft cache over the shared draft weights."""
    return DraftModelProposer.from_options(target, draft=StaticTarget(draft.module, draft.config),
                                           num_speculative_tokens=k, temperature=temperature)


def draft_forwards(proposer: DraftModelProposer) -> int:
    """Batched verify forwards the draft target has run (prefills not counted)."""
    return sum(sum(widths.values()) for widths in proposer.draft.verify_widths.values())


def decode_batched_recording(static, draft, prompts, config, k: int, batch_size: int, temperature: float = 0.0,
                             ahead: bool = False, graphs: bool = False):
    """The prompts through Decoder with ``for_batch``'s form of the draft-model proposer, greedy steps queued ahead
    of their reads if ``ahead`` (as on a GPU), the draft's steps replayed through the CPU stand-in of CUDA graphs if
    ``graphs``; returns (results, decoder, each request's drafts, per propose call (active slots, slots new to the
    draft, draft forwards))."""
    proposer = for_batch(single_proposer(static, draft, k, temperature), batch_size)
    assert isinstance(proposer, DraftModelProposer) and proposer.draft.batch_size == batch_size
    if graphs:
        proposer.draft = draft.with_batch_size(batch_size, cuda_graphs=True, graph_backend=FakeCapture())
    request_of, drafts, calls, new = {}, [[] for _ in prompts], [], set()
    begin, propose = proposer.begin_request, proposer.propose_queued if ahead else proposer.propose

    def begin_request(slot, prompt_ids):
        request_of[slot] = next(i for i, p in enumerate(prompts) if torch.equal(p, prompt_ids.cpu()))
        new.add(slot)
        begin(slot, prompt_ids)

    def propose_recording(states, *lengths):  # queued ahead: (history, lengths)
        before = draft_forwards(proposer)
        out = propose(states, *lengths)
        states = lengths[0] if ahead else states  # the active slots
        calls.append((len(states), len(new & set(states)), draft_forwards(proposer) - before))
        new.difference_update(states)
        for slot, d in out.items():
            drafts[request_of[slot]].append(d.tokens.tolist())
            # greedy: point masses; sampled: (K, V) the distributions the slot's own draws came from
            assert (None if d.draft_probs is None else tuple(d.draft_probs.shape)) == (
                None if temperature == 0 else (k, static.vocab_size))
        return out

    proposer.begin_request = begin_request
    setattr(proposer, "propose_queued" if ahead else "propose", propose_recording)
    decoder = Decoder(static.with_batch_size(batch_size), proposer, config)
    decoder.queue_ahead = ahead
    decoder.prepare(prompts)  # every graph the run replays, captured here
    prepared = dict(proposer.draft.graphs.captures)
    results = decoder.generate_all(prompts)
    assert decoder._ahead == ahead
    assert proposer.draft.graphs.captures == prepared  # none while decoding
    return results, decoder, drafts, calls


@pytest.fixture(scope="module")
def alone_k3(reference, reference_eager, draft_model):
    _, _, prompts, config = reference
    return decode_alone_recording(reference_eager, lambda: single_proposer(reference_eager, draft_model, 3), prompts,
                                  config)


@pytest.mark.parametrize("batch_size", [1, 3, 6])  # 6 > the 4 prompts: idle slots from the start
def test_batched_draft_model_equals_the_eager_reference_run(reference, draft_model, alone_k3, batch_size):
    static, _, prompts, config = reference
    alone, alone_drafts = alone_k3
    assert len({p.numel() for p in prompts}) == len(prompts)  # mixed prompt lengths
    ends = [len(r.output_token_ids) for r in alone if r.finish_reason == "eos"]
    assert {r.finish_reason for r in alone} == {"eos", "length"} and len(set(ends)) == len(ends) > 1  # EOS, many steps
    assert sum(r.counters.num_accepted_tokens for r in alone) > 0
    assert any(r.counters.num_accepted_tokens < r.counters.num_draft_tokens for r in alone)  # rejections: truncations
    batched, decoder, drafts, calls = decode_batched_recording(static, draft_model, prompts, config, 3, batch_size)
    assert drafts == alone_drafts  # every draft of every request, token for token
    assert_each_request_as_alone(batched, alone)
    assert decoder.stats.num_refills == max(0, len(prompts) - batch_size)
    assert len(calls) == decoder.stats.num_steps
    widths = decoder.proposer.draft.verify_widths
    assert set(widths["chain"]) == {2} and widths["chain"][2] > 0  # two-token catch-ups: every draft token accepted
    # K = 3 draft forwards per verify step whatever B (K - 1 when every slot was just prefilled), not B x K
    assert all(forwards == (2 if fresh == active else 3) for active, fresh, forwards in calls), calls
    if batch_size > 1:
        assert max(active for active, _, _ in calls) == min(batch_size, len(prompts))


@pytest.mark.parametrize("k", [1, 5])
def test_other_draft_lengths_equal_the_eager_reference_run(reference, reference_eager, draft_model, k):
    """K = 1 (the catch-up step alone) and a K whose accepted runs reach the two-token catch-up."""
    static, _, prompts, config = reference
    make = lambda: single_proposer(reference_eager, draft_model, k)  # noqa: E731
    alone, alone_drafts = decode_alone_recording(reference_eager, make, prompts[:3], config)
    batched, decoder, drafts, calls = decode_batched_recording(static, draft_model, prompts[:3], config, k, 2)
    assert drafts == alone_drafts
    assert_each_request_as_alone(batched, alone)
    assert decoder.stats.num_refills == 1
    assert all(forwards == (k - 1 if fresh == active else k) for active, fresh, forwards in calls), calls
    assert any(active == 2 for active, _, _ in calls)


@pytest.mark.parametrize("ahead", [False, True])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_each_step_reads_the_device_once_with_the_batched_draft(reference, draft_model, alone_k3, batch_size, ahead,
                                                                monkeypatch):
    """Argmaxes on the device, catch-up counts from host-known lengths (queued ahead: from the device history): the
    step's readback is its only host read (queued ahead: each step reads the one queued before it)."""
    static, _, prompts, config = reference
    batched, decoder, steps = counted_run(static, lambda target: single_proposer(target, draft_model, 3), prompts,
                                          config, batch_size, monkeypatch, ahead=ahead)
    assert isinstance(decoder.proposer, DraftModelProposer) and decoder.proposer.draft.batch_size == batch_size
    assert_each_request_as_alone(batched, alone_k3[0])
    if ahead:
        assert steps[0] == (0, 1) and set(steps[1:]) == {(1, 1)}, steps
    else:
        assert len(steps) == decoder.stats.num_steps > 0 and set(steps) == {(1, 1)}, steps


@pytest.mark.parametrize("k", [1, 3, 5])
def test_steps_queued_ahead_catch_up_on_the_device_and_decode_as_alone(reference, reference_eager, draft_model, k,
                                                                       monkeypatch):
    """Queued ahead of the host's reads (as on a GPU), each slot's catch-up is formed on the device from the history
    and the draft's host lengths are upper bounds: every draft of every request, tokens and counters as alone (a step
    queued after a request's end drafts once more for it, dropped), at B = 1 and 3, the draft's steps replayed
    through captured graphs, none captured while decoding."""
    static, _, prompts, config = reference
    make = lambda: single_proposer(reference_eager, draft_model, k)  # noqa: E731
    alone, alone_drafts = decode_alone_recording(reference_eager, make, prompts, config)
    assert any(r.counters.num_accepted_tokens < r.counters.num_draft_tokens for r in alone)  # rejections: truncations
    verify = StaticTarget.verify

    def checked(target, inputs):  # the attention span and the room come from host lengths: never below the device's
        assert all(h >= d for h, d in zip(target._cache.host_lengths, target._cache.lengths.tolist()))
        return verify(target, inputs)

    monkeypatch.setattr(StaticTarget, "verify", checked)
    for batch_size, graphs in ((1, False), (3, False), (3, True)):
        batched, decoder, drafts, _ = decode_batched_recording(static, draft_model, prompts, config, k, batch_size,
                                                               ahead=True, graphs=graphs)
        assert_each_request_as_alone(batched, alone)
        assert all(got[: len(want)] == want and len(got) <= len(want) + 1 for got, want in zip(drafts, alone_drafts))
        captured = decoder.proposer.draft.graphs
        assert captured.enabled == graphs and (sum(captured.replays.values()) > len(prompts)) == graphs


def test_the_draft_steps_replay_captured_graphs_as_eagerly(reference, draft_model, alone_k3):
    """Through the CPU stand-in of a CUDA graph: the draft target captures its two step kinds at every attention span
    once, before the run (prepare_steps), and replays them."""
    static, _, prompts, config = reference
    proposer = for_batch(single_proposer(static, draft_model, 3), 3)
    proposer.draft = draft_model.with_batch_size(3, cuda_graphs=True, graph_backend=FakeCapture())
    decoder = Decoder(static.with_batch_size(3), proposer, config)
    proposer.reserve(max(p.numel() for p in prompts) + config.max_new_tokens + 3)  # what the decoder's reserve asks
    graphs = proposer.draft.graphs
    prepared = dict(graphs.captures)
    assert {key[:2] for key in prepared} == {("plain", 1), ("chain", 2)} and set(prepared.values()) == {1}
    assert_each_request_as_alone(decoder.generate_all(prompts), alone_k3[0])
    assert graphs.captures == prepared  # every key was captured at reserve, none while decoding
    assert sum(graphs.replays.values()) > 2 * len(prepared), graphs.replays  # the steps replayed them


def test_a_draft_whose_context_holds_one_steps_drafts_reads_each_step_first(reference, draft_model, alone_k3):
    """Queued ahead, the draft target holds two steps' drafts too: a draft model whose max context fits one step's
    but not two reads each step before queueing the next (no context error that only a GPU would raise)."""
    static, _, prompts, config = reference
    needed = max(p.numel() for p in prompts) + config.max_new_tokens + 3  # + one step's draft (K = 3)
    for max_context, ahead in ((needed + 2, False), (needed + 3, True)):
        draft = StaticTarget(draft_model.module, draft_model.config, max_context=max_context)
        decoder = Decoder(static, DraftModelProposer.from_options(static, draft=draft, num_speculative_tokens=3), config)
        decoder.queue_ahead = True
        assert_each_request_as_alone(decoder.generate_all(prompts), alone_k3[0])
        assert decoder._ahead == ahead, max_context


def test_for_batch_builds_the_draft_model_of_b_slots_greedy_or_sampled(reference, reference_eager, draft_model):
    static, _, _, _ = reference
    greedy = for_batch(single_proposer(static, draft_model, 3), 2)
    assert isinstance(greedy, DraftModelProposer) and greedy.draft.batch_size == 2
    assert greedy.draft.module is draft_model.module  # the draft's weights are shared, not copied
    described = greedy.describe()
    assert described["name"] == "draft" and described["num_speculative_tokens"] == 3
    assert described["batching"].startswith("batched draft model")
    sampled = for_batch(single_proposer(static, draft_model, 3, temperature=1.0), 2)  # no factory: batched too
    assert isinstance(sampled, DraftModelProposer) and sampled.draft.batch_size == 2
    assert sampled.draft.module is draft_model.module and len(sampled.generators) == 2
    assert sampled.describe()["temperature"] == 1.0 and sampled.describe()["batching"] == "batched draft model"
    eager = DraftModelProposer.from_options(reference_eager, draft=reference_eager, num_speculative_tokens=3)
    assert for_batch(eager, 1) is eager  # one slot: the proposer itself
    with pytest.raises(ValueError, match=r"eager engine \(HFTarget, one slot\), so it cannot draft for 2 slots; "
                                         r"set engine = \"static\""):
        for_batch(eager, 2)


@pytest.mark.parametrize("batch_size", [2, 3])
def test_sampled_drafts_at_b_slots_are_each_slots_own_draws_alone(reference, draft_model, batch_size):
    """Draft and target both sample at temperature 1: each slot draws with its own generator, seeded per request as
    the one-slot proposer seeds it, so every request's drafts, tokens and counters at B slots are those it gets alone."""
    static, _, prompts, config = reference
    sampled = GenerationConfig(max_new_tokens=config.max_new_tokens, eos_token_ids=config.eos_token_ids, seed=3,
                               sampling=SamplingParams(temperature=1.0))
    make = lambda: single_proposer(static, draft_model, 3, temperature=1.0)  # noqa: E731
    alone, alone_drafts = decode_alone_recording(static, make, prompts, sampled)
    accepted = sum(r.counters.num_accepted_tokens for r in alone)
    assert 0 < accepted < sum(r.counters.num_draft_tokens for r in alone)  # acceptances and rejections
    batched, _, drafts, _ = decode_batched_recording(static, draft_model, prompts, sampled, 3, batch_size, temperature=1.0)
    assert drafts == alone_drafts
    assert_each_request_as_alone(batched, alone)


def test_truncate_refuses_lengths_beyond_the_committed_cache(draft_model):
    target = draft_model.with_batch_size(2)
    target.reserve(32, 1)
    target.prefill(0, torch.arange(3, 9))
    target.truncate({0: 4})
    assert target._cache.host_lengths == [4, 0] and target._cache.lengths.tolist() == [4, 0]
    with pytest.raises(ValueError, match=r"truncate slot 0 to 5: .* \(holds 4\)"):
        target.truncate({0: 5})
