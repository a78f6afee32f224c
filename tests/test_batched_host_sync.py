"""The decode loop's host work per step: greedy verification of all B slots runs as one batched device op and the host
reads the step's outcome exactly once, whatever B (no per-slot `.item()`/`.tolist()`/`bool()` on tensors, no per-slot
verification), and the results stay those of the eager reference at B = 1, 4, 7 with ragged prompts and EOS at
different steps (plain, Medusa chain and tree), sampled slots included; the batch-wide device history hands a
per-slot proposer the tokens, hidden state and features it sees alone on the eager reference."""

from __future__ import annotations

import pytest
import torch

from specbench.engine import decode as decode_module
from specbench.engine.device_verification import verify_batch_greedy
from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.draft import Draft
from specbench.engine.hf_target import HFTarget
from specbench.engine.sampling import SamplingParams
from specbench.engine.proposer import PerSlotProposer
from specbench.engine.static_target import StaticTarget
from specbench.engine.proposer import for_batch
from specbench.proposers.ngram import NgramProposer
from test_batched_engine import (SMALL_TREE, assert_each_request_as_alone, decode_alone, eos_mid_run, random_heads,
                                 tiny_llama_model, tiny_proposers)
from _host_reads import HostReads
from test_batched_graphs import FakeCapture
from _prompts import random_prompt, repetitive_prompt

LABELS = ["plain", "medusa-chain", "medusa-tree"]


@pytest.fixture(scope="module")
def tiny():
    prompts = [repetitive_prompt(0), random_prompt(5, 1), repetitive_prompt(2), random_prompt(21, 3), random_prompt(2, 4),
               random_prompt(9, 5), random_prompt(1, 6), random_prompt(14, 7)]  # ragged, one of a single token
    return StaticTarget.from_hf_model(tiny_llama_model()), random_heads(), prompts


@pytest.fixture(scope="module")
def eager():
    return HFTarget(tiny_llama_model())  # the eager reference over the same weights


def counted_run(static, proposer_for, prompts, config, batch_size, monkeypatch, ahead=True):
    """A run at ``batch_size`` recording, per step, the host reads and the step readbacks; per-slot verification (the
    host rule and the sampled one) refused; greedy steps queued ahead unless ``ahead`` is False."""
    def refuse(*args, **kwargs):
        raise AssertionError("greedy verification ran per slot")

    for per_slot in ("verify", "verify_sampled"):
        monkeypatch.setattr(decode_module, per_slot, refuse)
    readbacks = []
    original_read = decode_module.read_step
    monkeypatch.setattr(decode_module, "read_step",
                        lambda verdict, depths=None: readbacks.append(1) or original_read(verdict, depths))
    target = static.with_batch_size(batch_size)
    decoder = Decoder(target, for_batch(proposer_for(static), batch_size), config)
    decoder.queue_ahead = ahead  # as on a GPU (on the CPU, whose ops run as they are called, steps read one by one)
    decoder.generate_all(prompts[:1])  # warm-up: a static tree's depths are read once per run of the decoder
    steps = []
    step = decoder._step

    def counted(slots, active):
        before = len(readbacks)
        with HostReads() as reads:
            step(slots, active)
        steps.append((reads.count, len(readbacks) - before))

    decoder._step = counted
    return decoder.generate_all(prompts), decoder, steps


@pytest.mark.parametrize("label", LABELS)
def test_each_greedy_step_reads_the_device_once_whatever_the_batch_size(tiny, eager, label, monkeypatch):
    static, heads, prompts = tiny
    proposer_for = tiny_proposers(heads)[label]
    eos = eos_mid_run(eager, prompts, 16)
    config = GenerationConfig(max_new_tokens=16, eos_token_ids=(eos,))
    alone = decode_alone(eager, proposer_for, prompts, config)
    assert {r.finish_reason for r in alone} == {"eos", "length"}  # EOS ends requests at different steps
    for batch_size in (1, 4, 7):
        batched, decoder, steps = counted_run(static, proposer_for, prompts, config, batch_size, monkeypatch)
        assert_each_request_as_alone(batched, alone)
        # queued ahead (plain, Medusa), each step reads the one queued before it: nothing before the first
        assert steps[0] == (0, 1) and set(steps[1:]) == {(1, 1)}, (batch_size, steps)
        # every queued step is read but the last; one queued after a request's end counts no step
        assert len(steps) - 1 - len(prompts) <= decoder.stats.num_steps <= len(steps) - 1
        assert max(decoder.stats.active_per_step) == min(batch_size, len(prompts))


@pytest.mark.parametrize("ahead", [True, False])
@pytest.mark.parametrize("label", LABELS)
def test_steps_queued_ahead_or_not_decode_as_alone(tiny, eager, label, ahead):
    """Greedy steps queued one ahead of the host's reads (plain, and Medusa, which drafts from the device history's
    hidden state alone), or read each before the next: requests ending by EOS or max_new_tokens end where they do
    alone with the same counters, at every B, the steps queued after a request's end count no token, and the host's
    lengths, advanced by upper bounds while a step was in flight, are settled to the device's."""
    static, heads, prompts = tiny
    proposer_for = tiny_proposers(heads)[label]
    eos = eos_mid_run(eager, prompts, 16)
    config = GenerationConfig(max_new_tokens=16, eos_token_ids=(eos,))
    alone = decode_alone(eager, proposer_for, prompts, config)
    for batch_size, backend in ((1, None), (4, None), (4, FakeCapture())):  # last: steps replayed as graphs
        target = static.with_batch_size(batch_size, cuda_graphs=backend is not None, graph_backend=backend)
        decoder = Decoder(target, for_batch(proposer_for(static), batch_size), config)
        decoder.queue_ahead = ahead
        settled = []
        settle = target.settle
        target.settle = lambda surplus: settle(surplus) or settled.append(
            {b: (target._cache.host_lengths[b], int(target._cache.lengths[b])) for b in surplus})
        assert_each_request_as_alone(decoder.generate_all(prompts), alone)
        assert decoder._ahead == ahead and bool(settled) == ahead
        # settled while the next step is in flight: the host counts that step's nodes, the device the ones it kept
        # (at least its root), so the host is ahead by at most the step's width - 1 (plain: exact)
        width = {"plain": 1, "medusa-chain": 4, "medusa-tree": len(SMALL_TREE) + 1}[label]
        for lengths in settled:
            assert all(host - (width - 1) <= device <= host for host, device in lengths.values()), lengths
        assert decoder.stats.step_tokens == sum(len(r.output_token_ids) - 1 for r in alone)
        if batch_size == 1:  # one step per target forward of a request alone, whichever way
            assert decoder.stats.num_steps == sum(r.counters.num_target_forwards for r in alone)
        assert (sum(target.graphs.replays.values()) > decoder.stats.num_steps) == (backend is not None)


def test_where_two_steps_drafts_do_not_fit_the_steps_are_read_one_by_one(tiny, eager):
    """A run whose longest request fits the context with one step's draft but not with two reads each step before
    queueing the next (no context error that only a GPU would raise), and decodes as alone; one more token of
    context and it queues ahead again."""
    static, heads, prompts = tiny
    proposer_for = tiny_proposers(heads)["medusa-chain"]  # K = 3
    config = GenerationConfig(max_new_tokens=8, ignore_eos=True)
    alone = decode_alone(eager, proposer_for, prompts[:4], config)
    needed = max(p.numel() for p in prompts[:4]) + 8 + 3  # prompt + max_new_tokens + one step's draft
    for max_context, ahead in ((needed, False), (needed + 2, False), (needed + 3, True)):
        target = StaticTarget(static.module, static.config, 2, max_context=max_context)
        decoder = Decoder(target, for_batch(proposer_for(static), 2), config)
        decoder.queue_ahead = True
        assert_each_request_as_alone(decoder.generate_all(prompts[:4]), alone)
        assert decoder._ahead == ahead, max_context
        assert target.cache_capacity == needed + 3 * ahead  # the second step's draft room only when queued ahead


def test_the_counter_sees_per_slot_reads(tiny, monkeypatch):
    """The check above would catch per-slot syncs: verifying each slot on its own and reading its verdict back (the
    loop's former way) makes one host read per active slot per step, beside the read of the counts and the step's."""
    static, heads, prompts = tiny
    config = GenerationConfig(max_new_tokens=6, ignore_eos=True)

    def per_slot(ids, logits, ancestors, counts, chain):
        for b, n in enumerate(counts.tolist()):
            if n:
                one = slice(b, b + 1)
                verify_batch_greedy(ids[one], logits[one], ancestors[one], counts[one], chain=chain).emitted.tolist()
        return verify_batch_greedy(ids, logits, ancestors, counts, chain=chain)

    monkeypatch.setattr(decode_module, "verify_batch", per_slot)
    _, decoder, steps = counted_run(static, tiny_proposers(heads)["medusa-chain"], prompts[:4], config, 4, monkeypatch,
                                    ahead=False)  # each step's reads are its own
    assert [reads for reads, _ in steps] == [2 + active for active in decoder.stats.active_per_step]


@pytest.mark.parametrize("label", ["medusa-chain", "medusa-tree"])
def test_sampled_slots_still_decode_as_alone(tiny, eager, label):
    """Sampling stays per slot (each request its own generator): tokens equal the eager reference's per seed."""
    static, heads, prompts = tiny
    proposer_for = tiny_proposers(heads)[label]
    config = GenerationConfig(max_new_tokens=10, ignore_eos=True, sampling=SamplingParams(temperature=0.8))
    seeds = list(range(10, 10 + len(prompts)))
    alone = [Decoder(eager, proposer_for(eager), config).generate(p, seed=s) for p, s in zip(prompts, seeds)]
    for batch_size in (1, 4):
        target = static.with_batch_size(batch_size)
        batched = Decoder(target, for_batch(proposer_for(static), batch_size), config).generate_all(prompts, seeds)
        assert_each_request_as_alone(batched, alone)


class RecordingNgram(NgramProposer):
    """An n-gram proposer that also reads the target's features (as EAGLE does) and records every state it sees."""

    needs_hidden_states = True

    def __init__(self):
        super().__init__(num_speculative_tokens=3)
        self.seen = []

    def propose(self, state):
        self.seen.append((state.token_ids.clone(), state.hidden_state.clone(), state.hidden_states.clone()))
        return super().propose(state)


def test_the_batched_history_hands_each_slot_the_states_it_sees_alone(tiny, eager):
    """The device history appended for all slots at once (tokens, last hidden state, features) gives a per-slot
    proposer, step for step, the history, hidden state and features it sees alone on the eager reference."""
    static, _, prompts = tiny
    config = GenerationConfig(max_new_tokens=12, ignore_eos=True)
    alone = []
    for prompt in prompts[:4]:
        proposer = RecordingNgram()
        Decoder(eager, proposer, config).generate(prompt)
        alone.append(proposer.seen)
    per_slot = [RecordingNgram(), RecordingNgram()]
    Decoder(static.with_batch_size(2), PerSlotProposer(per_slot), config).generate_all(prompts[:4])
    runs = []  # each slot's states split into its requests: a request's history extends the previous state's
    for proposer in per_slot:
        for state in proposer.seen:
            last = runs[-1][-1][0] if runs else None
            if last is None or len(state[0]) <= len(last) or not torch.equal(state[0][: len(last)], last):
                runs.append([])
            runs[-1].append(state)
    assert len(runs) == 4
    for want in alone:
        got = next(run for run in runs if torch.equal(run[0][0], want[0][0]))
        assert len(got) == len(want) > 3
        for (tokens, hidden, features), (t, h, f) in zip(want, got):
            assert torch.equal(tokens, t)
            torch.testing.assert_close(hidden, h, atol=1e-5, rtol=1e-5)  # other engines' sums: another order only
            torch.testing.assert_close(features, f, atol=1e-5, rtol=1e-5)


class RawShapeNgram(NgramProposer):
    """n-gram drafts handed over as bare (tokens, parents), their depth unknown on the host, as a third-party
    proposer may build them: ragged chain lengths per slot, depths learnt from the step's readback."""

    def propose(self, state):
        draft = super().propose(state)
        if draft is None or not len(draft):
            return draft
        keep = 1 + state.token_ids.numel() % len(draft)  # 1..K tokens: slots of one step draft ragged chains
        return Draft(tokens=draft.tokens[:keep], parents=draft.parents[:keep].clone())


def test_drafts_of_unknown_depth_count_as_alone_whatever_their_length(tiny, eager):
    static, _, prompts = tiny
    config = GenerationConfig(max_new_tokens=16, ignore_eos=True)
    alone = decode_alone(eager, lambda target: RawShapeNgram(num_speculative_tokens=4), prompts, config)
    target = static.with_batch_size(4)
    proposer = PerSlotProposer.build(lambda: RawShapeNgram(num_speculative_tokens=4), 4)
    batched = Decoder(target, proposer, config).generate_all(prompts)
    assert_each_request_as_alone(batched, alone)  # counters: each step's draft tokens from its own deepest node
    assert sum(r.counters.num_drafts for r in alone) > 0
