"""Medusa tree buffers: mask, depths, parents, candidate gather, retrieve table, validation, loading."""

import json
import os
from pathlib import Path

import pytest
import torch

from specbench.engine.draft import Draft
from specbench.engine.tree import TreeBuffers
from specbench.medusa.trees import load_tree

# deliberately unsorted: from_paths must order by (length, ranks)
HAND_TREE = [[1], [0, 0, 0], [0], [0, 1], [1, 0], [0, 0]]
HAND_SORTED = ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))


def _prefix_mask(paths) -> torch.Tensor:
    """The mask from its definition: node i sees node j iff j's path is a prefix of i's (root = ())."""
    nodes = [()] + [tuple(p) for p in paths]
    return torch.tensor([[a[: len(b)] == b for b in nodes] for a in nodes])


def _check_buffers(tree: TreeBuffers) -> None:
    depths = torch.tensor([0] + [len(p) for p in tree.paths])
    assert torch.equal(tree.depths, depths)
    assert torch.equal(tree.tree_mask, _prefix_mask(tree.paths))
    assert torch.equal(tree.tree_mask.sum(dim=1), depths + 1)  # itself, its ancestors, the root
    draft = Draft(tokens=torch.zeros(tree.num_nodes, dtype=torch.long), parents=tree.parents)
    assert torch.equal(draft.tree_mask(), tree.tree_mask)
    assert torch.equal(draft.depths(), tree.depths)
    for i, path in enumerate(tree.paths, start=1):
        parent = tree.parents[i - 1]
        assert (tree.paths[parent - 1] if parent else ()) == path[:-1]
    assert torch.equal(tree.head_indices, depths[1:] - 1)
    assert tree.ranks.tolist() == [p[-1] for p in tree.paths]
    # one retrieve row per leaf: root first, then each ancestor's index, -1 padded
    inner = {p[:-1] for p in tree.paths}
    leaves = [p for p in tree.paths if p not in inner]
    assert tree.retrieve_indices.shape == (len(leaves), tree.max_depth + 1)
    for row, leaf in zip(tree.retrieve_indices.tolist(), leaves):
        nodes = [n for n in row if n >= 0]
        assert row[len(nodes) :] == [-1] * (len(row) - len(nodes))
        assert nodes[0] == 0 and tree.paths[nodes[-1] - 1] == leaf
        assert [tree.paths[n - 1] for n in nodes[1:]] == [leaf[:d] for d in range(1, len(leaf) + 1)]


def test_hand_built_tree_buffers():
    tree = TreeBuffers.from_paths(HAND_TREE)
    assert tree.paths == HAND_SORTED
    assert tree.parents.tolist() == [0, 0, 1, 1, 2, 3]  # derived by hand from HAND_SORTED
    assert (tree.num_nodes, tree.max_depth, tree.top_k) == (6, 3, 2)
    # leaves [0, 1], [1, 0], [0, 0, 0] are nodes 4, 5, 6
    assert tree.retrieve_indices.tolist() == [[0, 1, 4, -1], [0, 2, 5, -1], [0, 1, 3, 6]]
    _check_buffers(tree)


def test_candidate_gather_places_each_heads_ranked_tokens():
    tree = TreeBuffers.from_paths(HAND_TREE)
    # token 100 * head + rank makes every placement readable; an extra head and rank must be ignored
    table = 100 * torch.arange(4)[:, None] + torch.arange(3)[None, :]  # (4 heads, top-3)
    draft = tree.draft(table)
    assert draft.tokens.tolist() == [100 * (len(p) - 1) + p[-1] for p in tree.paths]
    assert torch.equal(draft.parents, tree.parents)
    with pytest.raises(ValueError, match=r"needs top-2 candidates from 3 heads, got a \(2, 3\) table"):
        tree.draft(table[:2])


def test_chain_tree_is_a_chain():
    tree = TreeBuffers.from_paths([[0], [0, 0], [0, 0, 0]])
    assert tree.draft(torch.tensor([[5], [6], [7]])).is_chain
    assert tree.retrieve_indices.tolist() == [[0, 1, 2, 3]]


@pytest.mark.parametrize(
    "paths, message",
    [
        ([[0], [0, 1, 2], [0, 1, 3]], r"path \[0, 1, 2\] has no parent path \[0, 1\]"),
        ([[0], [1], [0]], r"path \[0\] appears twice"),
        ([[0], [0, -1]], r"path \[0, -1\] must hold integer ranks >= 0"),
        ([[0], []], r"every path must be a non-empty list"),
        ([[0], [0.0]], r"must hold integer ranks"),
        ([], r"expected a non-empty list of paths"),
    ],
)
def test_invalid_trees_are_rejected_naming_the_path(paths, message):
    with pytest.raises(ValueError, match=message):
        TreeBuffers.from_paths(paths, name="bad")


def test_load_tree_from_list_file_and_names(tmp_path, monkeypatch):
    assert load_tree(HAND_TREE).paths == HAND_SORTED
    listed = tmp_path / "listed.json"
    listed.write_text(json.dumps(HAND_TREE))
    wrapped = tmp_path / "wrapped.json"
    wrapped.write_text(json.dumps({"paths": HAND_TREE, "metadata": {"why": "test"}}))
    assert load_tree(listed).paths == load_tree(str(wrapped)).paths == HAND_SORTED
    assert load_tree(wrapped).name == "wrapped"

    # a shipped reference tree (specbench.references) is found by name, and wins over a published one
    zoo = tmp_path / "zoo" / "gsm8k-tiny" / "trees"
    zoo.mkdir(parents=True)
    (zoo / "gsm8k-tiny-15.json").write_text(json.dumps({"paths": [[0], [0, 0], [1]]}))
    data_dir = tmp_path / "data"
    (data_dir / "medusa_trees").mkdir(parents=True)
    published = {"gsm8k-tiny-15": [[0]], "pub2": [[0], [1]]}
    (data_dir / "medusa_trees" / "medusa_choices.json").write_text(json.dumps(published))
    monkeypatch.setenv("SPECBENCH_ZOO_DIR", str(tmp_path / "zoo"))
    monkeypatch.setenv("SPECBENCH_DATA_DIR", str(data_dir))
    assert load_tree("gsm8k-tiny-15").num_nodes == 3
    assert load_tree("pub2").paths == ((0,), (1,))
    assert load_tree("pub2").name == "pub2"
    with pytest.raises(ValueError, match=r"unknown Medusa tree 'nope'.*gsm8k-tiny-63, gsm8k-tiny-15.*gsm8k-tiny-15, pub2"):
        load_tree("nope")
    monkeypatch.delenv("SPECBENCH_DATA_DIR")
    with pytest.raises(ValueError, match=r"unknown Medusa tree 'pub2'.*set SPECBENCH_DATA_DIR"):
        load_tree("pub2")
    with pytest.raises(FileNotFoundError, match="missing.json"):
        load_tree(tmp_path / "missing.json")
    (tmp_path / "odd.json").write_text(json.dumps({"trees": []}))
    with pytest.raises(ValueError, match=r"odd.json: expected a JSON list of paths or an object with key 'paths'"):
        load_tree(tmp_path / "odd.json")


def test_unknown_tree_lists_the_trees_the_package_ships(monkeypatch):
    """Finding: `--tree nope` listed "shipped trees (.../specbench/trees): none" while `specbench zoo
    list` showed two; the names now come from the one table both read."""
    monkeypatch.delenv("SPECBENCH_ZOO_DIR", raising=False)
    with pytest.raises(ValueError, match=r"shipped trees \(`specbench zoo list`\): gsm8k-tiny-63, gsm8k-tiny-15;"):
        load_tree("nope")


def _published_trees_file() -> Path:
    root = os.environ.get("SPECBENCH_DATA_DIR")
    if not root:
        pytest.skip("SPECBENCH_DATA_DIR is unset: the published Medusa trees (medusa_trees/medusa_choices.json) are not available")
    file = Path(root) / "medusa_trees" / "medusa_choices.json"
    if not file.is_file():
        pytest.skip(f"{file} does not exist: the published Medusa trees are not available")
    return file


def test_published_mc_sim_7b_63_tree():
    _published_trees_file()
    tree = load_tree("mc_sim_7b_63")
    assert tree.num_nodes == 63  # docs/tree_buffers.md: published trees have 63 nodes
    # 207 (docs/tree_buffers.md) counts the root's row (1) plus depth + 1 per node
    assert int(tree.tree_mask.sum()) == 207
    assert tree.retrieve_indices.shape == (42, 5)  # 42 leaves, depth 4 + the root
    _check_buffers(tree)


def test_every_published_tree_builds_consistent_buffers():
    names = json.loads(_published_trees_file().read_text())
    for name in names:
        _check_buffers(load_tree(name))


def test_tree_drafts_carry_their_shape_from_the_host():
    """A tree step must not read its chain-ness or depth back from device-resident parents: the tree knows
    them from its paths, and they agree with what Draft would compute from the parents."""
    tree = TreeBuffers.from_paths([[0], [1], [0, 0], [0, 1], [0, 0, 0]])
    draft = tree.draft(torch.zeros(3, 2, dtype=torch.long))
    assert (draft.precomputed_is_chain, draft.precomputed_depth) == (False, 3)
    recomputed = Draft(tokens=draft.tokens, parents=draft.parents)
    assert (recomputed.is_chain, recomputed.depth()) == (False, 3)
    chain_tree = TreeBuffers.from_paths([[0], [0, 0]])
    assert chain_tree.is_chain and chain_tree.draft(torch.zeros(2, 1, dtype=torch.long)).is_chain
    assert Draft.chain(torch.tensor([5, 6, 7])).precomputed_depth == 3


def test_chains_of_one_length_share_their_shape_tensors():
    """A chain's parents and depths depend on its length only: every chain of that length hands over the same
    tensors (as a static tree does), so StaticTarget, which remembers the depths it last wrote, writes them once."""
    first, second = Draft.chain(torch.tensor([5, 6, 7])), Draft.chain(torch.tensor([1, 2, 3]))
    assert first.depths() is second.depths() and first.parents is second.parents
    assert first.depths().tolist() == [0, 1, 2, 3] and first.parents.tolist() == [0, 1, 2]
    assert Draft.chain(torch.tensor([1, 2])).depths().tolist() == [0, 1, 2]  # another length, its own
    with torch.inference_mode():
        inside = Draft.chain(torch.tensor([4, 4, 4, 4, 4, 4, 4]))
    assert not inside.depths().is_inference()  # built under inference mode, still usable outside it
