"""EAGLE's host reads per step on the static engine (docs/eagle.md#host-reads-per-step): counted on the CPU (each
one a device-to-host sync on a GPU), a propose of the EAGLE chain, EAGLE-1 static tree and EAGLE-2 / EAGLE-3
dynamic trees reads nothing and the rest of the step (verify, commit) reads once, the verdict's readback, whatever
the number of tree nodes (total_tokens 10 vs 60); the draft's device-built shape (depths, ancestor mask, chain flag,
longest path) is the one Draft derives from the parents, and decoding (greedy and sampled) is unchanged token for
token, counters included, against drafts that derive their shape the old way and against plain decoding."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from specbench.eagle.expansion import dynamic_tree_rule
from specbench.engine.device_verification import read_step, verify_batch_greedy
from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.draft import Draft, ancestor_mask
from specbench.engine.hf_target import HFTarget
from specbench.engine.sampling import SamplingParams
from specbench.engine.verification import verify_greedy
from specbench.proposers import create_proposer
from test_eagle import random_head
from test_eagle3 import deep_llama
from test_eagle_graphs import CASES, PROMPTS, FakeCapture, build_target, build_proposer
from test_batched_graphs import FakeCapture as TargetCapture
from test_static_target import build
from _host_reads import HostReads

MAX_NEW = 20
PROPOSE_READS, STEP_READS = 0, 1  # per propose; per verify + commit (the verdict's one readback)


def counted_decode(target, proposer, prompt, config=None):
    """Decode ``prompt`` (after a warm-up request that captures the graphs) counting host reads: per propose, and
    from the end of each propose to the start of the next (or the end of the request): that step's verify and
    commit. Returns the result, both lists and the recorded reads (method, source line)."""
    config = config or GenerationConfig(max_new_tokens=MAX_NEW)
    proposer.reserve(80)
    decoder = Decoder(target, proposer, config)
    decoder.generate(PROMPTS[0])  # warm-up: captures the draft's and the target's graphs
    reads, marks, inner = HostReads(where=True), [], proposer.propose

    def propose(states):
        marks.append(reads.count)
        drafts = inner(states)
        marks.append(reads.count)
        return drafts

    proposer.propose = propose
    try:
        with reads:
            result = decoder.generate(prompt)
        marks.append(reads.count)
    finally:
        del proposer.propose
    per_propose = [marks[i + 1] - marks[i] for i in range(0, len(marks) - 1, 2)]
    per_step = [marks[i + 2] - marks[i + 1] for i in range(0, len(marks) - 1, 2)]
    return result, per_propose, per_step, reads.reads


def plain_truth(label: str, prompt) -> list[int]:
    model = deep_llama() if label.startswith("eagle3") else build("llama")
    return Decoder(HFTarget(model), None, GenerationConfig(max_new_tokens=MAX_NEW)).generate(prompt).output_token_ids


@pytest.mark.parametrize("label", sorted(CASES))
def test_a_propose_reads_nothing_and_a_step_reads_once(label):
    target = build_target(label, graph_backend=TargetCapture())  # the static engine, its steps "captured"
    proposer = build_proposer(label, target, graph_backend=FakeCapture())
    assert proposer.captured.enabled
    prompt = PROMPTS[1]
    result, per_propose, per_step, where = counted_decode(target, proposer, prompt)
    assert len(per_propose) == result.counters.num_target_forwards > 3
    assert set(per_propose) == {PROPOSE_READS}, where
    assert set(per_step) == {STEP_READS}, where
    assert {method for method, _ in where} == {"tolist"}  # the verdict's packed readback
    assert result.output_token_ids == plain_truth(label, prompt)
    assert result.counters.num_drafts > 0


@pytest.mark.parametrize("total_tokens", [10, 60])
def test_dynamic_tree_reads_do_not_grow_with_its_nodes(total_tokens):
    target = build_target("eagle2-dynamic-tree", graph_backend=TargetCapture())
    proposer = create_proposer("eagle", target, head=random_head(seed=5, std=0.1), top_k=4, depth=5,
                               total_tokens=total_tokens, graph_backend=FakeCapture())
    prompt = PROMPTS[2]
    result, per_propose, per_step, where = counted_decode(target, proposer, prompt)
    assert set(per_propose) == {PROPOSE_READS} and set(per_step) == {STEP_READS}, where
    assert result.output_token_ids == plain_truth("eagle2-dynamic-tree", prompt)
    assert result.counters.num_draft_tokens > result.counters.num_drafts  # trees deeper than one level were counted


def test_the_counter_sees_the_reads_of_a_shape_derived_from_the_parents():
    """The checks above would catch the former syncs: a draft built from its parents alone validates them on the
    host, and its chain flag and longest path are host reads."""
    draft = Draft(tokens=torch.zeros(3, dtype=torch.long), parents=torch.tensor([0, 1, 1]))
    with HostReads() as reads:
        Draft(tokens=draft.tokens, parents=draft.parents).is_chain
    assert reads.count == 2  # validation + is_chain
    with HostReads() as reads:
        draft.tree_mask(), draft.depths()  # on the parents' device, no read
    assert reads.count == 0
    with HostReads() as reads:
        assert draft.depth() == 2
    assert reads.count == 1


def reference_mask(parents: list[int]) -> torch.Tensor:
    """The ancestor closure row by row on the host (parents precede children)."""
    mask = torch.eye(len(parents) + 1, dtype=torch.bool)
    for i, p in enumerate(parents, start=1):
        mask[i] |= mask[p]
    return mask


def test_ancestor_mask_is_the_closure_for_any_tree():
    generator = torch.Generator().manual_seed(3)
    for nodes in list(range(0, 9)) + [31, 64]:
        for _ in range(6):
            parents = [int(torch.randint(0, i + 1, (1,), generator=generator)) for i in range(nodes)]
            want = reference_mask(parents)
            depth = int((want.sum(dim=1) - 1).max())
            for bound in (depth, depth + 1, nodes):  # the rounds only need to cover the deepest node
                assert torch.equal(ancestor_mask(torch.tensor(parents, dtype=torch.long), bound), want)
    chain = list(range(16))
    assert torch.equal(ancestor_mask(torch.tensor(chain), 16), reference_mask(chain))  # the deepest tree of 16


def device_verdict(draft: Draft, verify_ids: torch.Tensor, logits: torch.Tensor) -> tuple[list[int], list[int], int]:
    """One slot's greedy verification as the decode loop runs it on the device, over the draft's own ancestor mask and
    depths: (accepted nodes, emitted tokens, the deepest node), the last two from the step's one readback."""
    counts = torch.tensor([len(verify_ids)])  # (1,)
    verdict = verify_batch_greedy(verify_ids[None], logits[None], draft.tree_mask()[None], counts)
    readback = read_step(verdict, draft.depths()[None].amax(dim=1))  # (1,) the depth rides on the readback
    emitted = readback.tokens()[0]
    return verdict.nodes[0, : len(emitted)].tolist(), emitted, readback.depths()[0]


@pytest.mark.parametrize("top_k, depth, total", [(3, 4, 12), (4, 5, 60), (2, 4, 3), (1, 5, 4), (3, 3, 1)])
def test_the_dynamic_trees_device_shape_is_the_one_its_parents_give(top_k, depth, total):
    """Random draft logits: depths, mask, chain flag and (after greedy verification, from its readback) the longest
    path equal what Draft derives from the parents alone; the verdict is the same."""
    vocab = 12
    generator = torch.Generator().manual_seed(top_k * 100 + total)
    for trial in range(8):
        table = (1 + trial) * torch.randn(vocab, vocab, generator=generator)  # (V, V) draft logits after each token
        root_logits = 3 * torch.randn(vocab, generator=generator)
        rule = dynamic_tree_rule(top_k=top_k, depth=depth, total_tokens=total)
        draft, = rule(torch.zeros(1, 4), root_logits[None], lambda t, f, level, sees: (f, table[t]))
        derived = Draft(tokens=draft.tokens, parents=draft.parents)  # the shape from the parents alone
        assert torch.equal(draft.depths(), derived.depths())
        assert torch.equal(draft.tree_mask(), reference_mask(draft.parents.tolist()))
        shaped_chain = derived.is_chain
        assert draft.precomputed_is_chain in (shaped_chain, None) and draft.is_chain == shaped_chain
        assert draft.precomputed_is_chain is not None or (top_k > 1 and total <= depth)
        verify_ids = torch.cat([torch.tensor([3]), draft.tokens])
        logits = torch.randn(total + 1, vocab, generator=generator)
        logits[draft.parents, draft.tokens] += 5 * (trial % 2)  # odd trials: drafts often their parent's argmax
        if not shaped_chain:  # chains verify through the chain rule, which needs no depth
            got = device_verdict(draft, verify_ids, logits)
            assert got == device_verdict(derived, verify_ids, logits)
            want = verify_greedy(derived, logits)  # the host reference
            assert got[:2] == (want.accepted_nodes, verify_ids[want.accepted_nodes[1:]].tolist() + [want.next_token])
            assert draft.precomputed_depth in (None, got[2])
            draft.precomputed_depth = got[2]  # what the decode loop learns from the readback
        assert draft.depth() == derived.depth() == int(derived.depths().max())


def old_style(proposer):
    """Drafts as they were built before: tokens and parents only, every shape derived from the parents."""
    inner = proposer.propose

    def propose(states):
        return {slot: Draft(tokens=draft.tokens, parents=draft.parents, draft_probs=draft.draft_probs)
                for slot, draft in inner(states).items()}

    proposer.propose = propose
    return proposer


@pytest.mark.parametrize("sampled", [False, True])
@pytest.mark.parametrize("options, head, chains", [
    (dict(top_k=3, depth=4, total_tokens=12), dict(seed=5, std=0.1), False),  # never one path: verified as trees
    (dict(top_k=2, depth=4, total_tokens=3), dict(seed=1, std=0.2), True),  # mostly one path: the chain rule
], ids=["tree", "maybe-chain"])
def test_decoding_is_unchanged(options, head, chains, sampled):
    """Greedy and sampled (a seed's tokens) decoding and the counters equal those of drafts deriving their shape the
    old way, on the static engine with captured draft forwards."""
    sampling = SamplingParams(temperature=0.8) if sampled else SamplingParams()
    config = GenerationConfig(max_new_tokens=MAX_NEW, sampling=sampling)
    results, shapes = [], []
    for wrap in (lambda p: p, old_style):
        target = build_target("eagle2-dynamic-tree", graph_backend=TargetCapture())
        proposer = wrap(create_proposer("eagle", target, head=random_head(**head), **options,
                                        graph_backend=FakeCapture()))
        inner = proposer.propose
        proposer.propose = lambda states: shapes.append(inner(states)[0]) or {0: shapes[-1]}
        decoder = Decoder(target, proposer, config)
        results.append([decoder.generate(p, seed=11 + i) for i, p in enumerate(PROMPTS)])
    for new, old in zip(*results):
        assert new.output_token_ids == old.output_token_ids and new.counters == old.counters
    assert sum(r.counters.num_drafts for r in results[0]) > 0
    assert sum(r.counters.num_accepted_tokens for r in results[0]) > 0 or chains  # (random heads, short chains)
    assert any(d.is_chain for d in shapes) == chains


def test_chain_drafts_carry_their_shape():
    draft = Draft.chain(torch.tensor([5, 6, 7]))
    assert draft.precomputed_depths.tolist() == [0, 1, 2, 3] and draft.is_chain and draft.depth() == 3
    assert dataclasses.replace(draft).depths().tolist() == [0, 1, 2, 3]
    assert torch.equal(draft.tree_mask(), torch.ones(4, 4, dtype=torch.bool).tril())
