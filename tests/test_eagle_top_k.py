"""specbench/eagle/top_k.py: the chunked top-k gives ``torch.topk``'s values and (without ties) its indices in every
shape the drafting rules pass; the rules' full-vocabulary top-k all go through ``vocab_top_k``; the switch ``CHUNK``
(off) decides which runs; and with it on, EAGLE-1's static tree and EAGLE-2's dynamic tree decode with the same tokens
and counters as with it off (fp32: no ties)."""

from __future__ import annotations

import pytest
import torch

from specbench.eagle import expansion, top_k
from specbench.eagle.top_k import chunked_top_k, vocab_top_k
from specbench.engine.tree import TreeBuffers
from test_eagle_graphs import build_proposer, build_target, decode_all


@pytest.mark.parametrize("shape, k, chunk", [((2, 3, 1000), 8, 128), ((4, 1024), 8, 128), ((1, 8, 500), 16, 16),
                                             ((2, 37), 1, 5)])
def test_values_and_indices_equal_torch_topks(shape, k, chunk):
    scores = torch.randn(shape, generator=torch.Generator().manual_seed(0))  # fp32: no ties
    got, want = chunked_top_k(scores, k, chunk=chunk), torch.topk(scores, k, dim=-1)
    assert torch.equal(got.values, want.values) and torch.equal(got.indices, want.indices)
    values, indices = got  # unpacks as torch.topk's result does
    assert values.shape == indices.shape == (*shape[:-1], k)


def test_with_ties_the_values_are_torch_topks_and_each_index_holds_its_value():
    scores = torch.randint(0, 6, (3, 300), generator=torch.Generator().manual_seed(1)).float()  # many equal scores
    got = chunked_top_k(scores, 8, chunk=64)
    assert torch.equal(got.values, torch.topk(scores, 8, dim=-1).values)
    assert torch.equal(scores.gather(-1, got.indices), got.values)
    assert all(len(set(row)) == 8 for row in got.indices.tolist())  # 8 distinct tokens per row, padding never


@pytest.mark.parametrize("k", [0, 17])
def test_a_k_outside_one_chunk_is_refused(k):
    with pytest.raises(ValueError, match=rf"k must be in 1\.\.chunk \(16\), got {k}"):
        chunked_top_k(torch.zeros(2, 100), k, chunk=16)


STATIC = expansion.StaticTreePlan.from_tree(TreeBuffers.from_paths([[0], [1], [0, 0], [0, 1], [0, 0, 0]]))


@pytest.mark.parametrize("rule, calls", [(expansion.dynamic_tree_rule(top_k=3, depth=4, total_tokens=10), 4),
                                         (expansion.static_tree_rule(STATIC), 1 + len(STATIC.levels)),
                                         (expansion.chain_rule(4), 0)])
def test_the_rules_full_vocabulary_top_k_goes_through_the_seam(rule, calls, monkeypatch):
    """EAGLE-2's dynamic tree takes its root's and every level's top-k over the vocabulary there (depth calls), and
    EAGLE-1's static tree its root's and every expanded level's; the chain takes argmaxes, none."""
    seen = []
    monkeypatch.setattr(expansion, "vocab_top_k", lambda scores, k: seen.append(scores.shape[-1]) or torch.topk(
        scores, k, dim=-1))
    vocab, hidden = 50, 8
    gen = torch.Generator().manual_seed(0)

    def expand(tokens, features, depth, sees):  # (B, W) -> (B, W, H), (B, W, V)
        return torch.randn(*tokens.shape, hidden, generator=gen), torch.randn(*tokens.shape, vocab, generator=gen)

    rule.grow(torch.randn(2, hidden, generator=gen), torch.randn(2, vocab, generator=gen), expand)
    assert seen == [vocab] * calls


def test_the_switch_is_off_and_decides_which_top_k_runs(monkeypatch):
    assert top_k.CHUNK == 0  # off until an A/B on a GPU shows it pays
    calls = []
    monkeypatch.setattr(top_k, "chunked_top_k", lambda *a, **kw: calls.append(kw["chunk"]) or chunked_top_k(*a, **kw))
    scores = torch.randn(2, 100, generator=torch.Generator().manual_seed(2))
    assert torch.equal(vocab_top_k(scores, 4).indices, torch.topk(scores, 4, dim=-1).indices) and calls == []
    monkeypatch.setattr(top_k, "CHUNK", 16)
    assert torch.equal(vocab_top_k(scores, 4).values, torch.topk(scores, 4, dim=-1).values) and calls == [16]
    vocab_top_k(scores, 17)  # k past one chunk, and a row of one chunk: torch.topk
    vocab_top_k(scores[:, :16], 4)
    assert calls == [16]


@pytest.mark.parametrize("label", ["eagle1-static-tree", "eagle2-dynamic-tree", "eagle3-dynamic-tree"])
def test_with_the_switch_on_the_drafts_decode_as_with_it_off(label, monkeypatch):
    off_target = build_target(label, compile=False)
    want = decode_all(off_target, build_proposer(label, off_target))
    monkeypatch.setattr(top_k, "CHUNK", 16)  # the tiny models' vocabulary spans many chunks of 16
    on_target = build_target(label, compile=False)
    got = decode_all(on_target, build_proposer(label, on_target))
    assert [(g.output_token_ids, g.counters) for g in got] == [(w.output_token_ids, w.counters) for w in want]
    assert sum(g.counters.num_drafts for g in got) > 0
