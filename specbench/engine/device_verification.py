"""Verification on the logits' device: greedy verification of every slot of a step at once, with the step's one
device-to-host read, and lossless rejection sampling of one slot's chain (docs/verification.md; the host rules:
engine/verification.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.engine.draft import Draft
from specbench.engine.sampling import SamplingParams, target_probs
from specbench.engine.transfers import host_to_device


@dataclass
class BatchVerdict:
    """What one batched step keeps and emits per slot, on the device (idle slots keep and emit nothing)."""

    kept: torch.Tensor  # (B,) int64 accepted nodes, root included: the tokens the slot emits this step; 0 if idle
    nodes: torch.Tensor  # (B, W) int64 the accepted nodes ascending (root first), then the identity
    emitted: torch.Tensor  # (B, W) int64 the accepted draft tokens, then the target's next token; 0-padded

    def last_node(self) -> torch.Tensor:
        """(B,) the last accepted node of each slot (0 for idle slots): its hidden state predicted the next root."""
        return self.nodes.gather(1, (self.kept - 1).clamp_min(0)[:, None]).squeeze(1)  # (B,)

    @classmethod
    def from_host(cls, paths: list[list[int] | None], emitted: list[list[int] | None], width: int,
                  device: torch.device) -> "BatchVerdict":
        """A verdict reached on the host (sampling, or a caller's paths), sent in one host-to-device copy."""
        rows = []
        for path, new in zip(paths, emitted):
            path, new = path or [], new or []
            rows.append([len(path), *path, *range(len(path), width), *new, *[0] * (width - len(new))])
        packed = host_to_device(rows, device)  # (B, 1 + 2W)
        return cls(kept=packed[:, 0], nodes=packed[:, 1: width + 1], emitted=packed[:, width + 1:])


def verify_batch_greedy(ids: torch.Tensor, logits: torch.Tensor, ancestors: torch.Tensor, counts: torch.Tensor,
                        *, chain: bool = False) -> BatchVerdict:
    """Greedy verification (docs/verification.md) of every slot's ``[root, *draft]`` at once, on the device.

    ``ids`` ``(B, W)`` and ``logits`` ``(B, W, V)`` are the step's padded inputs and scores; ``ancestors``
    ``(B, W, W)`` bool has row i = node i and its ancestors among slot b's first ``counts[b]`` nodes (a chain's
    causal mask, a tree's mask; padded rows at least themselves), ``counts`` ``(B,)`` the real nodes (0: idle).
    Per slot this is ``verification.verify_greedy``'s rule: a draft node is ok iff its token is the argmax of its
    parent's row;
    the accepted path ends at the deepest node whose ancestors are all ok (ties: the earlier index), and the
    step emits the path's draft tokens, then the argmax after its last node. ``chain`` (every slot a chain: a
    plain or chain step) takes the shorter chain form, the accepted prefix. No host read, no per-slot op.
    """
    batch, width = ids.shape
    target = logits.argmax(dim=-1)  # (B, W) the target's token after each node
    if width == 1:  # a plain step: each live slot keeps its root and emits the argmax after it (2 ops, not ~15);
        # kept is the step's counts tensor itself: a verdict is read, never written into
        return BatchVerdict(kept=counts, nodes=torch.zeros_like(ids), emitted=torch.where(counts[:, None] > 0, target, 0))
    index = torch.arange(width, device=ids.device)  # (W,)
    real = index[None, :] < counts[:, None]  # (B, W) padding and idle slots are never ok
    if chain:
        draft_ok = torch.cat([real[:, :1], ids[:, 1:] == target[:, :-1]], dim=1)  # (B, W) parent: the node before
        kept = (draft_ok & real).long().cumprod(dim=1).sum(dim=1)  # (B,) the accepted prefix, root included
        return _verdict(ids, target, index.expand(batch, width), kept)
    strict = ancestors & (index[:, None] != index[None, :])  # (B, W, W) proper ancestors
    parent = (strict.long() * index).amax(dim=-1)  # (B, W) the deepest proper ancestor (parents precede children)
    node_ok = ((ids == target.gather(1, parent)) | (index == 0)) & real  # (B, W) the root is ok in a live slot
    on_path = ~(ancestors & ~node_ok[:, None, :]).any(dim=-1)  # (B, W) the node and all its ancestors are ok
    depth = ancestors.sum(dim=-1) - 1  # (B, W)
    score = on_path.long() * ((depth + 1) * (width + 1) - index)  # (B, W) deeper wins, then the earlier index
    best = score.argmax(dim=-1)  # (B,)
    path = ancestors.gather(1, best[:, None, None].expand(batch, 1, width)).squeeze(1)  # (B, W) on best's path
    kept = path.sum(dim=-1) * (counts > 0)  # (B,)
    order = torch.where(path, index, index + width).argsort(dim=-1)  # (B, W) path nodes first, ascending
    return _verdict(ids, target, torch.where(index[None, :] < kept[:, None], order, index), kept)


def _verdict(ids: torch.Tensor, target: torch.Tensor, nodes: torch.Tensor, kept: torch.Tensor) -> BatchVerdict:
    """The emitted tokens of accepted ``nodes`` ``(B, W)`` (the first ``kept`` ``(B,)``): their draft tokens, then
    the target's token ``target`` ``(B, W)`` after the last one."""
    index = torch.arange(ids.shape[1], device=ids.device)  # (W,)
    last = nodes.gather(1, (kept - 1).clamp_min(0)[:, None])  # (B, 1)
    drafted = ids.gather(1, torch.cat([nodes[:, 1:], nodes[:, :1]], dim=1))  # (B, W) column i: node i + 1's token
    emitted = torch.where(index == kept[:, None] - 1, target.gather(1, last),
                          torch.where(index < kept[:, None] - 1, drafted, 0))  # (B, W)
    return BatchVerdict(kept=kept, nodes=nodes, emitted=emitted)


class StepReadback:
    """The one device-to-host transfer of a step: ``(B, 1 + W)`` [kept, emitted tokens], and with ``depths`` ``(B,)``
    (each slot's deepest draft node, for trees drafted anew each step) one more column, copied without blocking
    (into pinned memory on CUDA, an event recorded behind it), waited for at the first ``tokens()``."""

    def __init__(self, verdict: BatchVerdict, depths: torch.Tensor | None = None):
        parts = [verdict.kept[:, None], verdict.emitted] + ([] if depths is None else [depths[:, None]])
        packed = torch.cat(parts, dim=1)  # (B, 1 + W) or (B, 2 + W)
        self._width = verdict.emitted.shape[1]
        self._tokens, self._depths = None, None  # per slot: emitted tokens, deepest nodes (filled by tokens())
        self._event = None
        if packed.device.type == "cuda":
            self._host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
            self._host.copy_(packed, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host = packed

    def tokens(self) -> list[list[int]]:
        """Per slot, the tokens it emits this step (empty for idle slots); the first call waits for the copy."""
        if self._tokens is None:
            if self._event is not None:
                self._event.synchronize()
            rows = self._host.tolist()
            self._tokens = [row[1: 1 + row[0]] for row in rows]
            if len(rows[0]) > 1 + self._width:
                self._depths = [row[-1] for row in rows]
        return self._tokens

    def depths(self) -> list[int]:
        """Per slot, the deepest node of its step's draft (0 idle), when the readback carried them."""
        self.tokens()
        if self._depths is None:
            raise ValueError("this step's readback carried no depths: pass depths to read_step")
        return self._depths


def read_step(verdict: BatchVerdict, depths: torch.Tensor | None = None) -> StepReadback:
    """Start the step's one device-to-host transfer (the function a test counts)."""
    return StepReadback(verdict, depths)


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
    num_accepted, token, *host_ids = torch.cat([accepted, next_token, verify_ids]).tolist()  # (K + 3,) the one read
    return list(range(num_accepted + 1)), token, host_ids[1 : num_accepted + 1] + [token]
