"""Medusa tree calibration: grow a static tree from measured per-head top-k accuracies by greedy
expected-acceptance gain, and save it where :func:`specbench.medusa.trees.load_tree` finds it.

Model (Medusa's): head i's rank-r candidate is the true token with probability ``acc[i, r]``,
independently across heads. A node's value is the product of the accuracies along its path, the
probability that the whole path is accepted; expected accepted tokens = sum of node values.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

import torch

from specbench.io.atomic_write import write_text_atomic
from specbench.engine.tree import TreeBuffers


def rank_accuracies(cumulative: torch.Tensor) -> torch.Tensor:
    """(num_heads, k) cumulative top-k accuracy -> (num_heads, k) probability of each exact rank."""
    return torch.diff(cumulative, dim=1, prepend=torch.zeros_like(cumulative[:, :1]))


def _check_accuracies(accuracies: torch.Tensor) -> torch.Tensor:
    acc = torch.as_tensor(accuracies, dtype=torch.float64)
    if acc.dim() != 2 or not bool(((acc >= 0) & (acc <= 1)).all()) or bool((acc.sum(dim=1) > 1 + 1e-6).any()):
        raise ValueError(
            "accuracies must be a (num_heads, k) table of per-rank probabilities in [0, 1] with rows summing "
            f"to <= 1 (non-cumulative; see rank_accuracies), got {accuracies!r}"
        )
    return acc


def _path_value(path: Sequence[int], acc: torch.Tensor) -> float:
    if len(path) > acc.shape[0] or max(path) >= acc.shape[1]:
        raise ValueError(
            f"path {list(path)} needs {len(path)} heads and rank {max(path)}, but the accuracy table is "
            f"{acc.shape[0]} heads x top-{acc.shape[1]}"
        )
    value = 1.0
    for head, rank in enumerate(path):
        value *= float(acc[head, rank])
    return value


def expected_acceptance_length(paths: Sequence[Sequence[int]], accuracies: torch.Tensor) -> float:
    """1 + the expected accepted draft tokens per step: comparable to a measured mean acceptance length."""
    acc = _check_accuracies(accuracies)
    return 1.0 + sum(_path_value(path, acc) for path in TreeBuffers.from_paths(paths).paths)


def calibrate_tree(accuracies: torch.Tensor, num_nodes: int, max_depth: int | None = None) -> list[list[int]]:
    """Grow a tree to ``num_nodes`` nodes, adding each time the frontier node of largest value.

    Ties go to the shorter, then lexicographically smaller path, so the result is deterministic.
    Depth is capped by the number of heads (rows of ``accuracies``) and by ``max_depth``.
    """
    acc = _check_accuracies(accuracies)
    num_heads, top_k = acc.shape
    depth_limit = num_heads if max_depth is None else min(max_depth, num_heads)
    if num_nodes < 1:
        raise ValueError(f"num_nodes must be >= 1, got {num_nodes}")
    frontier = {(rank,): float(acc[0, rank]) for rank in range(top_k)}
    tree: list[tuple[int, ...]] = []
    while len(tree) < num_nodes and frontier:
        best = min(frontier, key=lambda path: (-frontier[path], len(path), path))
        value = frontier.pop(best)
        tree.append(best)
        if len(best) < depth_limit:
            for rank in range(top_k):
                frontier[best + (rank,)] = value * float(acc[len(best), rank])
    return [list(path) for path in sorted(tree, key=lambda p: (len(p), p))]


def save_tree_json(paths: Sequence[Sequence[int]], file: str | os.PathLike, metadata: dict | None = None) -> Path:
    """Write ``{"paths": [...], "metadata": {...}}`` atomically; returns the path."""
    tree = TreeBuffers.from_paths(paths)  # validates before anything is written
    file = Path(file)
    file.parent.mkdir(parents=True, exist_ok=True)
    payload = {"paths": [list(p) for p in tree.paths], "metadata": dict(metadata or {})}
    write_text_atomic(file, json.dumps(payload, indent=1) + "\n")
    return file
