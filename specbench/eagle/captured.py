"""The EAGLE draft head's forwards as fixed-shape steps over static buffers, replayed as CUDA graphs (docs/eagle.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from specbench.eagle.draft_head import EagleHead
from specbench.engine.graph_capture import StepGraphs

CATCH_UP, EXPAND = "catch_up", "expand"  # the step kinds: graph keys are (kind, width)


@dataclass
class HeadStepBuffers:
    """The static inputs one (kind, width) graph reads; everything else it reads is the draft cache and weights."""

    tokens: torch.Tensor  # (W,) int64 the rows' tokens (embedded inside the step)
    features: torch.Tensor  # (W, F) each row's feature: the target's (F = H; EAGLE-3: 3H) or its parent's output
    block: torch.Tensor  # (W, B) bool: column c is slot visible + c; catch-up: causal (B = W), expand: the sees rows
    meta: torch.Tensor  # (3,) int64: first new slot, visible (slots below it are seen by every row), first position
    spread: torch.Tensor  # (W,) int64 each row's position offset: arange (catch-up, consecutive) or zeros (siblings)
    last_only: bool  # logits of the last row only (the catch-up's root)
    written: tuple = (None, None, None)  # the host's copy of meta, so an unchanged scalar is not written again

    @classmethod
    def allocate(cls, kind: str, width: int, feature_width: int, block_width: int, *, dtype,
                 device) -> "HeadStepBuffers":
        catch_up = kind == CATCH_UP
        block = torch.ones(width, width, dtype=torch.bool, device=device).tril_() if catch_up else \
            torch.zeros(width, block_width, dtype=torch.bool, device=device)  # (W, B)
        spread = torch.arange(width, device=device) if catch_up else torch.zeros(width, dtype=torch.long, device=device)
        return cls(tokens=torch.zeros(width, dtype=torch.long, device=device),
                   features=torch.zeros(width, feature_width, dtype=dtype, device=device), block=block,
                   meta=torch.zeros(3, dtype=torch.long, device=device), spread=spread, last_only=catch_up)


class CapturedHead:
    """Runs the head's forwards as :class:`StepGraphs` steps keyed by (kind, width) over the head's own draft cache.

    A step attends over the whole cache (``(W, S)`` mask built inside the step from ``meta`` and ``block``), writes
    its rows at ``meta[0] + arange(W)`` and returns the rows' outputs ``(W, H)`` and logits (``logits`` of them),
    so each (kind, width) has one shape. The host keeps the cache length (it knows every step's width) and copies
    each step's tokens, features, block mask and three scalars into the key's buffers before the replay. A cache
    that is reallocated (it grew) drops every graph, which read its address.
    """

    def __init__(self, head: EagleHead, embedding: nn.Module, logits: Callable[[torch.Tensor], torch.Tensor],
                 graphs: StepGraphs, *, expansion_slots: int):
        self.head, self.embedding, self.logits, self.graphs = head, embedding, logits, graphs
        self.expansion_slots = expansion_slots  # B of the expand kind: the most draft nodes one step writes
        self.buffers: dict[tuple[str, int], HeadStepBuffers] = {}
        self._kv: torch.Tensor | None = None  # the cache tensor the graphs were captured over
        self.prepared_over: torch.Tensor | None = None  # the cache tensor whose graphs the proposer prepared
        self._slot_index: torch.Tensor | None = None  # (S,)

    @property
    def enabled(self) -> bool:
        return self.graphs.enabled

    def step(self, kind: str, tokens: torch.Tensor, features: torch.Tensor, *, start: int, visible: int,
             position: int, block: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``W`` rows at cache slots ``[start, start + W)``: outputs ``(W, H)`` and logits ``(W, V)`` (``(1, V)`` of
        the last row for the catch-up), the graph's static tensors (valid until the key's next replay).

        Catch-up (``block`` None): rows at positions ``position + arange(W)``, causal after the ``visible`` (=
        ``start``) slots. Expand: every row at ``position`` (siblings), seeing the slots below ``visible`` and,
        through ``block`` ``(W, start + W - visible)``, the draft nodes written since.
        """
        width = tokens.numel()
        cache = self._cache_with_room(start + width)
        key = (kind, width)
        buffers = self.buffers.get(key)
        block_width = width if kind == CATCH_UP else self.expansion_slots
        if buffers is None or buffers.features.shape[-1] != features.shape[-1]:
            buffers = self.buffers[key] = HeadStepBuffers.allocate(kind, width, features.shape[-1], block_width,
                                                                   dtype=cache.kv.dtype, device=cache.kv.device)
        if block is not None:
            if block.shape[1] > block_width:
                raise ValueError(f"an expansion sees {block.shape[1]} draft slots; the step holds {block_width}")
            buffers.block[:, : block.shape[1]].copy_(block)  # columns beyond start + W are masked inside the step
        buffers.tokens.copy_(tokens)
        buffers.features.copy_(features)
        self._write_meta(buffers, (start, visible, position))
        hidden, logits = self.graphs.run(key, buffers, self._forward)
        cache.length = start + width
        return hidden, logits

    @staticmethod
    def _write_meta(buffers: HeadStepBuffers, values: tuple[int, int, int]) -> None:
        """``fill_`` the scalars that changed (a launch argument each: no host-to-device copy, no sync); a catch-up's
        three are equal (first slot, visible and first position are all its start): one fill."""
        stale = [i for i, (old, new) in enumerate(zip(buffers.written, values)) if old != new]
        if len(stale) == 3 and len(set(values)) == 1:
            buffers.meta.fill_(values[0])
        else:
            for i in stale:
                buffers.meta[i].fill_(values[i])
        buffers.written = values

    def _cache_with_room(self, slots: int):
        """The head's cache, grown to ``slots`` if needed; a new cache tensor drops the graphs over the old one."""
        head = self.head
        if head.cache is None:
            head.reset_cache()
        cache = head.cache
        cache.reserve(slots)
        if cache.kv is not self._kv:
            self.graphs.drop()
            self.buffers.clear()
            self.prepared_over = None  # and holds no reference to the old cache
            self._kv = cache.kv
            self._slot_index = torch.arange(cache.capacity, device=cache.kv.device)  # (S,)
        return cache

    def _forward(self, buffers: HeadStepBuffers) -> tuple[torch.Tensor, torch.Tensor]:
        """One fixed-shape draft forward over ``buffers``: the region a graph captures (device tensors only)."""
        slot_index, kv = self._slot_index, self._kv  # (S,), (2, KVH, S, D)
        width, block_width = buffers.block.shape
        start, visible, position = buffers.meta[0], buffers.meta[1], buffers.meta[2]  # () each
        relative = slot_index - visible  # (S,) block column of each slot
        new_end = slot_index < start + width  # (S,) at most the slots written so far and by this step
        block = buffers.block[:, relative.clamp(0, block_width - 1)]  # (W, S)
        mask = (relative < 0)[None, :] | (((relative >= 0) & new_end)[None, :] & block)  # (W, S)
        slots = start + slot_index[:width]  # (W,)
        embeds = self.embedding(buffers.tokens)  # (W, H)
        hidden = self.head.step(embeds, buffers.features, position + buffers.spread, slots, mask, kv)  # (W, H)
        return hidden, self.logits(hidden[-1:] if buffers.last_only else hidden)  # (W, H), (W or 1, V)
