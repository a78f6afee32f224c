"""A batched verify step's inputs: each slot's ``[root, *draft]``, the fixed-width static buffers a step graph reads,
the step's kind, and the last step's inputs as greedy verification reads them (engine/batched_target.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.engine.transfers import host_to_device


@dataclass
class SlotInput:
    """One slot's verify input: ``[root, *draft]`` ``(N,)``, depths ``(N,)``, tree mask ``(N, N)`` or None (a chain).

    ``ids`` and ``depths`` are tensors or host lists; ``tail`` ``(M,)``, if given, is a device-held rest of the
    ids (a proposer's draft) after the host-known ``ids`` (the root), so the slot has ``len(ids) + M`` nodes."""

    ids: torch.Tensor | list[int]
    depths: torch.Tensor | list[int]
    tree_mask: torch.Tensor | None = None
    tail: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.ids) + (0 if self.tail is None else self.tail.numel())


@dataclass
class VerifiedStep:
    """The last verify's inputs on the device, valid until the next verify (what greedy verification reads)."""

    ids: torch.Tensor  # (B, W) int64 row b's first counts[b] are [root, *draft]
    ancestors: torch.Tensor  # (B, W, W) bool row i: node i and its ancestors (chains: causal; padded rows: at least self)
    counts: torch.Tensor  # (B,) int64 real nodes per slot, 0 for idle slots
    chain: bool  # a plain or chain step: every slot's input is a chain (its ancestor rows are causal)


@dataclass
class BatchBuffers:
    """The static inputs of one step kind at width W for B slots: a captured graph reads exactly these."""

    ids: torch.Tensor  # (B, W) int64, padded with token 0
    depths: torch.Tensor  # (B, W) int64 position offsets from each slot's cache end, padded with 0
    tree: torch.Tensor  # (B, W, W) bool; padded rows see only themselves
    # host mirrors of what the device rows hold, so an unchanged row costs no copy: depths (B lists of W) and,
    # per slot, (the tree mask tensor last written into its tree rows, its nodes); None: not written yet
    host_depths: list | None = None
    tree_rows: list | None = None

    @classmethod
    def allocate(cls, batch: int, width: int, device) -> "BatchBuffers":
        causal = torch.ones(width, width, dtype=torch.bool, device=device).tril_()  # (W, W) a chain's mask
        return cls(
            ids=torch.zeros(batch, width, dtype=torch.long, device=device),
            depths=torch.zeros(batch, width, dtype=torch.long, device=device),
            tree=causal.expand(batch, width, width).clone(),
            host_depths=[[0] * width for _ in range(batch)],
            tree_rows=[None] * batch,
        )


def step_kind(inputs: list[SlotInput | None]) -> str:
    """The kind of a batch step: tree if any slot verifies a tree, chain if any drafted, else plain."""
    live = [x for x in inputs if x is not None]
    if any(x.tree_mask is not None for x in live):
        return "tree"
    return "chain" if any(len(x) > 1 for x in live) else "plain"


def scatter_rows(buffer: torch.Tensor, parts: list[tuple[int, int, torch.Tensor]], device: torch.device) -> None:
    """``buffer[slot, start:start + M] = values`` ``(M,)`` for every (slot, start, values) of ``parts``, device-held,
    in one indexed write."""
    if not parts:
        return
    rows = [slot for slot, _, values in parts for _ in range(values.numel())]  # (T,)
    cols = [start + i for _, start, values in parts for i in range(values.numel())]  # (T,)
    index = host_to_device([rows, cols], device)  # (2, T)
    buffer[index[0], index[1]] = torch.cat([values for _, _, values in parts]).to(buffer.dtype)  # (T,)
