"""Greedy verification on the device (``verify_batch_greedy`` over ragged, padded and idle slots, read back by
``read_step``) against the host reference ``verify_greedy`` on random and constructed chains and trees, its single
host transfer, and the decode loop's output and counters with and without it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import specbench.engine.decode as decode_module
from specbench.engine.device_verification import BatchVerdict, read_step, verify_batch_greedy
from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.draft import Draft
from specbench.engine.hf_target import HFTarget
from specbench.engine.sampling import SamplingParams
from specbench.engine.step_inputs import slot_input
from specbench.engine.tree import TreeBuffers
from specbench.engine.verification import verify_greedy
from specbench.medusa.heads import MedusaHeads, MedusaHeadsConfig
from specbench.proposers import create_proposer
from specbench.proposers.medusa import MedusaProposer
from specbench.proposers.scripted import ScriptedProposer
from _prompts import random_prompt, repetitive_prompt

CASES = 200
TREE = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [1, 1], [2, 0], [0, 0, 0], [1, 1, 0], [1, 1, 1]]
PAD = 2  # nodes of padding after the slot's: the step's fixed width is wider than most slots' inputs


def reference(draft: Draft, verify_ids: torch.Tensor, logits: torch.Tensor) -> tuple[list[int], int, list[int]]:
    """The host reference: verify_greedy's accepted path, its next token and the tokens the step emits."""
    verdict = verify_greedy(draft, logits)
    emitted = verify_ids[verdict.accepted_nodes[1:]].tolist() + [verdict.next_token]
    return verdict.accepted_nodes, verdict.next_token, emitted


def padded_step(draft: Draft, verify_ids: torch.Tensor, logits: torch.Tensor, is_chain: bool | None = None):
    """The slot's ``[root, *draft]`` ``(N + 1,)`` and logits ``(N + 1, V)`` as one row of a step PAD nodes wider, as the
    target's buffers hold them: (ids, logits, ancestors, counts, chain). Each padding node copies the argmax of the
    node before it, so it would be accepted if the node count did not rule it out."""
    chain = draft.is_chain if is_chain is None else is_chain
    n, vocab = verify_ids.numel(), logits.shape[-1]
    width = n + PAD
    padded = torch.cat([logits, torch.randn(PAD, vocab, generator=torch.Generator().manual_seed(n))])  # (W, V)
    ids = torch.cat([verify_ids, padded[n - 1: width - 1].argmax(dim=-1)])  # (W,)
    ancestors = torch.ones(width, width, dtype=torch.bool).tril()  # (W, W) a chain step's causal rows
    if not chain:
        ancestors = torch.eye(width, dtype=torch.bool)  # a tree step's padded rows see themselves only
        ancestors[:n, :n] = draft.tree_mask()
    return ids[None], padded[None], ancestors[None], torch.tensor([n]), chain


def on_device(ids, logits, ancestors, counts, chain) -> tuple[BatchVerdict, list[int]]:
    """The device verdict of a step and its emitted tokens, read back in the step's one transfer."""
    verdict = verify_batch_greedy(ids, logits, ancestors, counts, chain=chain)
    return verdict, read_step(verdict).tokens()[0]


def device_result(verdict: BatchVerdict, emitted: list[int]) -> tuple[list[int], int, list[int]]:
    """(accepted nodes, next token, emitted tokens) of the step's one slot, as ``reference`` gives them."""
    return verdict.nodes[0, : len(emitted)].tolist(), emitted[-1], emitted


def random_parents(gen: torch.Generator, nodes: int, chain: bool) -> list[int]:
    if chain:
        return list(range(nodes))
    return [int(torch.randint(0, node, (1,), generator=gen)) for node in range(1, nodes + 1)]


def constructed_case(gen: torch.Generator, parents: list[int], vocab: int, p_ok: float):
    """Logits with a known argmax per row; each draft token copies its parent's argmax with chance p_ok."""
    n = len(parents)
    logits = torch.randn(n + 1, vocab, generator=gen)  # (N + 1, V)
    argmax = torch.randint(0, vocab, (n + 1,), generator=gen)  # (N + 1,)
    logits[torch.arange(n + 1), argmax] = logits.max() + 1.0 + torch.rand(n + 1, generator=gen)
    tokens = []
    for parent in parents:
        true_token = int(argmax[parent])
        ok = bool(torch.rand((), generator=gen) < p_ok)
        tokens.append(true_token if ok else (true_token + 1 + int(torch.randint(0, vocab - 1, (1,), generator=gen))) % vocab)
    draft = Draft(tokens=torch.tensor(tokens, dtype=torch.long), parents=torch.tensor(parents, dtype=torch.long))
    return draft, logits


def check(draft: Draft, logits: torch.Tensor, root: int = 5, is_chain: bool | None = None):
    verify_ids = torch.cat([torch.tensor([root]), draft.tokens])  # (N + 1,)
    got = device_result(*on_device(*padded_step(draft, verify_ids, logits, is_chain)))
    assert got == reference(draft, verify_ids, logits)
    return got


@pytest.mark.parametrize("chain, chain_form", [(True, True), (True, False), (False, False)],
                         ids=["chain", "chain-as-tree", "tree"])
def test_random_logits_match_verify_greedy_in_every_slot(chain, chain_form):
    """Random drafts and logits over a tiny vocabulary (drafts match often enough to accept at many depths), ragged
    per slot with an idle slot among them: the batched verdict (chains through the chain form and the tree form)
    is ``verify_greedy``'s accepted path and emitted tokens for every slot, padding and idle slots untouched."""
    gen = torch.Generator().manual_seed(1234)
    batch, width = 6, 12
    lengths = set()
    for _ in range(CASES // (batch - 1)):
        vocab = int(torch.randint(2, 6, (1,), generator=gen))
        nodes = torch.randint(0, width, (batch,), generator=gen).tolist()
        nodes[2] = -1  # an idle slot
        drafts = [None if n < 0 else Draft(tokens=torch.randint(0, vocab, (n,), generator=gen),
                                           parents=torch.tensor(random_parents(gen, n, chain), dtype=torch.long))
                  for n in nodes]
        ids = torch.zeros(batch, width, dtype=torch.long)  # (B, W)
        ancestors = torch.eye(width, dtype=torch.bool).repeat(batch, 1, 1)  # (B, W, W) padded rows: themselves
        if chain:
            ancestors[:] = torch.ones(width, width, dtype=torch.bool).tril()  # the chain step's causal rows
        counts = torch.tensor([0 if d is None else len(d) + 1 for d in drafts])  # (B,)
        for b, draft in enumerate(drafts):
            if draft is not None:
                n = len(draft) + 1
                ids[b, :n] = torch.cat([torch.randint(0, vocab, (1,), generator=gen), draft.tokens])
                ancestors[b, :n, :n] = draft.tree_mask()
        logits = torch.randn(batch, width, vocab, generator=gen)  # (B, W, V)
        verdict = verify_batch_greedy(ids, logits, ancestors, counts, chain=chain_form)
        for b, draft in enumerate(drafts):
            kept = int(verdict.kept[b])
            if draft is None:
                assert kept == 0 and verdict.emitted[b].eq(0).all()
                continue
            accepted, _, emitted = reference(draft, ids[b, : len(draft) + 1], logits[b, : len(draft) + 1])
            assert verdict.nodes[b, :kept].tolist() == accepted
            assert verdict.nodes[b, kept:].tolist() == list(range(kept, width))
            assert verdict.emitted[b, :kept].tolist() == emitted and verdict.emitted[b, kept:].eq(0).all()
            assert int(verdict.last_node()[b]) == accepted[-1]
            lengths.add(kept)
    assert len(lengths) >= 4, f"accepted path lengths seen: {sorted(lengths)}"


@pytest.mark.parametrize("chain", [True, False], ids=["chain", "tree"])
def test_constructed_logits_accept_the_known_nodes(chain):
    gen = torch.Generator().manual_seed(99)
    ties = 0
    for case in range(CASES):
        n = 1 + case % 15
        parents = random_parents(gen, n, chain)
        draft, logits = constructed_case(gen, parents, vocab=50, p_ok=0.75)
        accepted, next_token, emitted = check(draft, logits, is_chain=chain if case % 2 else None)
        # the known answer: node ok iff it copies its parent's argmax; deepest all-ok path, earliest on ties
        argmax = logits.argmax(-1).tolist()
        ok_path = [True] + [False] * n
        depth = [0] * (n + 1)
        for node, parent in enumerate(parents, start=1):
            depth[node] = depth[parent] + 1
            ok_path[node] = ok_path[parent] and int(draft.tokens[node - 1]) == argmax[parent]
        deepest = max(depth[node] for node in range(n + 1) if ok_path[node])
        candidates = [node for node in range(n + 1) if ok_path[node] and depth[node] == deepest]
        ties += len(candidates) > 1
        assert accepted[-1] == candidates[0]
        assert next_token == argmax[candidates[0]] == emitted[-1]
        assert len(emitted) == deepest + 1
    if not chain:
        assert ties > 10, "the trees must include equally deep accepted paths to test the tie rule"


def test_a_chain_is_verified_without_reading_its_parents():
    """A chain's parents are 0..N-1 by definition, so neither its verify input nor its verification reads them: on a
    GPU a host-held chain's parents would be a pageable upload that waits for the stream every step."""
    gen = torch.Generator().manual_seed(7)
    draft, logits = constructed_case(gen, list(range(6)), vocab=50, p_ok=0.8)
    verify_ids = torch.cat([torch.tensor([5]), draft.tokens])  # (N + 1,)
    want = reference(draft, verify_ids, logits)
    draft = Draft.chain(draft.tokens)
    draft.parents = None  # any read of them would raise
    step = slot_input(5, draft, torch.device("cpu"))  # the decode loop's verify input of the slot
    assert step.tree_mask is None and list(step.depths) == list(range(7))
    assert device_result(*on_device(*padded_step(draft, verify_ids, logits, is_chain=True))) == want


def test_duplicate_sibling_tokens_tie_to_the_earliest_node():
    # nodes 1 and 2 both copy the root's argmax; 3 under 2 and 4 under 1 both copy theirs: the tie at
    # depth 2 goes to node 3 (the lower index), though node 4 hangs under the earlier sibling
    logits = torch.zeros(5, 8)
    logits[0, 3] = logits[1, 6] = logits[2, 6] = logits[3, 1] = logits[4, 2] = 1.0
    draft = Draft(tokens=torch.tensor([3, 3, 6, 6]), parents=torch.tensor([0, 0, 2, 1]))
    assert check(draft, logits, root=7) == ([0, 2, 3], 1, [3, 6, 1])


def test_static_tree_buffers_match_verify_greedy():
    buffers = TreeBuffers.from_paths(TREE)
    gen = torch.Generator().manual_seed(7)
    for _ in range(CASES):
        topk = torch.randint(0, 6, (buffers.max_depth, buffers.top_k), generator=gen)  # (depth, top_k)
        draft = buffers.draft(topk)
        check(draft, torch.randn(buffers.num_nodes + 1, 6, generator=gen))


def test_empty_draft_gives_the_argmax():
    logits = torch.randn(1, 32, generator=torch.Generator().manual_seed(3))
    assert check(Draft.chain(torch.empty(0, dtype=torch.long)), logits) == ([0], int(logits.argmax()), [int(logits.argmax())])


@pytest.mark.parametrize("chain_form", [True, False], ids=["chain-form", "tree-form"])
def test_a_plain_step_keeps_each_live_root_and_emits_its_argmax(chain_form):
    """Width 1 (every slot verifies its root alone: plain decoding, or a step nobody drafted in): each live slot keeps
    node 0 and emits the argmax after it, an idle slot keeps and emits nothing, as ``verify_greedy`` says per slot."""
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(5, 1, 11, generator=gen)  # (B, 1, V)
    ids = torch.randint(0, 11, (5, 1), generator=gen)  # (B, 1) the roots
    counts = torch.tensor([1, 1, 0, 1, 0])  # (B,) slots 2 and 4 idle
    verdict = verify_batch_greedy(ids, logits, torch.ones(5, 1, 1, dtype=torch.bool), counts, chain=chain_form)
    empty = Draft.chain(torch.empty(0, dtype=torch.long))
    for b in range(5):
        if counts[b]:
            accepted, _, emitted = reference(empty, ids[b], logits[b])
            assert (int(verdict.kept[b]), verdict.nodes[b].tolist(), verdict.emitted[b].tolist()) == (1, accepted, emitted)
        else:
            assert (int(verdict.kept[b]), verdict.nodes[b].tolist(), verdict.emitted[b].tolist()) == (0, [0], [0])
    assert read_step(verdict).tokens() == [[int(logits[b, 0].argmax())] if counts[b] else [] for b in range(5)]


HOST_READS = ("tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


@pytest.mark.parametrize("kind", ["chain", "tree", "tree-buffers", "empty"])
def test_one_host_transfer_per_call(monkeypatch, kind):
    gen = torch.Generator().manual_seed(5)
    if kind == "tree-buffers":
        draft = TreeBuffers.from_paths(TREE).draft(torch.randint(0, 4, (3, 3), generator=gen))
    else:
        n = {"chain": 6, "tree": 9, "empty": 0}[kind]
        draft, _ = constructed_case(gen, random_parents(gen, n, kind != "tree"), vocab=4, p_ok=0.8)
    logits = torch.randn(len(draft) + 1, 4, generator=gen)
    verify_ids = torch.cat([torch.tensor([1]), draft.tokens])
    step = padded_step(draft, verify_ids, logits)  # the target's buffers, filled by its verify already
    expected = reference(draft, verify_ids, logits)
    calls = []
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            calls.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    result = on_device(*step)
    monkeypatch.undo()
    assert calls == ["tolist"]
    assert device_result(*result) == expected


def random_heads(seed: int = 1) -> MedusaHeads:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        heads = MedusaHeads(MedusaHeadsConfig(5, 1, 64, 256, True))
        for name, p in heads.named_parameters():
            nn.init.normal_(p, std=0.5 if name.endswith("bias") else 0.2)
    return heads


@pytest.mark.parametrize(
    "setup",
    ["plain", "ngram", "scripted", "medusa-chain", "medusa-tree", "typical-t0"],
)
def test_decoder_output_and_counters_unchanged(tiny_model, monkeypatch, setup):
    """The decode loop with greedy verification on the device against the same loop forced onto the host's
    verification.verify."""
    target = HFTarget(tiny_model)
    sampling = SamplingParams(acceptance="typical") if setup == "typical-t0" else SamplingParams()
    config = GenerationConfig(max_new_tokens=40, sampling=sampling)

    prompts = [repetitive_prompt(1), random_prompt(9, 4)]
    truths = [Decoder(target, None, GenerationConfig(max_new_tokens=48)).generate(p).output_token_ids for p in prompts]
    made = iter(range(2 * len(prompts)))

    def proposer():
        if setup == "plain":
            return None
        if setup == "ngram":
            return create_proposer("ngram", target, num_speculative_tokens=4)
        if setup == "scripted":  # the truth, wrong at known positions: every acceptance length occurs
            truth = truths[next(made) % len(prompts)]
            return ScriptedProposer(truth, 4, target.vocab_size, wrong_positions={2, 3, 9, 15, 16, 17, 30})
        options = {"tree": TREE} if setup in ("medusa-tree", "typical-t0") else {"num_speculative_tokens": 3}
        return MedusaProposer.from_options(target, heads=random_heads(), **options)

    device = [Decoder(target, proposer(), config).generate(p) for p in prompts]
    monkeypatch.setattr(decode_module, "verifies_greedily", lambda params: False)  # the host path: verify()
    host = [Decoder(target, proposer(), config).generate(p) for p in prompts]
    for a, b in zip(device, host):
        assert a.output_token_ids == b.output_token_ids
        assert a.counters == b.counters
        assert a.finish_reason == b.finish_reason
    if setup != "plain":
        assert sum(r.counters.num_drafts for r in device) > 0
    if setup not in ("plain", "ngram"):
        assert sum(r.counters.num_accepted_tokens for r in device) > 0
