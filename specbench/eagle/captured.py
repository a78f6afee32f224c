"""The EAGLE draft head's steps over B slots on static buffers, run eagerly or replayed as CUDA graphs: a catch-up
per width, and a whole draft (every expansion and the drafting rule between them) as one step
(docs/eagle.md#graph-capture-on-the-static-engine)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from specbench.eagle.draft_head import EagleHead
from specbench.eagle.expansion import DraftingRule
from specbench.engine.graph_capture import StepGraphs
from specbench.engine.static_ops import EAGER_OPS, StepOps, own_code
from specbench.engine.step_inputs import scatter_rows
from specbench.engine.transfers import host_to_device

CATCH_UP, EXPAND, DRAFT = "catch_up", "expand", "draft"  # step kinds; graphs: (catch_up, width) and (draft, None)
# the whole draft step compiled beside a compiling target, so inductor fuses the small kernels around each expansion's
# matmuls; on since its A/B paid on EAGLE-2's 7B case (docs/eagle.md#a-compiled-draft-step)
COMPILE_DRAFT = True
START, LAST, COMMITTED = range(3)  # rows of the per-slot scalars (3, B)


def check_features(features: torch.Tensor, width: int, slot: int) -> None:
    """Refuse target features ``(..., F)`` that are not the ``width`` the head reads."""
    if features.shape[-1] != width:
        raise ValueError(f"the EAGLE head reads {width}-wide features, slot {slot} has {features.shape[-1]} (an "
                         "EAGLE-3 head needs the batched target's set_aux_layers)")


def compiled_alone(method: Callable) -> Callable:
    """A bound ``method`` compiled whole (fullgraph, fixed shapes) over a code object of its own (``own_code``):
    each head's steps compile anew (their guards hold the head), and on one shared code object every proposer of a
    process would add to one cache, so a sweep over many proposers would pass the recompile limit, which fullgraph
    makes an error."""
    function, owner = method.__func__, method.__self__
    own = own_code(function, f"{function.__name__}_{id(owner):x}")
    return torch.compile(own.__get__(owner), fullgraph=True, dynamic=False)


@dataclass
class HeadStepBuffers:
    """The static inputs one (kind, width) step reads; everything else it reads is the draft cache, the per-slot
    scalars and the weights."""

    tokens: torch.Tensor  # (B, W) int64 the rows' tokens (embedded inside the step)
    features: torch.Tensor  # (B, W, F) each row's feature: the target's (F = H; EAGLE-3: 3H) or its parent's output
    block: torch.Tensor  # (B, W, C) bool: column c is the slot's entry base + c; catch-up: causal, expand: the sees rows
    spread: torch.Tensor  # (W,) int64 each row's position past the offset: arange (catch-up) or zeros (siblings)
    catch_up: bool  # based at each slot's catch-up start, returning the root (its last live row) only

    @classmethod
    def allocate(cls, kind: str, batch: int, width: int, feature_width: int, block_width: int, *, dtype,
                 device) -> "HeadStepBuffers":
        catch_up = kind == CATCH_UP
        block = torch.zeros(batch, width, block_width, dtype=torch.bool, device=device)  # (B, W, C)
        if catch_up:
            block[:] = torch.ones(width, width, dtype=torch.bool, device=device).tril_()
        spread = torch.arange(width, device=device) if catch_up else torch.zeros(width, dtype=torch.long, device=device)
        return cls(tokens=torch.zeros(batch, width, dtype=torch.long, device=device),
                   features=torch.zeros(batch, width, feature_width, dtype=dtype, device=device), block=block,
                   spread=spread, catch_up=catch_up)


class CapturedHead:
    """Runs the head's steps as :class:`StepGraphs` steps over its B-slot draft cache: each catch-up width's, keyed
    (catch_up, W), and the whole draft's, keyed (draft, None): ``rule.grow`` from the root's output and logits,
    every expansion depth a forward of the same step code (:meth:`expand`), one graph for all of it.

    A forward's W rows per slot attend over the slot's whole cache row (``(B, W, S)`` mask built inside the step
    from the per-slot scalars, the draft nodes written before and ``block``) and are written after the slot's base
    entry (its catch-up start, or its committed entries plus the draft nodes written before), so each step has one
    shape. The host keeps each slot's lengths and writes the three per-slot scalars once per propose
    (:meth:`set_slots`; queued ahead of the host's reads, :meth:`follow` forms them on the device); a catch-up row
    past a slot's own count (padding to the widest slot) writes the cache's last
    entry, a scratch entry no live row sees. A cache that is reallocated (it grew) drops every graph, which read its
    address.
    """

    def __init__(self, head: EagleHead, embedding: nn.Module, logits: Callable[[torch.Tensor], torch.Tensor],
                 graphs: StepGraphs, *, batch_size: int, expansion_slots: int, rule: DraftingRule,
                 ops: StepOps = EAGER_OPS):
        self.head, self.embedding, self.logits, self.graphs, self.rule = head, embedding, logits, graphs, rule
        self.ops = ops  # the draft forward's pointwise stages: the target's, compiled beside a compiling target
        self.expansion_slots = expansion_slots  # C of the expand kind: the most draft nodes one propose writes
        self.cache = head.new_batched_cache(batch_size)  # (2, B, KVH, S, D) with host-known per-slot lengths
        device = self.cache.kv.device
        self.slots = torch.zeros(3, batch_size, dtype=torch.long, device=device)  # (3, B) START, LAST, COMMITTED
        self._rows = torch.arange(batch_size, device=device)  # (B,)
        self.buffers: dict[tuple[str, int], HeadStepBuffers] = {}
        self._roots: tuple[torch.Tensor, torch.Tensor] | None = None  # the draft step's inputs: root (B, H), (B, V)
        self._kv: torch.Tensor | None = None  # the cache tensor the graphs were captured over
        self._entries: torch.Tensor | None = None  # (S,)
        self.prepared_over: torch.Tensor | None = None  # the cache tensor whose graphs the proposer prepared
        # compiled: each traced at its first (warm-up) run, before its capture; a catch-up once per replayable width
        compiled = COMPILE_DRAFT and ops.compiled
        self.draft_step = compiled_alone(self._grow) if compiled else self._grow
        self.catch_up_step = compiled_alone(self._forward) if compiled else self._forward

    @property
    def enabled(self) -> bool:
        return self.graphs.enabled

    def set_slots(self, starts: list[int], counts: list[int], committed: list[int]) -> None:
        """Each slot's catch-up start and row count and its committed entries after it, for this propose's steps."""
        self.slots.copy_(host_to_device([starts, [n - 1 for n in counts], committed], self.slots.device))  # (3, B)
        self.reserve(max(committed) + self.expansion_slots)  # every row this propose writes: catch-up, then draft

    def catch_up_states(self, states: dict, feature_width: int, max_depth: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the draft over each slot's positions the target accepted since its last call (``states``: slot ->
        ProposerState), with the target's ``feature_width``-wide features, in one step padded to the widest slot;
        returns the draft's output ``(B, H)`` and logits ``(B, V)`` at each slot's last position (its root's; idle
        rows: anything).

        Draft position i reads ``embed(token_ids[i + 1])`` and ``hidden_states[i]``, from ``start = min(committed,
        T - 2)``: entries past the committed positions (the last draft's nodes) are overwritten, and a call with
        nothing new redoes the last position, so it costs what a step with no accepted token costs
        (docs/eagle.md#catch-up). A slot no longer decoding starts over when it gets a request.
        """
        lengths, batch = self.cache.lengths, self.cache.kv.shape[1]
        starts, counts, parts = [0] * batch, [1] * batch, []
        for slot in range(batch):
            if slot not in states:
                lengths[slot] = 0
        for slot, state in states.items():
            if not 0 <= slot < batch:
                raise ValueError(f"slot {slot} of an EAGLE proposer of {batch} slots; build it for the target's batch "
                                 "size (engine.proposer.for_batch)")
            tokens, features = state.token_ids, state.hidden_states
            need = tokens.numel() - 1  # draft positions 0 .. T - 2, host-known from the view's shape
            if features is None or features.dim() != 2 or features.shape[0] != need or need < 1:
                got = None if features is None else tuple(features.shape)
                raise ValueError(f"the EAGLE proposer needs the target's hidden states ({need}, F) for slot {slot}'s "
                                 f"{tokens.numel()} tokens, got {got}")
            check_features(features, feature_width, slot)
            start = min(lengths[slot], need - 1)
            starts[slot], counts[slot], lengths[slot] = start, need - start, need
            parts.append((slot, tokens[start + 1: need + 1], features[start:need]))  # (n,), (n, F)
        self.set_slots(starts, counts, lengths)
        # a step's catch-up (the accepted tokens and the bonus one) replays its width's graph; a request's first
        # (its prompt: a new width every request) and anything wider run eagerly
        width = max(counts)
        replayable = width <= max_depth + 1 and all(starts[slot] > 0 for slot in states)
        return self.catch_up(parts, width, replayable=replayable)

    def catch_up(self, parts: list[tuple[int, torch.Tensor, torch.Tensor]], width: int, *,
                 replayable: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Each active slot's catch-up rows, ``(slot, tokens (n,), features (n, F))`` of ``parts``, at entries and
        positions ``start + arange(n)``, causal after the start, in one step of ``width`` rows per slot: the root's
        output ``(B, H)`` and logits ``(B, V)`` (its last live row's; idle rows: anything). ``replayable``: a step's
        catch-up, run as its (catch-up, W) step (a graph replay when graphs are on); else once, eagerly over
        buffers of its own (a request's first: its prompt, a new width each)."""
        kv = self.cache.kv
        buffers = self._catch_up_buffers(width, parts[0][2].shape[-1], replayable)
        if len(parts) == 1:  # one slot: two copies, no index to upload
            slot, tokens, features = parts[0]
            buffers.tokens[slot, : tokens.numel()].copy_(tokens)
            buffers.features[slot, : tokens.numel()].copy_(features)
        else:  # rows past a slot's count keep what they held: they write the scratch entry, which no live row sees
            index = scatter_rows(buffers.tokens, [(slot, 0, tokens) for slot, tokens, _ in parts], kv.device)
            scatter_rows(buffers.features, [(slot, 0, features) for slot, _, features in parts], kv.device, index)
        return self.graphs.run((CATCH_UP, width), buffers, self.catch_up_step) if replayable else self._forward(buffers)

    def follow(self, tokens: torch.Tensor, features: torch.Tensor, lengths: torch.Tensor, width: int, *,
               replayable: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`catch_up` formed on the device, for a step queued before the host knows the lengths: slot b's rows
        are its history's positions from ``min(committed, lengths[b] - 2)`` to ``lengths[b] - 2`` (draft position i
        reads ``tokens[b, i + 1]`` and ``features[b, i]``; ``tokens`` ``(B, C)``, ``features`` ``(B, C, F)``,
        ``lengths`` ``(B,)``), ``width`` at least each slot's count; committed becomes ``lengths - 1``."""
        start = torch.minimum(self.slots[COMMITTED], lengths - 2).clamp_min(0)  # (B,)
        last = (lengths - 2 - start).clamp(0, width - 1)  # (B,) idle slots' (any lengths) stay in their rows
        self.slots.copy_(torch.stack([start, last, (lengths - 1).clamp_min(0)]))  # (3, B)
        columns = (start[:, None] + self._entries[None, :width]).clamp(max=tokens.shape[1] - 2)  # (B, W) positions
        buffers = self._catch_up_buffers(width, features.shape[-1], replayable)
        buffers.tokens.copy_(tokens.gather(1, columns + 1))
        buffers.features.copy_(features.gather(1, columns[:, :, None].expand(-1, -1, features.shape[-1])))
        return self.graphs.run((CATCH_UP, width), buffers, self.catch_up_step) if replayable else self._forward(buffers)

    def _catch_up_buffers(self, width: int, feature_width: int, replayable: bool) -> HeadStepBuffers:
        """The (catch-up, W) step's buffers, or (not replayable: a request's first) buffers of its own."""
        if replayable:
            return self._buffers(CATCH_UP, width, feature_width, width)
        kv = self.cache.kv
        return HeadStepBuffers.allocate(CATCH_UP, kv.shape[1], width, feature_width, width, dtype=kv.dtype,
                                        device=kv.device)

    def draft(self, root_hidden: torch.Tensor, root_logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The rule's tensors grown from every slot's root output ``(B, H)`` and logits ``(B, V)``: the draft step,
        replayed as one graph when graphs are on (the roots copied into its inputs first)."""
        if self._roots is None:
            self._roots = (torch.empty_like(root_hidden), torch.empty_like(root_logits))
        self._roots[0].copy_(root_hidden)
        self._roots[1].copy_(root_logits)
        return self.graphs.run((DRAFT, None), self._roots, self.draft_step)

    def _grow(self, roots: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """The draft step: device ops only (what a graph captures), every expansion through :meth:`expand`."""
        return self.rule.grow(roots[0], roots[1], self.expand)

    def expand(self, tokens: torch.Tensor, features: torch.Tensor, depth: int,
               sees: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The drafting rules' expander (eagle/expansion.py): ``W`` nodes per slot at ``depth``, written after the
        slot's committed entries and the draft nodes before them; outputs ``(B, W, H)``, logits ``(B, W, V)``.
        Every depth's widths and offsets are the rule's constants, so a captured draft replays them as they are."""
        width = tokens.shape[1]
        if sees.shape[-1] > self.expansion_slots:
            raise ValueError(f"an expansion sees {sees.shape[-1]} draft nodes; the step holds {self.expansion_slots}")
        buffers = self._buffers(EXPAND, width, features.shape[-1], self.expansion_slots)
        buffers.block[:, :, : sees.shape[-1]].copy_(sees)  # columns beyond begin + W are masked inside the step
        buffers.tokens.copy_(tokens)
        buffers.features.copy_(features)
        # begin: the draft nodes written before these; siblings sit at the root's position + depth
        return self._forward(buffers, begin=sees.shape[-1] - width, offset=depth - 1)

    def _buffers(self, kind: str, width: int, feature_width: int, block_width: int) -> HeadStepBuffers:
        buffers = self.buffers.get((kind, width))
        if buffers is None or buffers.features.shape[-1] != feature_width:
            buffers = self.buffers[(kind, width)] = HeadStepBuffers.allocate(
                kind, self.cache.kv.shape[1], width, feature_width, block_width, dtype=self.cache.kv.dtype,
                device=self.cache.kv.device)
        return buffers

    def reserve(self, entries: int) -> None:
        """Room for ``entries`` per slot, the scratch entry beyond; a new cache tensor drops the graphs over the old."""
        self.cache.reserve(entries + 1)
        if self.cache.kv is not self._kv:
            self.graphs.drop()
            self.prepared_over = None  # and holds no reference to the old cache
            self._kv = self.cache.kv
            self._entries = torch.arange(self.cache.capacity, device=self._kv.device)  # (S,)

    def _forward(self, buffers: HeadStepBuffers, begin: int = 0, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """One fixed-shape draft forward over ``buffers`` (device tensors only), ``begin`` draft nodes written before
        its rows, which sit at positions ``offset`` past the base's (an expansion's; a catch-up's are 0)."""
        entries, kv, scratch = self._entries, self._kv, self._kv.shape[3] - 1  # (S,), (2, B, KVH, S, D)
        batch, width, block_width = buffers.block.shape
        base = self.slots[START if buffers.catch_up else COMMITTED]  # (B,)
        relative = entries[None, :] - base[:, None]  # (B, S) block column of each entry
        live = (relative >= 0) & (relative < begin + width)  # (B, S) the draft's entries, this step's included
        index = relative.clamp(0, block_width - 1)[:, None, :].expand(batch, width, -1)  # (B, W, S)
        mask = (relative < 0)[:, None, :] | (live[:, None, :] & buffers.block.gather(2, index))  # (B, W, S)
        rows = base[:, None] + begin + entries[None, :width]  # (B, W) where the rows' keys go
        if buffers.catch_up:  # rows past a slot's own count go to the scratch entry
            rows = torch.where(entries[None, :width] <= self.slots[LAST][:, None], rows, scratch)
        positions = base[:, None] + offset + buffers.spread  # (B, W)
        embeds = self.embedding(buffers.tokens)  # (B, W, H)
        hidden = self.head.step_batched(embeds, buffers.features, positions, rows, mask, kv, self.ops)  # (B, W, H)
        if buffers.catch_up:
            root = hidden[self._rows, self.slots[LAST]]  # (B, H)
            return root, self.logits(root)  # (B, H), (B, V)
        return hidden, self.logits(hidden.flatten(0, 1)).view(batch, width, -1)  # (B, W, H), (B, W, V)
