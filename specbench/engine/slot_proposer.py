"""The proposer protocol of B slots, and its per-slot form: any per-sequence Proposer once per slot (batched
forms of particular proposers live in specbench.proposers.batched)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable

import torch

from specbench.compile_watch import capture_seconds
from specbench.engine.draft import Draft
from specbench.engine.proposer import Proposer, ProposerState


class SlotProposer(ABC):
    """Drafts for the active slots of a batch; ``propose`` maps slot -> state to slot -> draft (None: a plain step)."""

    needs_hidden_states: bool = False

    @property
    @abstractmethod
    def max_draft_tokens(self) -> int:
        """Most draft nodes one slot's step can propose (sizes the cache and the verify width)."""

    def reserve(self, num_tokens: int) -> None:
        """Size per-slot preallocated state for requests of up to ``num_tokens`` tokens."""

    def begin_request(self, slot: int, prompt_ids: torch.Tensor) -> None:
        """A new request ``(T,)`` enters ``slot``: reset that slot's state."""

    @abstractmethod
    def propose(self, states: dict[int, ProposerState]) -> dict[int, Draft | None]:
        """One draft (or None) per active slot."""

    def describe(self) -> dict:
        return {"name": "batched"}

    def with_batch_size(self, batch_size: int) -> "SlotProposer":
        """This proposer for ``batch_size`` slots (a registry's slot proposer is built for its target's)."""
        raise NotImplementedError(f"{type(self).__name__} is built for its batch size; it has no with_batch_size")


class PerSlotProposer(SlotProposer):
    """One per-sequence :class:`Proposer` per slot, called in turn (n-gram on each slot's host mirror, and any
    proposer without a batched form: docs/batching.md)."""

    def __init__(self, proposers: list[Proposer]):
        if not proposers:
            raise ValueError("PerSlotProposer needs one proposer per slot, got none")
        if len({id(p) for p in proposers}) != len(proposers):
            raise ValueError("PerSlotProposer needs a distinct proposer per slot (each keeps its slot's state); "
                             "build them with PerSlotProposer.build(factory, batch_size)")
        self.proposers = proposers
        self.needs_hidden_states = any(p.needs_hidden_states for p in proposers)

    @classmethod
    def build(cls, factory: Callable[[], Proposer], batch_size: int) -> "PerSlotProposer":
        return cls([factory() for _ in range(batch_size)])

    @property
    def max_draft_tokens(self) -> int:
        return max(p.max_draft_tokens for p in self.proposers)

    @property
    def capture_seconds(self) -> float:
        """Every slot's proposer's graph capture so far (a run checks that none happened while timed)."""
        return capture_seconds(*self.proposers)

    def reserve(self, num_tokens: int) -> None:
        for proposer in self.proposers:
            proposer.reserve(num_tokens)

    def begin_request(self, slot: int, prompt_ids: torch.Tensor) -> None:
        self.proposers[slot].begin_request(prompt_ids)

    def propose(self, states: dict[int, ProposerState]) -> dict[int, Draft | None]:
        return {slot: self.proposers[slot].propose(state) for slot, state in states.items()}

    def describe(self) -> dict:
        return {**self.proposers[0].describe(), "batching": "per-slot"}
