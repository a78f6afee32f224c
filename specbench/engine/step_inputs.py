"""A verify step's inputs: each slot's ``[root, *draft]``, the fixed-width static buffers a step graph reads and
the step's kind, and the last step's inputs as greedy verification reads them (engine/static_target.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.engine.draft import Draft
from specbench.engine.transfers import host_to_device, tensor_to_device


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


def slot_input(root: int | torch.Tensor, draft: Draft, device: torch.device, read_depths=None) -> SlotInput:
    """Slot input ``[root, *draft]``: the root is host-known, or a ``(1,)`` device tensor for a step queued ahead of
    the host's reads; a draft on ``device`` (Medusa, EAGLE, n-gram) goes as the input's device-held tail, one held
    on the host for a GPU target (scripted) is packed on the host with a host-known root. Chain
    depths are ``0..N`` without reading the draft; a tree drafted anew on the device (EAGLE-2) keeps its depths
    there; a static tree's ``(N + 1,)`` depths go through ``read_depths`` (default: read them; the decoder reads
    each tree once)."""
    head = [root] if isinstance(root, int) else root
    if not len(draft):
        return SlotInput(head, [0])
    on_host = draft.tokens.device != device  # host-held (a CPU tensor): the whole input is host-known
    if draft.is_chain:
        depths = list(range(len(draft) + 1))
    elif draft.precomputed_depth is None and not on_host:
        depths = draft.depths()  # (N + 1,) on the device
    else:
        depths = (read_depths or torch.Tensor.tolist)(draft.depths())
    mask = None if draft.is_chain else draft.tree_mask()  # (N + 1, N + 1) or None
    if on_host:
        return SlotInput([root, *draft.tokens.tolist()], depths, mask)
    return SlotInput(head, depths, mask, tail=draft.tokens)


@dataclass
class VerifiedStep:
    """The last verify's inputs on the device, valid until the next verify (what greedy verification reads)."""

    ids: torch.Tensor  # (B, W) int64 row b's first counts[b] are [root, *draft]
    ancestors: torch.Tensor  # (B, W, W) bool row i: node i and its ancestors (chains: causal; padded rows: at least self)
    counts: torch.Tensor  # (B,) int64 real nodes per slot, 0 for idle slots
    depths: torch.Tensor  # (B, W) int64 each real node's depth (root 0), padding and idle slots 0
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
    # with CUDA graphs: the logits (B * W, V), hidden (B * W, H) and aux (B * W, A * H) or None every attention
    # span's graph of this (kind, width) writes, so that the spans share one set of outputs
    outputs: tuple | None = None

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


def scatter_rows(buffer: torch.Tensor, parts: list[tuple[int, int, torch.Tensor]], device: torch.device,
                 index: torch.Tensor | None = None) -> torch.Tensor | None:
    """``buffer[slot, start:start + M] = values`` ``(M, ...)`` for every (slot, start, values) of ``parts``,
    device-held, in one indexed write (``buffer`` ``(B, W, ...)``). Returns the ``(2, T)`` index it wrote through
    (None for no parts); pass it back as ``index`` for another buffer whose parts have the same slots and lengths."""
    if not parts:
        return None
    if index is None:
        rows = [slot for slot, _, values in parts for _ in range(values.shape[0])]  # (T,)
        cols = [start + i for _, start, values in parts for i in range(values.shape[0])]  # (T,)
        index = host_to_device([rows, cols], device)  # (2, T)
    buffer[index[0], index[1]] = torch.cat([values for _, _, values in parts]).to(buffer.dtype)  # (T, ...)
    return index


def fill_buffers(buffers: BatchBuffers, kind: str, inputs: list[SlotInput | None], device: torch.device) -> BatchBuffers:
    """Write each slot's input into the (kind, width) buffers, padding the rest (idle slots: all padding). Inputs
    held on the host go in one packed host-to-device copy per buffer; device-held ones in one scatter per buffer;
    depths and tree rows are copied only where they changed."""
    width = buffers.ids.shape[1]
    ids = [[0] * width for _ in inputs]  # (B, W) host-held ids, padded with token 0
    depths = [[0] * width for _ in inputs]  # (B, W)
    device_ids, device_depths = [], []  # (slot, first column, (M,) device tensor)
    for slot, x in enumerate(inputs):
        if x is None:
            continue
        for rows, parts, values in ((ids, device_ids, x.ids), (depths, device_depths, x.depths)):
            if isinstance(values, list) or values.device != device:  # host-held (a GPU target's CPU tensor)
                flat = values if isinstance(values, list) else values.flatten().tolist()
                rows[slot][: len(flat)] = flat
            else:
                parts.append((slot, 0, values.flatten()))
        if x.tail is not None:
            device_ids.append((slot, len(x.ids), x.tail.flatten()))
    buffers.ids.copy_(host_to_device(ids, device))
    scatter_rows(buffers.ids, device_ids, device)
    if device_depths or depths != buffers.host_depths:  # plain steps and steady chains: nothing to copy
        buffers.depths.copy_(host_to_device(depths, device))
        scatter_rows(buffers.depths, device_depths, device)
        buffers.host_depths = None if device_depths else depths
    if kind == "tree":
        _fill_tree(buffers, inputs, device)
    return buffers  # plain and chain steps keep the causal mask they were allocated with


def _fill_tree(buffers: BatchBuffers, inputs: list[SlotInput | None], device: torch.device) -> None:
    """Rewrite slot b's tree rows ``(W, W)`` only when its mask changed (a static tree hands over the same mask
    tensor every step): real rows see their own tree, padded rows only themselves. Idle slots keep theirs."""
    for slot, x in enumerate(inputs):
        if x is None:
            continue
        n = len(x)
        written = buffers.tree_rows[slot]
        if written is not None and written[0] is x.tree_mask and written[1] == n:
            continue
        row = buffers.tree[slot]  # (W, W)
        row.zero_().diagonal().fill_(True)  # padded rows: themselves only
        if x.tree_mask is None:  # a chain slot in a tree step
            row[:n, :n].fill_(True).tril_()  # (N, N) causal
        else:  # a host-held mask goes up pinned and asynchronously (a pageable copy would wait for the stream)
            row[:n, :n].copy_(tensor_to_device(x.tree_mask, device))
        buffers.tree_rows[slot] = (x.tree_mask, n)
