"""Rejection sampling of a chain computed on the logits' device, with one device-to-host transfer per step (greedy
verification of every slot at once: engine/batch_verification.py)."""

from __future__ import annotations

import torch

from specbench.engine.draft import Draft
from specbench.engine.sampling import SamplingParams, target_probs


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
    next_token, emitted)``: the accepted path root first, the token after it, the tokens the step emits, after
    one ``.tolist()`` of a packed tensor.
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


__all__ = ["rejection_chain_on_device"]
