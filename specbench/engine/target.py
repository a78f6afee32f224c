"""The target-model interface the decode loop drives: prefill, verify a draft, commit a path.

A target owns one KV cache (batch size 1). ``verify`` appends every node of the verify input to
the cache; ``commit`` then keeps only the accepted path's entries, moved to contiguous positions,
so rejected entries never leak into later steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch


@dataclass
class TargetOutput:
    logits: torch.Tensor  # (N, V) float32 next-token logits of each input position
    hidden_states: torch.Tensor  # (N, H) final hidden states after the final norm (what Medusa heads read)
    # (N, A * H) the residual streams entering the layers set by ``set_aux_layers`` (EAGLE-3's fused features),
    # concatenated in that order; None unless asked for
    aux_hidden_states: torch.Tensor | None = None


@runtime_checkable
class Target(Protocol):
    vocab_size: int
    max_context: int  # positions the model supports; prompt + output + draft must fit
    device: torch.device
    dtype: torch.dtype

    @property
    def cache_length(self) -> int:
        """Tokens currently held in the KV cache."""

    def reset(self) -> None:
        """Drop the KV cache (start of a new request)."""

    def reserve(self, num_tokens: int, max_draft_tokens: int = 0) -> None:
        """Size preallocated state for requests of up to ``num_tokens`` cache entries whose steps verify
        up to ``max_draft_tokens`` draft nodes (a no-op for targets that grow on demand). Called before
        timing starts, so allocation and graph capture never count as decoding time."""

    def prepare_prefills(self, lengths) -> None:
        """Get ready to prefill prompts of these ``lengths`` (capture what their prefill replays; a no-op for targets
        that capture nothing). Called after ``reserve`` and before timing starts, like it."""

    def prepare_steps(self) -> None:
        """Capture the verify steps ``reserve`` sized (a no-op for targets that capture nothing). Called after
        ``reserve`` and before timing starts, like it."""

    def prefill(self, input_ids: torch.Tensor) -> TargetOutput:
        """Run the prompt ``(T,)`` into an empty cache; returns the last position's logits ``(1, V)`` and the
        hidden states of every prompt position ``(T, H)`` (feature-reading proposers such as EAGLE need them)."""

    def verify(self, input_ids: torch.Tensor, depths: torch.Tensor, tree_mask: torch.Tensor | None) -> TargetOutput:
        """Score ``(N,)`` verify-input tokens placed after the cache in one forward.

        ``depths`` ``(N,)`` gives each node's position offset from the cache end; ``tree_mask``
        ``(N, N)`` bool says which nodes each node attends to (None: a causal chain, whose depths are 0..N-1).
        """

    def commit(self, accepted_nodes: list[int], num_verified: int) -> None:
        """Keep the cache entries of ``accepted_nodes`` (verify-input indices, ascending) of the last
        ``num_verified`` appended, contiguously; drop the rest."""
