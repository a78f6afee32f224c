"""Greedy verification, and rejection sampling of chains, computed on the logits' device, with one
device-to-host transfer per step."""

from __future__ import annotations

import torch

from specbench.engine.draft import Draft
from specbench.engine.transfers import tensor_to_device
from specbench.engine.sampling import SamplingParams, target_probs


def greedy_on_device(
    draft: Draft, verify_ids: torch.Tensor, logits: torch.Tensor, *, is_chain: bool | None = None
) -> tuple[list[int], int, list[int]]:
    """Greedy verification (docs/verification.md) of ``verify_ids = [root, *draft.tokens]`` on the device.

    Returns ``(accepted_nodes, next_token, emitted)``, exactly what ``verify_greedy`` and the decode loop
    compute: the accepted path root first, the target's token after it, and the tokens the step emits
    (the accepted draft tokens, then ``next_token``). Every tensor op stays on the device; the only
    device-to-host transfer is one ``.tolist()`` of a packed int64 tensor. ``is_chain`` overrides
    ``draft.is_chain`` (a chain-shaped tree verifies alike either way); True asserts the parents are 0..N-1, and
    they are not read. A tree reads its ancestor matrix from
    ``draft.tree_mask()``, which the draft computes once (a static tree's buffers hold it precomputed). A tree
    draft whose longest path is not known on the host yet (EAGLE-2's) gets it from the same readback, so the
    decode loop's ``draft.depth()`` costs no second one.
    """
    n = len(draft)
    device = logits.device
    verify_ids = verify_ids.to(device)  # (N + 1,) root first
    target = logits.argmax(dim=-1)  # (N + 1,) the target's token after each node
    chain = draft.is_chain if is_chain is None else is_chain
    # a chain's parents are 0..N-1: not uploaded; a host-held tree's go up pinned (a pageable copy waits for the stream)
    parent_target = target[:n] if chain else target[tensor_to_device(draft.parents, device)]  # (N,) argmax of each parent's row
    draft_ok = verify_ids[1:] == parent_target  # (N,)
    node_ok = torch.cat([torch.ones(1, dtype=torch.bool, device=device), draft_ok])  # (N + 1,) root is ok
    if chain:
        on_path = node_ok.long().cumprod(dim=0)  # (N + 1,) 1 up to the first mismatch
        best = on_path.sum(dim=0, keepdim=True) - 1  # (1,) a chain node's index is its depth
        packed = torch.cat([best, target[best], verify_ids])  # (N + 3,)
        values = packed.tolist()
        next_token = values[1]
        accepted = list(range(values[0] + 1))
    else:
        ancestors = tensor_to_device(draft.tree_mask(), device)  # (N + 1, N + 1) bool: row i = i and its ancestors
        # a node is on an accepted path iff it and all its ancestors are ok
        on_path = ~(ancestors & ~node_ok[None, :]).any(dim=1)  # (N + 1,)
        depth = ancestors.sum(dim=1) - 1  # (N + 1,) ancestors + self, less self
        index = torch.arange(n + 1, device=device)  # (N + 1,)
        # unique score: deeper wins, then the earlier index (verification._longest_path); off-path 0
        score = on_path.long() * ((depth + 1) * (n + 1) - index)  # (N + 1,) root scores n + 1 > 0
        best = score.argmax(dim=0, keepdim=True)  # (1,)
        path_row = ancestors[best[0]].long()  # (N + 1,) 1 on the path from the root to best
        parts = [best, target[best], verify_ids, path_row]
        learn_depth = draft.precomputed_depth is None  # (EAGLE-2) the longest path rides on the same readback
        if learn_depth:
            parts.append(depth.max().reshape(1))
        packed = torch.cat(parts)  # (2N + 4,) or (2N + 5,)
        values = packed.tolist()
        next_token = values[1]
        row = values[n + 3 : 2 * n + 4]
        if learn_depth:
            draft.precomputed_depth = values[-1]  # what Draft.depth() would read: the deepest node's depth
        accepted = [node for node in range(n + 1) if row[node]]  # ascending: parents precede children
    host_ids = values[2 : n + 3]
    emitted = [host_ids[node] for node in accepted[1:]] + [next_token]
    return accepted, next_token, emitted


def rejection_chain_on_device(
    draft: Draft,
    verify_ids: torch.Tensor,
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> tuple[list[int], int, list[int]]:
    """Lossless rejection sampling (docs/verification.md) of a chain ``verify_ids = [root, x_1..x_K]``.

    Vectorised over the chain: the ``K + 1`` uniforms are drawn in one call from ``generator``; draft
    token ``x_i`` is judged against row ``i - 1`` (its parent's) and accepted iff ``u_i * q_i(x_i) <
    p_{i-1}(x_i)`` (a point mass, no ``draft_probs``: ``u_i < p_{i-1}(x_i)``) and every earlier one was.
    At the first rejection, node ``j``, the next token is drawn from ``normalize(max(p_{j-1} - q_j,
    0))`` (a point mass: ``p_{j-1}`` without ``x_j``; ``p_{j-1}`` itself if that has no mass), after a
    fully accepted chain from ``p_K`` (the bonus token), by inverting the CDF at ``u_{K+1}``. The
    output is distributed exactly as the target's, as with ``verify_rejection``; the random numbers
    are consumed differently, so the tokens of one seed differ from it. Returns ``(accepted_nodes,
    next_token, emitted)`` like :func:`greedy_on_device`, after one ``.tolist()`` of a packed tensor.
    """
    k = len(draft)
    device = logits.device
    verify_ids = verify_ids.to(device)  # (K + 1,) root first
    probs = target_probs(logits, params)  # (K + 1, V) row i: after node i
    uniforms = torch.rand(k + 1, generator=generator, device=device, dtype=probs.dtype)  # (K + 1,)
    tokens = verify_ids[1:]  # (K,)
    parent_rows = probs[:k]  # (K, V) row i - 1 judges x_i
    p_x = parent_rows.gather(1, tokens[:, None]).squeeze(1)  # (K,) p_{i-1}(x_i)
    if draft.draft_probs is not None:
        q = draft.draft_probs.to(probs)  # (K, V)
        q_x = q.gather(1, tokens[:, None]).squeeze(1)  # (K,)
        accept = uniforms[:k] * q_x < p_x  # (K,) u < p/q without dividing by 0
        residual = (parent_rows - q).clamp_min(0.0)  # (K, V)
    else:
        accept = uniforms[:k] < p_x  # (K,)
        residual = parent_rows.scatter(1, tokens[:, None], 0.0)  # (K, V) p_{i-1} without x_i
    mass = residual.sum(dim=1, keepdim=True)  # (K, 1)
    residual = torch.where(mass > 0, residual, parent_rows)  # no residual mass: p is left unchanged
    rows = torch.cat([residual, probs[k:]])  # (K + 1, V) row j: where the next token comes from after j accepted
    accepted = accept.long().cumprod(dim=0).sum(dim=0, keepdim=True)  # (1,) accepted draft tokens
    dist = rows[accepted[0]]  # (V,) unnormalised
    cdf = dist.cumsum(dim=0)  # (V,)
    index = torch.searchsorted(cdf, (uniforms[k] * cdf[-1]).reshape(1), right=True)  # (1,)
    vocab = torch.arange(dist.numel(), device=device)
    last_positive = torch.where(dist > 0, vocab, 0).max().reshape(1)  # (1,) guards u * total rounding to total
    next_token = torch.minimum(index, last_positive)  # (1,)
    values = torch.cat([accepted, next_token, verify_ids]).tolist()  # (K + 3,) the one host transfer
    num_accepted, token = values[0], values[1]
    host_ids = values[2:]
    return list(range(num_accepted + 1)), token, host_ids[1 : num_accepted + 1] + [token]


__all__ = ["greedy_on_device", "rejection_chain_on_device"]
