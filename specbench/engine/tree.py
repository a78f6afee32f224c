"""Tree buffers: a static tree of top-k ranks turned into the tensors one tree step needs (loading trees by name or
file: specbench/medusa/trees.py).

A tree is a list of paths of top-k ranks under an implicit root (the target's own next token):
``[0, 1]`` is head 0's best candidate followed by head 1's second best (docs/tree_buffers.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import torch

from specbench.engine.draft import Draft

@dataclass(frozen=True)
class TreeBuffers:
    """Everything a tree step needs, for N nodes; node i (1-based, verify-input index) is ``paths[i - 1]``."""

    paths: tuple[tuple[int, ...], ...]  # sorted by (length, ranks)
    tree_mask: torch.Tensor  # (N + 1, N + 1) bool: identity + root column + ancestors
    depths: torch.Tensor  # (N + 1,) int64 depth = position offset from the root; root 0
    parents: torch.Tensor  # (N,) int64 verify-input index of each node's parent (0 = root), as in Draft
    head_indices: torch.Tensor  # (N,) int64 head that drafts each node: depth - 1
    ranks: torch.Tensor  # (N,) int64 top-k rank of each node's token in its head's list
    candidate_indices: torch.Tensor  # (N,) int64 into the flattened (max_depth, top_k) top-k table
    retrieve_indices: torch.Tensor  # (num_leaves, max_depth + 1) int64 root-first paths to leaves, -1 padded
    top_k: int  # candidates each head must supply: the largest rank used, plus one (a number a compiled step reads)
    name: str | None = None

    @property
    def num_nodes(self) -> int:
        return len(self.paths)

    @property
    def max_depth(self) -> int:
        return max((len(p) for p in self.paths), default=0)

    @property
    def is_chain(self) -> bool:
        """A tree of one path per depth (sorted by length, node i's parent is node i - 1)."""
        return [len(p) for p in self.paths] == list(range(1, self.num_nodes + 1))

    @classmethod
    def from_paths(cls, paths: Sequence[Sequence[int]], name: str | None = None) -> "TreeBuffers":
        where = f"Medusa tree {name!r}" if name else "Medusa tree"
        ordered = _validated_paths(paths, where)
        index = {path: i + 1 for i, path in enumerate(ordered)}  # verify-input index of each node
        parents = torch.tensor([index.get(p[:-1], 0) for p in ordered], dtype=torch.long)  # (N,)
        # the mask and depths are Draft's, so tree steps and proposer drafts can never disagree
        shape = Draft(tokens=torch.zeros_like(parents), parents=parents)
        depths = shape.depths()  # (N + 1,)
        top_k = max((max(p) for p in ordered), default=-1) + 1
        ranks = torch.tensor([p[-1] for p in ordered], dtype=torch.long)  # (N,)
        head_indices = depths[1:] - 1  # (N,)
        max_depth = int(depths.max())
        inner = {p[:-1] for p in ordered}
        leaves = [p for p in ordered if p not in inner]
        retrieve = torch.full((len(leaves), max_depth + 1), -1, dtype=torch.long)  # (L, D + 1)
        for row, leaf in enumerate(leaves):
            retrieve[row, : len(leaf) + 1] = torch.tensor([0] + [index[leaf[:d]] for d in range(1, len(leaf) + 1)])
        return cls(
            paths=ordered,
            tree_mask=shape.tree_mask(),
            depths=depths,
            parents=parents,
            head_indices=head_indices,
            ranks=ranks,
            candidate_indices=head_indices * top_k + ranks,
            retrieve_indices=retrieve,
            top_k=top_k,
            name=name,
        )

    def draft(self, topk_tokens: torch.Tensor) -> Draft:
        """Place per-head candidates ``(num_heads >= max_depth, k >= top_k)`` (best first) on the tree."""
        heads, k = topk_tokens.shape
        if heads < self.max_depth or k < self.top_k:
            raise ValueError(
                f"{self._label()} needs top-{self.top_k} candidates from {self.max_depth} heads, got a "
                f"({heads}, {k}) table"
            )
        return Draft(
            tokens=self.place(topk_tokens).long(),
            parents=self.parents.to(topk_tokens.device),
            precomputed_depths=self.depths,
            precomputed_tree_mask=self.tree_mask,
            precomputed_is_chain=self.is_chain,
            precomputed_depth=self.max_depth,
        )

    def place(self, topk_tokens: torch.Tensor) -> torch.Tensor:
        """``(..., heads, k)`` per-head candidates (best first) -> ``(..., N)`` each node's token, for any leading dims
        (one draft, or every slot's)."""
        table = topk_tokens[..., : self.max_depth, : self.top_k].flatten(-2)  # (..., max_depth * top_k)
        return table[..., self.candidate_indices.to(table.device)]  # (..., N)

    def to(self, device: torch.device | str) -> "TreeBuffers":
        tensors = ("tree_mask", "depths", "parents", "head_indices", "ranks", "candidate_indices", "retrieve_indices")
        return replace(self, **{field: getattr(self, field).to(device) for field in tensors})

    def _label(self) -> str:
        return f"Medusa tree {self.name!r}" if self.name else "Medusa tree"


def _validated_paths(paths: Sequence[Sequence[int]], where: str) -> tuple[tuple[int, ...], ...]:
    if isinstance(paths, (str, bytes)) or not isinstance(paths, Sequence) or not paths:
        raise ValueError(f"{where}: expected a non-empty list of paths (lists of top-k ranks), got {paths!r}")
    seen: set[tuple[int, ...]] = set()
    for path in paths:
        if isinstance(path, (str, bytes)) or not isinstance(path, Sequence) or not path:
            raise ValueError(f"{where}: every path must be a non-empty list of top-k ranks, got {path!r}")
        if not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in path):
            raise ValueError(f"{where}: path {list(path)} must hold integer ranks >= 0")
        key = tuple(path)
        if key in seen:
            raise ValueError(f"{where}: path {list(path)} appears twice; remove the duplicate")
        seen.add(key)
    for path in map(tuple, paths):  # the given order, so the first offending path is reported
        for depth in range(1, len(path)):
            if path[:depth] not in seen:
                raise ValueError(
                    f"{where}: path {list(path)} has no parent path {list(path[:depth])}; every prefix of a "
                    f"path must itself be a path: add {list(path[:depth])} or drop {list(path)}"
                )
    return tuple(sorted(seen, key=lambda p: (len(p), p)))
