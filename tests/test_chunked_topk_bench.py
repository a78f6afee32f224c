"""bench/_chunked_topk.py, the candidate for EAGLE's full-vocabulary top-k: the same values and (without ties) the same
indices as ``torch.topk``, in every shape the drafting rules pass; and the rules' full-vocabulary top-k all go through
``expansion.vocab_top_k``, the seam bench/replay_profile.py --chunked-topk replaces."""

from __future__ import annotations

import pytest
import torch

from bench._chunked_topk import chunked_top_k
from specbench.eagle import expansion
from specbench.engine.tree import TreeBuffers


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
