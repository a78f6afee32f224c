"""Greedy verification computed on the logits' device, with one device-to-host transfer per step."""

from __future__ import annotations

import torch

from specbench.engine.draft import Draft


def greedy_on_device(
    draft: Draft, verify_ids: torch.Tensor, logits: torch.Tensor, *, is_chain: bool | None = None
) -> tuple[list[int], int, list[int]]:
    """Greedy verification (docs/verification.md) of ``verify_ids = [root, *draft.tokens]`` on the device.

    Returns ``(accepted_nodes, next_token, emitted)``, exactly what ``verify_greedy`` and the decode loop
    compute: the accepted path root first, the target's token after it, and the tokens the step emits
    (the accepted draft tokens, then ``next_token``). Every tensor op stays on the device; the only
    device-to-host transfer is one ``.tolist()`` of a packed int64 tensor. ``is_chain`` may pass the
    caller's ``draft.is_chain`` so it is not recomputed; a tree reads its ancestor matrix from
    ``draft.tree_mask()``, which the draft computes once (a static tree's buffers hold it precomputed).
    """
    n = len(draft)
    device = logits.device
    verify_ids = verify_ids.to(device)  # (N + 1,) root first
    target = logits.argmax(dim=-1)  # (N + 1,) the target's token after each node
    parents = draft.parents.to(device)  # (N,)
    draft_ok = verify_ids[1:] == target[parents]  # (N,) draft token == argmax of its parent's row
    node_ok = torch.cat([torch.ones(1, dtype=torch.bool, device=device), draft_ok])  # (N + 1,) root is ok
    chain = draft.is_chain if is_chain is None else is_chain
    if chain:
        on_path = node_ok.long().cumprod(dim=0)  # (N + 1,) 1 up to the first mismatch
        best = on_path.sum(dim=0, keepdim=True) - 1  # (1,) a chain node's index is its depth
        packed = torch.cat([best, target[best], verify_ids])  # (N + 3,)
        values = packed.tolist()
        next_token = values[1]
        accepted = list(range(values[0] + 1))
    else:
        ancestors = draft.tree_mask().to(device)  # (N + 1, N + 1) bool: row i = i and its ancestors
        # a node is on an accepted path iff it and all its ancestors are ok
        on_path = ~(ancestors & ~node_ok[None, :]).any(dim=1)  # (N + 1,)
        depth = ancestors.sum(dim=1) - 1  # (N + 1,) ancestors + self, less self
        index = torch.arange(n + 1, device=device)  # (N + 1,)
        # unique score: deeper wins, then the earlier index (verification._longest_path); off-path 0
        score = on_path.long() * ((depth + 1) * (n + 1) - index)  # (N + 1,) root scores n + 1 > 0
        best = score.argmax(dim=0, keepdim=True)  # (1,)
        path_row = ancestors[best[0]].long()  # (N + 1,) 1 on the path from the root to best
        packed = torch.cat([best, target[best], verify_ids, path_row])  # (2N + 4,)
        values = packed.tolist()
        next_token = values[1]
        row = values[n + 3 :]
        accepted = [node for node in range(n + 1) if row[node]]  # ascending: parents precede children
    host_ids = values[2 : n + 3]
    emitted = [host_ids[node] for node in accepted[1:]] + [next_token]
    return accepted, next_token, emitted


__all__ = ["greedy_on_device"]
