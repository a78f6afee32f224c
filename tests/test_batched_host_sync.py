"""The batched loop's host work per step: greedy verification of all B slots runs as one batched device op and the host
reads the step's outcome exactly once, whatever B (no per-slot `.item()`/`.tolist()`/`bool()` on tensors, no per-slot
verification), and the results stay those of the single-sequence engine at B = 1, 4, 7 with ragged prompts and EOS
at different steps (plain, Medusa chain and tree), sampled slots included; the batch-wide device history hands a
per-slot proposer the tokens, hidden state and features it sees alone."""

from __future__ import annotations

import pytest
import torch

from specbench.engine import batched_decode
from specbench.engine.batched_decode import BatchedDecoder
from specbench.engine.batched_proposers import PerSlotProposer
from specbench.engine.batched_target import BatchedStaticTarget
from specbench.engine.batched_verification import verify_batch_greedy
from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.device_verification import greedy_on_device
from specbench.engine.draft import Draft
from specbench.engine.sampling import SamplingParams
from specbench.engine.static_target import StaticTarget
from specbench.proposers.batched import for_batch
from specbench.proposers.ngram import NgramProposer
from test_batched_engine import (assert_each_request_as_alone, decode_alone, eos_mid_run, random_heads,
                                 tiny_llama_model, tiny_proposers)
from _host_reads import HostReads
from _prompts import random_prompt, repetitive_prompt

LABELS = ["plain", "medusa-chain", "medusa-tree"]


@pytest.fixture(scope="module")
def tiny():
    prompts = [repetitive_prompt(0), random_prompt(5, 1), repetitive_prompt(2), random_prompt(21, 3), random_prompt(2, 4),
               random_prompt(9, 5), random_prompt(1, 6), random_prompt(14, 7)]  # ragged, one of a single token
    return StaticTarget.from_hf_model(tiny_llama_model()), random_heads(), prompts


def counted_run(static, proposer_for, prompts, config, batch_size, monkeypatch):
    """A batched run recording, per step, the host reads and the step readbacks; per-slot verification refused."""
    def refuse(*args, **kwargs):
        raise AssertionError("greedy verification ran per slot")

    monkeypatch.setattr(batched_decode, "verify_step", refuse)
    readbacks = []
    original_read = batched_decode.read_step
    monkeypatch.setattr(batched_decode, "read_step",
                        lambda verdict, depths=None: readbacks.append(1) or original_read(verdict, depths))
    target = BatchedStaticTarget.from_static_target(static, batch_size)
    decoder = BatchedDecoder(target, for_batch(proposer_for(static), batch_size), config)
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
def test_each_greedy_step_reads_the_device_once_whatever_the_batch_size(tiny, label, monkeypatch):
    static, heads, prompts = tiny
    proposer_for = tiny_proposers(heads)[label]
    eos = eos_mid_run(static, prompts, 16)
    config = GenerationConfig(max_new_tokens=16, eos_token_ids=(eos,))
    alone = decode_alone(static, proposer_for, prompts, config)
    assert {r.finish_reason for r in alone} == {"eos", "length"}  # EOS ends requests at different steps
    for batch_size in (1, 4, 7):
        batched, decoder, steps = counted_run(static, proposer_for, prompts, config, batch_size, monkeypatch)
        assert_each_request_as_alone(batched, alone)
        assert len(steps) == decoder.stats.num_steps > 0
        assert set(steps) == {(1, 1)}, (batch_size, steps)  # one host read (the readback) per step, at every B
        assert max(decoder.stats.active_per_step) == min(batch_size, len(prompts))


def test_the_counter_sees_per_slot_reads(tiny, monkeypatch):
    """The check above would catch per-slot syncs: verifying each slot on its own (the loop's former way, through
    ``greedy_on_device``) makes one host read per active slot per step."""
    static, heads, prompts = tiny
    config = GenerationConfig(max_new_tokens=6, ignore_eos=True)

    def per_slot(ids, logits, ancestors, counts, chain):
        for b, n in enumerate(counts.tolist()):
            if n:
                greedy_on_device(Draft.chain(ids[b, 1:n]), ids[b, :n], logits[b, :n])
        return verify_batch_greedy(ids, logits, ancestors, counts, chain=chain)

    monkeypatch.setattr(batched_decode, "verify_batch", per_slot)
    _, decoder, steps = counted_run(static, tiny_proposers(heads)["plain"], prompts[:4], config, 4, monkeypatch)
    assert [reads for reads, _ in steps] == [2 + active for active in decoder.stats.active_per_step]


def random_draft(generator: torch.Generator, nodes: int, chain: bool) -> Draft:
    tokens = torch.randint(0, 5, (nodes,), generator=generator)
    if chain:
        return Draft.chain(tokens)
    parents = torch.tensor([int(torch.randint(0, i + 1, (1,), generator=generator)) for i in range(nodes)], dtype=torch.long)
    return Draft(tokens=tokens, parents=parents)


@pytest.mark.parametrize("chain, chain_form", [(True, True), (True, False), (False, False)])
def test_batched_greedy_verification_equals_the_per_slot_one(chain, chain_form):
    """Random drafts over a 5-token vocabulary (so drafts get accepted), ragged per slot, idle slots among them:
    the batched verdict (chains through the chain form and the tree form) is ``greedy_on_device``'s accepted
    path and emitted tokens for every slot."""
    generator = torch.Generator().manual_seed(7)
    batch, width, vocab = 6, 7, 5
    for _ in range(20):
        nodes = torch.randint(0, width, (batch,), generator=generator).tolist()
        nodes[2] = -1  # an idle slot
        drafts = [None if n < 0 else random_draft(generator, n, chain) for n in nodes]
        ids = torch.zeros(batch, width, dtype=torch.long)  # (B, W)
        ancestors = torch.eye(width, dtype=torch.bool).repeat(batch, 1, 1)  # (B, W, W) padded rows: themselves
        if chain:
            ancestors[:] = torch.ones(width, width, dtype=torch.bool).tril()  # the chain step's causal rows
        counts = torch.tensor([0 if d is None else len(d) + 1 for d in drafts])  # (B,)
        for b, draft in enumerate(drafts):
            if draft is not None:
                n = len(draft) + 1
                ids[b, :n] = torch.cat([torch.randint(0, vocab, (1,), generator=generator), draft.tokens])
                ancestors[b, :n, :n] = draft.tree_mask()
        logits = torch.randn(batch, width, vocab, generator=generator)  # (B, W, V)
        verdict = verify_batch_greedy(ids, logits, ancestors, counts, chain=chain_form)
        for b, draft in enumerate(drafts):
            kept = int(verdict.kept[b])
            if draft is None:
                assert kept == 0 and verdict.emitted[b].eq(0).all()
                continue
            n = len(draft) + 1
            accepted, _, emitted = greedy_on_device(draft, ids[b, :n], logits[b, :n])
            assert verdict.nodes[b, :kept].tolist() == accepted
            assert verdict.nodes[b, kept:].tolist() == list(range(kept, width))
            assert verdict.emitted[b, :kept].tolist() == emitted and verdict.emitted[b, kept:].eq(0).all()
            assert int(verdict.last_node()[b]) == accepted[-1]


@pytest.mark.parametrize("label", ["medusa-chain", "medusa-tree"])
def test_sampled_slots_still_decode_as_alone(tiny, label):
    """Sampling stays per slot (each request its own generator): tokens equal the single-sequence run's per seed."""
    static, heads, prompts = tiny
    proposer_for = tiny_proposers(heads)[label]
    config = GenerationConfig(max_new_tokens=10, ignore_eos=True, sampling=SamplingParams(temperature=0.8))
    seeds = list(range(10, 10 + len(prompts)))
    alone = [Decoder(static, proposer_for(static), config).generate(p, seed=s) for p, s in zip(prompts, seeds)]
    for batch_size in (1, 4):
        target = BatchedStaticTarget.from_static_target(static, batch_size)
        batched = BatchedDecoder(target, for_batch(proposer_for(static), batch_size), config).generate_all(prompts, seeds)
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


def test_the_batched_history_hands_each_slot_the_states_it_sees_alone(tiny):
    """The device history appended for all slots at once (tokens, last hidden state, features) gives a per-slot
    proposer, step for step, the history, hidden state and features of the single-sequence loop."""
    static, _, prompts = tiny
    config = GenerationConfig(max_new_tokens=12, ignore_eos=True)
    alone = []
    for prompt in prompts[:4]:
        proposer = RecordingNgram()
        Decoder(static, proposer, config).generate(prompt)
        alone.append(proposer.seen)
    per_slot = [RecordingNgram(), RecordingNgram()]
    BatchedDecoder(BatchedStaticTarget.from_static_target(static, 2), PerSlotProposer(per_slot), config).generate_all(prompts[:4])
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
            torch.testing.assert_close(hidden, h, atol=1e-5, rtol=1e-5)  # batched sums: another order only
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


def test_drafts_of_unknown_depth_count_as_alone_whatever_their_length(tiny):
    static, _, prompts = tiny
    config = GenerationConfig(max_new_tokens=16, ignore_eos=True)
    alone = decode_alone(static, lambda target: RawShapeNgram(num_speculative_tokens=4), prompts, config)
    target = BatchedStaticTarget.from_static_target(static, 4)
    proposer = PerSlotProposer.build(lambda: RawShapeNgram(num_speculative_tokens=4), 4)
    batched = BatchedDecoder(target, proposer, config).generate_all(prompts)
    assert_each_request_as_alone(batched, alone)  # counters: each step's draft tokens from its own deepest node
    assert sum(r.counters.num_drafts for r in alone) > 0
