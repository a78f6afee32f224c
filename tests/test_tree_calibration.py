"""Tree calibration: greedy growth is optimal on small tables, expected MAL, JSON round trip."""

import itertools
import json

import pytest
import torch

from specbench.medusa.trees import load_tree
from specbench.medusa.tree_calibration import (
    calibrate_tree,
    expected_acceptance_length,
    rank_accuracies,
    save_tree_json,
)

# per-rank probabilities (rows: heads, columns: ranks), chosen so every node value below is distinct
ACC = torch.tensor([[0.6, 0.2], [0.5, 0.3]])
# node values = products along the path: [0] .6, [0,0] .3, [1] .2, [0,1] .18, [1,0] .1, [1,1] .06
HAND_OPTIMA = {
    1: ([[0]], 1.6),
    2: ([[0], [0, 0]], 1.9),
    3: ([[0], [1], [0, 0]], 2.1),
    4: ([[0], [1], [0, 0], [0, 1]], 2.28),
    6: ([[0], [1], [0, 0], [0, 1], [1, 0], [1, 1]], 2.44),
}


@pytest.mark.parametrize("budget", sorted(HAND_OPTIMA))
def test_greedy_tree_is_the_hand_computed_optimum(budget):
    paths, mal = HAND_OPTIMA[budget]
    assert calibrate_tree(ACC, budget) == paths
    assert expected_acceptance_length(paths, ACC) == pytest.approx(mal)


def _best_by_brute_force(acc: torch.Tensor, budget: int) -> float:
    heads, k = acc.shape
    nodes = [p for d in range(1, heads + 1) for p in itertools.product(range(k), repeat=d)]
    best = 0.0
    for subset in itertools.combinations(nodes, budget):
        chosen = set(subset)
        if all(p[:-1] in chosen for p in chosen if len(p) > 1):  # prefix-closed: a valid tree
            best = max(best, expected_acceptance_length([list(p) for p in subset], acc))
    return best


@pytest.mark.parametrize(
    "acc",
    [
        ACC,
        torch.tensor([[0.2, 0.5], [0.9, 0.05]]),  # rank 1 beats rank 0 on head 0: the tree skips [0] at first
        torch.tensor([[0.4, 0.3], [0.5, 0.45], [0.7, 0.1]]),  # head 1 nearly flat: siblings compete with depth
    ],
)
def test_greedy_tree_matches_brute_force_optimum(acc):
    for budget in range(1, 6):
        tree = calibrate_tree(acc, budget)
        assert len(tree) == budget
        assert expected_acceptance_length(tree, acc) == pytest.approx(_best_by_brute_force(acc, budget))


def test_skewed_head_grows_the_better_rank_first():
    assert calibrate_tree(torch.tensor([[0.2, 0.5], [0.9, 0.05]]), 2) == [[1], [1, 0]]


def test_expected_acceptance_length_grows_with_the_budget():
    acc = rank_accuracies(torch.tensor([[0.55, 0.7, 0.78, 0.82], [0.3, 0.45, 0.52, 0.57], [0.2, 0.3, 0.36, 0.4]]))
    lengths = [expected_acceptance_length(calibrate_tree(acc, n), acc) for n in range(1, 30)]
    # every added node has a positive value here (all accuracies > 0), so growth is strict
    assert all(b > a for a, b in zip(lengths, lengths[1:]))
    assert lengths[0] == pytest.approx(1.55)  # one node: 1 + head 0's top-1 accuracy


def test_depth_is_capped_by_heads_and_max_depth():
    acc = torch.tensor([[0.9, 0.05], [0.9, 0.05]])
    assert max(len(p) for p in calibrate_tree(acc, 6)) == 2  # two heads: never deeper than 2
    assert calibrate_tree(acc, 6, max_depth=1) == [[0], [1]]  # the budget cannot be filled at depth 1


def test_rank_accuracies_from_cumulative():
    cumulative = torch.tensor([[0.5, 0.7, 0.75]])
    torch.testing.assert_close(rank_accuracies(cumulative), torch.tensor([[0.5, 0.2, 0.05]]))


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError, match="rows summing to <= 1"):
        calibrate_tree(torch.tensor([[0.6, 0.7]]), 2)  # a cumulative table passed by mistake
    with pytest.raises(ValueError, match=r"path \[0, 0, 0\] needs 3 heads .* 2 heads x top-2"):
        expected_acceptance_length([[0], [0, 0], [0, 0, 0]], ACC)


def test_saved_tree_loads_back(tmp_path):
    paths = calibrate_tree(ACC, 4)
    file = save_tree_json(paths, tmp_path / "trees" / "calibrated.json", {"accuracies": ACC.tolist(), "budget": 4})
    assert load_tree(file).paths == tuple(tuple(p) for p in paths)
    assert load_tree(file).name == "calibrated"
    stored = json.loads(file.read_text())
    assert stored["metadata"] == {"accuracies": ACC.tolist(), "budget": 4}
    assert [p.name for p in file.parent.iterdir()] == ["calibrated.json"]  # no temp file left behind
    with pytest.raises(ValueError, match=r"has no parent path \[1\]"):
        save_tree_json([[0], [1, 0]], tmp_path / "bad.json")
    assert not (tmp_path / "bad.json").exists()
