"""A proposer's output: draft tokens arranged as a chain or a tree under the root token.

The verify input of one step is ``[root, draft_0, ..., draft_{N-1}]`` where the root is the last
emitted token (not yet in the KV cache). ``parents[i]`` is the verify-input index of draft i's
parent: 0 is the root, ``j + 1`` is draft j. Parents always precede children, so a chain of K
tokens has ``parents = [0, 1, ..., K-1]``.
"""

from __future__ import annotations

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
    # parents would cost a device-to-host sync every decode step
    precomputed_is_chain: bool | None = field(default=None, repr=False, compare=False)
    precomputed_depth: int | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = self.tokens.numel()
        if self.tokens.dim() != 1 or self.parents.shape != self.tokens.shape:
            raise ValueError(
                f"Draft.tokens and Draft.parents must be 1-D of equal length, got shapes "
                f"{tuple(self.tokens.shape)} and {tuple(self.parents.shape)}"
            )
        node_index = torch.arange(1, n + 1, device=self.parents.device)
        if n and self.precomputed_depths is None and not bool(((self.parents >= 0) & (self.parents < node_index)).all()):
            raise ValueError(
                f"Draft.parents must point to an earlier node (0 = root), got {self.parents.tolist()}"
            )
        if self.draft_probs is not None and self.draft_probs.shape[0] != n:
            raise ValueError(f"Draft.draft_probs has {self.draft_probs.shape[0]} rows for {n} draft tokens")

    @classmethod
    def chain(cls, tokens: torch.Tensor, draft_probs: torch.Tensor | None = None) -> "Draft":
        """A linear draft: each token continues the previous one."""
        parents = torch.arange(tokens.numel(), dtype=torch.long, device=tokens.device)  # (K,)
        return cls(tokens=tokens.long(), parents=parents, draft_probs=draft_probs,
                   precomputed_is_chain=True, precomputed_depth=tokens.numel())

    def __len__(self) -> int:
        return self.tokens.numel()

    @property
    def is_chain(self) -> bool:
        if self.precomputed_is_chain is None:
            self.precomputed_is_chain = bool((self.parents == torch.arange(len(self), device=self.parents.device)).all())
        return self.precomputed_is_chain

    def depths(self) -> torch.Tensor:
        """(N + 1,) depth of every verify-input node; the root has depth 0."""
        if self.precomputed_depths is None:
            parents = self.parents.tolist()
            depth = [0] * (len(parents) + 1)
            for i, p in enumerate(parents):
                depth[i + 1] = depth[p] + 1
            self.precomputed_depths = torch.tensor(depth, dtype=torch.long)
        return self.precomputed_depths

    def depth(self) -> int:
        """Length of the longest candidate path: the draft tokens this step counts (metrics.py)."""
        if self.precomputed_depth is None:
            self.precomputed_depth = int(self.depths().max()) if len(self) else 0
        return self.precomputed_depth

    def tree_mask(self) -> torch.Tensor:
        """(N + 1, N + 1) bool: row i attends to column j iff j is i or an ancestor of i."""
        if self.precomputed_tree_mask is None:
            mask = torch.eye(len(self) + 1, dtype=torch.bool)
            for i, p in enumerate(self.parents.tolist(), start=1):
                mask[i] |= mask[p]
            self.precomputed_tree_mask = mask
        return self.precomputed_tree_mask
