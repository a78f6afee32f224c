"""The three EAGLE drafting rules over B slots at once, through a node expander: a top-1 chain, EAGLE-1's static
tree (each node's children are its own top-k ranks) and EAGLE-2's dynamic tree (top-k children of the best frontier
nodes by cumulative draft log-probability, then the best nodes overall) (docs/eagle.md#drafting).

Each rule is two parts (:class:`DraftingRule`): ``grow``, device ops only from the root's output and logits to the
drafts' tensors (every expansion and the selection between them, which one graph can capture), and ``shape``,
the per-slot :class:`Draft` objects over those tensors."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch

from specbench.eagle.top_k import vocab_top_k
from specbench.engine.draft import Draft, ancestor_mask
from specbench.engine.tree import TreeBuffers

# expand(tokens (B, W), features (B, W, H), depth, sees) -> (hidden (B, W, H), logits (B, W, V)): run the draft over
# W nodes of every slot at one depth, each reading its parent's output hidden state; sees (W, A) bool, or per slot
# (B, W, A), says whether node w sees the a-th node expanded so far in this draft (the W new ones are the last columns)
Expander = Callable[[torch.Tensor, torch.Tensor, int, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class DraftingRule:
    """``grow(root_hidden (B, H), root_logits (B, V), expand)`` -> the drafts' tensors, device ops only (no host
    read, no host-dependent branch: a CUDA graph replays it); ``shape(tensors)`` -> one :class:`Draft` per slot."""

    grow: Callable[[torch.Tensor, torch.Tensor, Expander], tuple[torch.Tensor, ...]]
    shape: Callable[[tuple[torch.Tensor, ...]], list[Draft]]

    def __call__(self, root_hidden: torch.Tensor, root_logits: torch.Tensor, expand: Expander) -> list[Draft]:
        return self.shape(self.grow(root_hidden, root_logits, expand))


def chain_rule(length: int) -> DraftingRule:
    """Per slot ``length`` greedy tokens, each the argmax of the draft run on the previous one."""
    return DraftingRule(partial(_grow_chain, length=length), lambda grown: [Draft.chain(row) for row in grown[0]])


def _grow_chain(root_hidden: torch.Tensor, root_logits: torch.Tensor, expand: Expander, *,
                length: int) -> tuple[torch.Tensor]:
    """``(B, K)`` tokens: ``root_hidden`` ``(B, H)`` and ``root_logits`` ``(B, V)`` predict depth 1."""
    tokens = [root_logits.argmax(dim=-1)]  # (B,) stays on the device
    hidden = root_hidden[:, None]  # (B, 1, H)
    for depth in range(1, length):
        sees = torch.ones(1, depth, dtype=torch.bool, device=root_hidden.device)  # every earlier chain node and itself
        hidden, logits = expand(tokens[-1][:, None], hidden, depth, sees)  # (B, 1, H), (B, 1, V)
        tokens.append(logits[:, 0].argmax(dim=-1))
    return (torch.stack(tokens, dim=1),)  # (B, K)


@dataclass(frozen=True)
class StaticTreePlan:
    """EAGLE-1 over a static tree: which nodes are expanded at each depth, and where every node's token comes from.

    Expanded nodes (those with children) are numbered ``e`` in node order, so depth by depth; row 0 of the
    candidate table is the root's top-k, row ``1 + e`` expanded node e's.
    """

    tree: TreeBuffers
    candidates: torch.Tensor  # (N,) index into the flattened (1 + E, top_k) table: parent row * top_k + rank
    parent_rows: torch.Tensor  # (E,) table row of each expanded node's parent (whose output it reads)
    levels: tuple[tuple[int, int], ...]  # per depth 1..max_depth-1: the expanded nodes [e_begin, e_end)
    sees: torch.Tensor  # (E, E) bool: expanded node e' is e or an ancestor of e
    expanded: torch.Tensor  # (E,) node index (0-based) of each expanded node

    @classmethod
    def from_tree(cls, tree: TreeBuffers) -> "StaticTreePlan":
        parents = tree.parents.cpu().tolist()  # verify-input index of each node's parent, 0 = root
        depths = tree.depths.cpu().tolist()[1:]  # (N,) of the nodes
        expanded = sorted({p - 1 for p in parents if p > 0})  # 0-based nodes with children
        row = {node: 1 + e for e, node in enumerate(expanded)}
        parent_row = [0 if p == 0 else row[p - 1] for p in parents]  # (N,)
        candidates = torch.tensor([r * tree.top_k + rank for r, rank in zip(parent_row, tree.ranks.cpu().tolist())])
        sees = torch.zeros(len(expanded), len(expanded), dtype=torch.bool)
        for e, node in enumerate(expanded):
            sees[e, e] = True
            if parents[node] > 0:
                sees[e] |= sees[row[parents[node] - 1] - 1]  # the parent's row: its ancestors, earlier in order
        levels = []
        for depth in range(1, tree.max_depth):
            at = [e for e, node in enumerate(expanded) if depths[node] == depth]
            levels.append((at[0], at[-1] + 1))  # every depth below the deepest has an expanded node
        return cls(
            tree=tree, candidates=candidates, parent_rows=torch.tensor([parent_row[n] for n in expanded], dtype=torch.long),
            levels=tuple(levels), sees=sees, expanded=torch.tensor(expanded, dtype=torch.long),
        )

    @property
    def num_expanded(self) -> int:
        return self.expanded.numel()

    def to(self, device) -> "StaticTreePlan":
        return StaticTreePlan(self.tree.to(device), self.candidates.to(device), self.parent_rows.to(device), self.levels,
                              self.sees.to(device), self.expanded.to(device))


def static_tree_rule(plan: StaticTreePlan) -> DraftingRule:
    """EAGLE-1: depth by depth, run the draft over every slot's expanded nodes of that depth and place each child on
    its rank of its parent's own top-k; every slot's draft has the tree's shape."""
    tree, is_chain, depth = plan.tree, plan.tree.is_chain, plan.tree.max_depth  # host facts of the tree, read once
    return DraftingRule(partial(_grow_static_tree, plan=plan), lambda grown: [
        Draft(tokens=row, parents=tree.parents, precomputed_depths=tree.depths, precomputed_tree_mask=tree.tree_mask,
              precomputed_is_chain=is_chain, precomputed_depth=depth) for row in grown[0]])


def _grow_static_tree(root_hidden: torch.Tensor, root_logits: torch.Tensor, expand: Expander, *,
                      plan: StaticTreePlan) -> tuple[torch.Tensor]:
    """``(B, N)`` every slot's node tokens, in the tree's node order."""
    k, rows = plan.tree.top_k, 1 + plan.num_expanded
    batch = root_hidden.shape[0]
    table = torch.empty(batch, rows, k, dtype=torch.long, device=root_hidden.device)  # (B, 1 + E, k)
    table[:, 0] = vocab_top_k(root_logits, k).indices
    outputs = root_hidden.new_empty(batch, rows, root_hidden.shape[-1])  # (B, 1 + E, H) row r: node's output
    outputs[:, 0] = root_hidden
    for depth, (begin, end) in enumerate(plan.levels, start=1):
        nodes = plan.expanded[begin:end]  # (W,)
        tokens = table.view(batch, -1)[:, plan.candidates[nodes]]  # (B, W) their parents' rows are filled
        features = outputs[:, plan.parent_rows[begin:end]]  # (B, W, H)
        hidden, logits = expand(tokens, features, depth, plan.sees[begin:end, :end])
        outputs[:, 1 + begin: 1 + end] = hidden
        table[:, 1 + begin: 1 + end] = vocab_top_k(logits, k).indices  # (B, W, k)
    return (table.view(batch, -1)[:, plan.candidates],)  # (B, N)


def dynamic_pool_size(top_k: int, depth: int) -> int:
    """Candidates EAGLE-2 scores: top_k at depth 1, then top_k x top_k at each further depth."""
    return top_k + (depth - 1) * top_k * top_k


def dynamic_tree_rule(*, top_k: int, depth: int, total_tokens: int) -> DraftingRule:
    """EAGLE-2, per slot: expand the top_k best frontier nodes by cumulative draft log-probability, top_k children
    each, up to ``depth``; keep the ``total_tokens`` best of every candidate scored.

    Every slot's frontier and selection are its row of ``(B, ...)`` tensors, and each draft's shape comes built on
    the device, with no host read (docs/eagle.md#host-reads-per-step): each candidate's depth is its level, the
    ancestor mask is the closure of the kept parents (at most ``depth`` levels), and the draft verifies as a tree;
    only its longest path (the deepest kept level) is left to the step's one readback (bounded by ``depth``)."""
    # one path iff top_k is 1; never one when more nodes are kept than there are levels; else only the parents
    # tell (a host read, kept exact for sampling's chain rule: a rare setting, total_tokens <= depth)
    chain = True if top_k == 1 else (False if total_tokens > depth else None)

    def shape(grown: tuple[torch.Tensor, ...]) -> list[Draft]:
        ids, parents, depths, masks = grown  # (B, N), (B, N), (B, N + 1), (B, N + 1, N + 1)
        return [Draft(tokens=ids[b], parents=parents[b], precomputed_depths=depths[b], precomputed_tree_mask=masks[b],
                      precomputed_is_chain=chain, precomputed_depth=total_tokens if top_k == 1 else None,
                      depth_bound=min(depth, total_tokens))
                for b in range(ids.shape[0])]

    return DraftingRule(partial(_grow_dynamic_tree, top_k=top_k, depth=depth, total_tokens=total_tokens), shape)


def _grow_dynamic_tree(root_hidden: torch.Tensor, root_logits: torch.Tensor, expand: Expander, *, top_k: int,
                       depth: int, total_tokens: int) -> tuple[torch.Tensor, ...]:
    """Every slot's kept tokens ``(B, N)``, parents ``(B, N)``, depths ``(B, N + 1)`` and ancestor mask."""
    device, (batch, k) = root_hidden.device, (root_hidden.shape[0], top_k)
    scores, tokens = vocab_top_k(torch.log_softmax(root_logits.float(), dim=-1), k)  # (B, k) each
    all_scores, all_tokens = [scores], [tokens]
    all_parents = [torch.full((batch, k), -1, dtype=torch.long, device=device)]
    all_levels = [torch.ones(k, dtype=torch.long, device=device)]  # each candidate's depth: its level
    frontier = torch.arange(k, device=device).expand(batch, k)  # (B, k) candidate index of each frontier node
    features = root_hidden[:, None].expand(batch, k, root_hidden.shape[-1])  # (B, k, H) each reads its parent's output
    itself = torch.eye(k, dtype=torch.bool, device=device).expand(batch, k, k)  # (B, k, k) each new node sees itself
    sees, offset = itself, k  # (B, k, k) over the nodes expanded so far
    for level in range(1, depth):
        hidden, logits = expand(tokens, features, level, sees)  # (B, k, H), (B, k, V)
        child_logp, child_tokens = vocab_top_k(torch.log_softmax(logits.float(), dim=-1), k)  # (B, k, k) each
        child_scores = (scores[:, :, None] + child_logp.clamp(max=0.0)).flatten(1)  # (B, k * k) never above the parent
        all_scores.append(child_scores)
        all_tokens.append(child_tokens.flatten(1))
        all_parents.append(frontier[:, :, None].expand(batch, k, k).flatten(1))  # (B, k * k) each child's parent
        all_levels.append(torch.full((k * k,), level + 1, dtype=torch.long, device=device))
        scores, best = child_scores.topk(k, dim=-1)  # (B, k) the next frontier
        source = best // k  # (B, k) the frontier row each comes from
        frontier, tokens = offset + best, child_tokens.flatten(1).gather(1, best)
        features = hidden.gather(1, source[:, :, None].expand(-1, -1, hidden.shape[-1]))  # (B, k, H)
        sees = torch.cat([sees.gather(1, source[:, :, None].expand(-1, -1, sees.shape[-1])), itself], dim=2)
        offset += k * k
    keep, parents = select_nodes(torch.cat(all_scores, dim=1), torch.cat(all_parents, dim=1), total_tokens)
    levels = torch.cat(all_levels)[keep]  # (B, N)
    depths = torch.cat([levels.new_zeros(batch, 1), levels], dim=1)  # (B, N + 1)
    masks = ancestor_mask(parents, depth)  # (B, N + 1, N + 1)
    ids = torch.cat(all_tokens, dim=1).gather(1, keep)  # (B, N)
    return ids, parents, depths, masks


def select_nodes(scores: torch.Tensor, parents: torch.Tensor, total_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the ``total_tokens`` best candidates by cumulative log-probability, in candidate order ``(B, N)``,
    and each one's verify-input parent index (0 = root) ``(B, N)``.

    ``scores`` ``(B, C)``; ``parents`` ``(B, C)`` each candidate's parent candidate (-1 = the root). A child's score
    never exceeds its parent's (log-probabilities are <= 0) and a parent precedes its children, so a stable
    descending sort ranks every parent before its children: the kept set holds every kept node's ancestors.
    """
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :total_tokens]
    keep = order.sort(dim=1).values  # (B, N) candidate order: parents before children
    parent = parents.gather(1, keep)  # (B, N)
    index = torch.searchsorted(keep, parent.clamp(min=0)) + 1  # (B, N) verify-input index of a kept parent
    return keep, torch.where(parent < 0, torch.zeros_like(index), index)
