"""The three EAGLE drafting rules over a node expander: a top-1 chain, EAGLE-1's static tree (each node's children
are its own top-k ranks) and EAGLE-2's dynamic tree (top-k children of the best frontier nodes by cumulative draft
log-probability, then the best nodes overall) (docs/eagle.md#drafting)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from specbench.engine.draft import Draft, ancestor_mask
from specbench.engine.tree import TreeBuffers

# expand(tokens (W,), features (W, H), depth, ancestors (W, A) bool) -> (hidden (W, H), logits (W, V)):
# run the draft over W nodes at one depth, each reading its parent's output hidden state; ancestors[w, a] says
# whether node w sees the a-th node expanded so far in this draft (the W new ones are the last columns)
Expander = Callable[[torch.Tensor, torch.Tensor, int, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def draft_chain(root_hidden: torch.Tensor, root_logits: torch.Tensor, expand: Expander, length: int) -> Draft:
    """``length`` greedy tokens, each the argmax of the draft run on the previous one."""
    tokens = [root_logits.argmax()]  # 0-d, stays on the device
    hidden = root_hidden[None]  # (1, H)
    for depth in range(1, length):
        sees = torch.ones(1, depth, dtype=torch.bool, device=root_hidden.device)  # every earlier chain node and itself
        hidden, logits = expand(tokens[-1].reshape(1), hidden, depth, sees)  # (1, H), (1, V)
        tokens.append(logits[0].argmax())
    return Draft.chain(torch.stack(tokens))  # (K,)


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


def draft_static_tree(plan: StaticTreePlan, root_hidden: torch.Tensor, root_logits: torch.Tensor, expand: Expander) -> Draft:
    """EAGLE-1: depth by depth, run the draft over the expanded nodes of that depth and place each child on its
    rank of its parent's own top-k."""
    tree, k = plan.tree, plan.tree.top_k
    table = torch.empty(1 + plan.num_expanded, k, dtype=torch.long, device=root_hidden.device)  # (1 + E, k)
    table[0] = root_logits.topk(k).indices
    outputs = root_hidden.new_empty(1 + plan.num_expanded, root_hidden.shape[-1])  # (1 + E, H) row r: node's output
    outputs[0] = root_hidden
    for depth, (begin, end) in enumerate(plan.levels, start=1):
        nodes = plan.expanded[begin:end]  # (W,)
        tokens = table.view(-1)[plan.candidates[nodes]]  # (W,) their parents' rows are filled
        hidden, logits = expand(tokens, outputs[plan.parent_rows[begin:end]], depth, plan.sees[begin:end, :end])
        outputs[1 + begin: 1 + end] = hidden
        table[1 + begin: 1 + end] = logits.topk(k, dim=-1).indices  # (W, k)
    return Draft(
        tokens=table.view(-1)[plan.candidates],  # (N,)
        parents=tree.parents,
        precomputed_depths=tree.depths,
        precomputed_tree_mask=tree.tree_mask,
        precomputed_is_chain=tree.is_chain,
        precomputed_depth=tree.max_depth,
    )


def dynamic_pool_size(top_k: int, depth: int) -> int:
    """Candidates EAGLE-2 scores: top_k at depth 1, then top_k x top_k at each further depth."""
    return top_k + (depth - 1) * top_k * top_k


def select_nodes(scores: torch.Tensor, parents: torch.Tensor, total_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``total_tokens`` best candidates by cumulative log-probability, in candidate order, and each one's
    verify-input parent index (0 = root).

    ``scores`` ``(C,)``; ``parents`` ``(C,)`` each candidate's parent candidate (-1 = the root). A child's score
    never exceeds its parent's (log-probabilities are <= 0) and a parent precedes its children, so a stable
    descending sort ranks every parent before its children: the kept set holds every kept node's ancestors.
    """
    order = torch.sort(scores, descending=True, stable=True).indices[:total_tokens]
    keep = order.sort().values  # (N,) candidate order: parents before children
    parent = parents[keep]  # (N,)
    index = torch.searchsorted(keep, parent.clamp(min=0)) + 1  # (N,) verify-input index of a kept parent
    return keep, torch.where(parent < 0, torch.zeros_like(index), index)


def draft_dynamic_tree(root_hidden: torch.Tensor, root_logits: torch.Tensor, expand: Expander, *, top_k: int,
                       depth: int, total_tokens: int) -> Draft:
    """EAGLE-2: expand the top_k best frontier nodes by cumulative draft log-probability, top_k children each, up
    to ``depth``; keep the ``total_tokens`` best of every candidate scored.

    The draft's shape comes built on the device, with no host read (docs/eagle.md#host-reads-per-step): each
    candidate's depth is its level, the ancestor mask is the closure of the kept parents (at most ``depth``
    levels), and the draft verifies as a tree; only its longest path (the deepest kept level) is left to the
    step's one readback, which the device verification fills in."""
    device = root_hidden.device
    scores, tokens = torch.log_softmax(root_logits.float(), dim=-1).topk(top_k)  # (k,) each
    all_scores, all_tokens = [scores], [tokens]
    all_parents = [torch.full((top_k,), -1, dtype=torch.long, device=device)]
    all_levels = [torch.ones(top_k, dtype=torch.long, device=device)]  # each candidate's depth: its level
    frontier = torch.arange(top_k, device=device)  # (k,) candidate index of each frontier node
    features = root_hidden.expand(top_k, -1)  # (k, H) each frontier node reads its parent's output
    itself = torch.eye(top_k, dtype=torch.bool, device=device)  # (k, k) each new frontier node sees itself
    sees = itself  # (k, k) over the nodes expanded so far
    offset = top_k
    for level in range(1, depth):
        hidden, logits = expand(tokens, features, level, sees)  # (k, H), (k, V)
        child_logp, child_tokens = torch.log_softmax(logits.float(), dim=-1).topk(top_k, dim=-1)  # (k, k) each
        child_scores = (scores[:, None] + child_logp.clamp(max=0.0)).flatten()  # (k * k,) cumulative, never above the parent
        all_scores.append(child_scores)
        all_tokens.append(child_tokens.flatten())
        all_parents.append(frontier.repeat_interleave(top_k))
        all_levels.append(torch.full((top_k * top_k,), level + 1, dtype=torch.long, device=device))
        scores, best = child_scores.topk(top_k)  # (k,) the next frontier
        source = best // top_k  # (k,) the frontier row each comes from
        frontier, tokens, features = offset + best, child_tokens.flatten()[best], hidden[source]
        sees = torch.cat([sees[source], itself], dim=1)  # (k, k * (level + 1))
        offset += top_k * top_k
    keep, parents = select_nodes(torch.cat(all_scores), torch.cat(all_parents), total_tokens)
    depths = torch.cat([torch.zeros(1, dtype=torch.long, device=device), torch.cat(all_levels)[keep]])  # (N + 1,)
    # one path iff top_k is 1; never one when more nodes are kept than there are levels; else only the parents
    # tell (a host read, kept exact for sampling's chain rule: a rare setting, total_tokens <= depth)
    chain = True if top_k == 1 else (False if total_tokens > depth else None)
    return Draft(tokens=torch.cat(all_tokens)[keep], parents=parents, precomputed_depths=depths,
                 precomputed_tree_mask=ancestor_mask(parents, depth), precomputed_is_chain=chain,
                 precomputed_depth=total_tokens if top_k == 1 else None)
