"""A proposer's output: draft tokens arranged as a chain or a tree under the root token.

The verify input of one step is ``[root, draft_0, ..., draft_{N-1}]`` where the root is the last
emitted token (not yet in the KV cache). ``parents[i]`` is the verify-input index of draft i's
parent: 0 is the root, ``j + 1`` is draft j. Parents always precede children, so a chain of K
tokens has ``parents = [0, 1, ..., K-1]``.

Nothing here reads a tensor's values on the host unless a shape was neither given nor derivable on the device:
the depths and the ancestor mask are built with tensor ops on the parents' device (no device-to-host sync), and a
builder that knows them (a chain, a static tree, EAGLE-2's dynamic tree) hands them over precomputed, which also
skips the validation of ``parents`` (a host read) (docs/eagle.md#host-reads-per-step).
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field

import torch


@dataclass
class Draft:
    tokens: torch.Tensor  # (N,) int64 draft token ids
    parents: torch.Tensor  # (N,) int64 verify-input index of each node's parent (0 = root)
    # (N, V) float: the proposer's distribution each token was drawn from, for rejection sampling
    # with a real draft model; None means point-mass drafts (n-gram, Medusa top-k).
    draft_probs: torch.Tensor | None = None
    # the shape derived from parents, computed once per draft; a static tree (TreeBuffers) passes its
    # precomputed, already validated buffers so the hot loop never rebuilds them
    precomputed_depths: torch.Tensor | None = field(default=None, repr=False, compare=False)  # (N + 1,)
    precomputed_tree_mask: torch.Tensor | None = field(default=None, repr=False, compare=False)  # (N + 1, N + 1)
    # known on the host by whoever built the draft (a chain, a static tree): reading them off device-resident
    # parents would cost a device-to-host sync every decode step. ``precomputed_is_chain`` False means "verify as a
    # tree" (a chain-shaped tree verifies alike). A depth left None (EAGLE-2: the deepest selected level is known
    # on the device only) is filled by the device verification from the step's one readback (engine/decode.py)
    precomputed_is_chain: bool | None = field(default=None, repr=False, compare=False)
    precomputed_depth: int | None = field(default=None, repr=False, compare=False)
    depth_bound: int | None = field(default=None, repr=False, compare=False)  # host-known, where the depth is not

    def __post_init__(self) -> None:
        n = self.tokens.numel()
        if self.tokens.dim() != 1 or self.parents.shape != self.tokens.shape:
            raise ValueError(
                f"Draft.tokens and Draft.parents must be 1-D of equal length, got shapes "
                f"{tuple(self.tokens.shape)} and {tuple(self.parents.shape)}"
            )
        if n and self.precomputed_depths is None:  # a shape handed over precomputed was validated by its builder
            node_index = torch.arange(1, n + 1, device=self.parents.device)  # (N,)
            if not bool(((self.parents >= 0) & (self.parents < node_index)).all()):  # a host read
                raise ValueError(
                    f"Draft.parents must point to an earlier node (0 = root), got {self.parents.tolist()}"
                )
        if self.draft_probs is not None and self.draft_probs.shape[0] != n:
            raise ValueError(f"Draft.draft_probs has {self.draft_probs.shape[0]} rows for {n} draft tokens")

    @classmethod
    def chain(cls, tokens: torch.Tensor, draft_probs: torch.Tensor | None = None) -> "Draft":
        """A linear draft: each token continues the previous one. Its parents and depths are the shared tensors of
        every chain of its length (:func:`chain_shape`)."""
        parents, depths = chain_shape(tokens.numel(), tokens.device)  # (K,), (K + 1,)
        return cls(tokens=tokens.long(), parents=parents, draft_probs=draft_probs, precomputed_depths=depths,
                   precomputed_is_chain=True, precomputed_depth=tokens.numel())

    def with_tokens(self, tokens: torch.Tensor) -> "Draft":
        """This draft's shape over other ``(N,)`` tokens: a shallow copy sharing the precomputed shape (no
        re-validation, nothing on the device), for a batched proposer handing every slot one template's shape."""
        draft = copy.copy(self)
        draft.tokens = tokens
        return draft

    def __len__(self) -> int:
        return self.tokens.numel()

    @property
    def is_chain(self) -> bool:
        if self.precomputed_is_chain is None:
            self.precomputed_is_chain = bool((self.parents == torch.arange(len(self), device=self.parents.device)).all())
        return self.precomputed_is_chain

    def depths(self) -> torch.Tensor:
        """(N + 1,) depth of every verify-input node; the root has depth 0 (on the parents' device)."""
        if self.precomputed_depths is None:
            self.precomputed_depths = self.tree_mask().sum(dim=1) - 1  # ancestors and itself, less itself
        return self.precomputed_depths

    def depth(self) -> int:
        """Length of the longest candidate path: the draft tokens this step counts (metrics.py)."""
        if self.precomputed_depth is None:
            self.precomputed_depth = int(self.depths().max()) if len(self) else 0  # the one host read, if not known
        return self.precomputed_depth

    def tree_mask(self) -> torch.Tensor:
        """(N + 1, N + 1) bool: row i attends to column j iff j is i or an ancestor of i (on the parents' device)."""
        if self.precomputed_tree_mask is None:
            self.precomputed_tree_mask = ancestor_mask(self.parents, len(self))  # no node is deeper than N
        return self.precomputed_tree_mask


@functools.lru_cache(maxsize=64)
def chain_shape(length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Parents ``(K,)`` = 0..K-1 and depths ``(K + 1,)`` = 0..K of a chain of ``length`` = K draft tokens: built once per
    length and device and shared, read-only, by every chain, as a static tree shares its buffers. A target that
    remembers the depths tensor it last wrote (StaticTarget) then writes a chain's depths once, not every step."""
    with torch.inference_mode(False):  # ordinary tensors, usable outside inference mode too
        return (torch.arange(length, dtype=torch.long, device=device),
                torch.arange(length + 1, dtype=torch.long, device=device))


def ancestor_mask(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """(N + 1, N + 1) bool ancestor closure of ``parents`` ``(N,)`` (verify-input index of each node's parent, 0 =
    the root) for trees no deeper than ``max_depth``: row i holds i and all its ancestors. ``parents`` ``(B, N)``
    (one tree per row: a batch of slots) gives ``(B, N + 1, N + 1)``.

    Tensor ops only, on the parents' device (no host read): pointer jumping, ``ceil(log2(max_depth + 1))`` rounds
    of ``mask |= mask[up]; up = up[up]``, where row i covers the ancestors less than ``2^r`` levels up after r
    rounds and ``up`` is the ancestor ``2^r`` levels up (the root is its own parent)."""
    rows = parents if parents.dim() == 2 else parents[None]  # (B, N)
    batch, n = rows.shape
    up = torch.cat([rows.new_zeros(batch, 1), rows.long()], dim=1)  # (B, N + 1) each node's parent; the root's is itself
    mask = torch.eye(n + 1, dtype=torch.bool, device=parents.device).expand(batch, n + 1, n + 1)  # (B, N + 1, N + 1)
    for _ in range(max(int(max_depth), 0).bit_length()):  # 2^r >= max_depth + 1 levels covered
        mask = mask | mask.gather(1, up[:, :, None].expand(batch, n + 1, n + 1))
        up = up.gather(1, up)
    return mask if parents.dim() == 2 else mask[0]
