"""A preallocated KV cache whose length lives on the device, so verify steps keep one shape and never sync."""

from __future__ import annotations

import torch


class StaticKVCache:
    """Keys and values ``(layers, 2, kv_heads, capacity, head_dim)``; slots ``[0, length)`` are live.

    ``length`` is a 0-d device tensor that the hot path reads (slots, positions, mask); ``host_length``
    mirrors it on the host, advanced by the same host-known amounts, so nothing reads it back.
    """

    def __init__(self, num_layers: int, num_kv_heads: int, capacity: int, head_dim: int, *, dtype, device):
        # zeros, not empty: masked slots still enter attention as 0 * value, and stale NaN would poison it
        self.kv = torch.zeros(num_layers, 2, num_kv_heads, capacity, head_dim, dtype=dtype, device=device)  # (L, 2, KVH, S, D)
        self.length = torch.zeros((), dtype=torch.long, device=device)  # () live slots
        self.host_length = 0
        self.slot_index = torch.arange(capacity, device=device)  # (S,)

    @property
    def capacity(self) -> int:
        return self.kv.shape[3]

    def reset(self) -> None:
        self.length.zero_()
        self.host_length = 0

    def advance(self, count: int) -> None:
        self.length.add_(count)
        self.host_length += count

    def new_slots(self, width: int) -> torch.Tensor:
        """(W,) the slots a verify input of ``width`` nodes is written to: right after the live ones."""
        return self.length + self.slot_index[:width]

    def attention_mask(self, tree: torch.Tensor) -> torch.Tensor:
        """(W, S) bool: every live slot, plus the new slots each node's ``tree`` row ``(W, W)`` allows."""
        width = tree.shape[0]
        offset = self.slot_index - self.length  # (S,) slot position relative to the first new slot
        is_new = (offset >= 0) & (offset < width)  # (S,)
        tree_cols = tree[:, offset.clamp(0, width - 1)]  # (W, S) the tree row, spread over the slots
        return (offset < 0)[None, :] | (is_new[None, :] & tree_cols)  # (W, S)

    def gather_new(self, source: torch.Tensor) -> None:
        """Move new slots ``length + source[i]`` to ``length + i`` for every i, in place; ``source`` ``(W,)``
        is a fixed-size index (the accepted nodes, padded with the identity), so the shape never changes."""
        width = source.shape[0]
        picked = self.kv.index_select(3, self.length + source)  # (L, 2, KVH, W, D) a copy: sources may be overwritten
        self.kv.index_copy_(3, self.new_slots(width), picked)
