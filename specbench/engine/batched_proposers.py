"""Proposers for B slots: Medusa heads batched over all slots, any single-sequence Proposer once per slot."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable

import torch

from specbench.engine.draft import Draft
from specbench.engine.proposer import Proposer, ProposerState


class BatchedProposer(ABC):
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


class PerSlotProposer(BatchedProposer):
    """One single-sequence :class:`Proposer` per slot, called in turn (n-gram on each slot's host mirror; the
    draft model and EAGLE unbatched for now: docs/batching.md)."""

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

    def reserve(self, num_tokens: int) -> None:
        for proposer in self.proposers:
            proposer.reserve(num_tokens)

    def begin_request(self, slot: int, prompt_ids: torch.Tensor) -> None:
        self.proposers[slot].begin_request(prompt_ids)

    def propose(self, states: dict[int, ProposerState]) -> dict[int, Draft | None]:
        return {slot: self.proposers[slot].propose(state) for slot, state in states.items()}

    def describe(self) -> dict:
        return {**self.proposers[0].describe(), "batching": "per-slot"}


class BatchedMedusaProposer(BatchedProposer):
    """A :class:`~specbench.proposers.medusa.MedusaProposer`'s heads run once over the ``(n, H)`` last hidden
    states of the n active slots; each slot's chain or tree is then built by the proposer's own code."""

    def __init__(self, medusa):
        self.medusa = medusa

    @property
    def max_draft_tokens(self) -> int:
        return self.medusa.max_draft_tokens

    @torch.inference_mode()
    def propose(self, states: dict[int, ProposerState]) -> dict[int, Draft | None]:
        if not states:
            return {}
        slots = list(states)
        if any(states[s].hidden_state is None for s in slots):
            raise ValueError("the Medusa proposer reads each slot's last hidden state, but the decode loop passed none")
        hidden = torch.stack([states[s].hidden_state for s in slots])  # (n, H)
        logits = self.medusa.head_logits(hidden)  # (depth, n, V)
        return {slot: self.medusa.draft_from_logits(logits[:, i]) for i, slot in enumerate(slots)}  # (depth, V) each

    def describe(self) -> dict:
        return {**self.medusa.describe(), "batching": "batched heads"}


def for_batch(proposer: Proposer | None, batch_size: int, factory: Callable[[], Proposer] | None = None):
    """The batched form of a proposer: Medusa batched; n-gram one per slot with its settings; anything else one
    per slot from ``factory`` (a proposer keeps per-request state, so one instance cannot serve two slots)."""
    from specbench.proposers.medusa import MedusaProposer
    from specbench.proposers.ngram import NgramProposer

    if proposer is None and factory is None:
        return None
    if isinstance(proposer, MedusaProposer):
        return BatchedMedusaProposer(proposer)
    if factory is None and isinstance(proposer, NgramProposer):
        settings = proposer.describe()
        factory = lambda: NgramProposer(settings["num_speculative_tokens"], settings["min_n"], settings["max_n"])  # noqa: E731
    if factory is None:
        raise ValueError(f"proposer {type(proposer).__name__} keeps per-request state and has no batched form: pass "
                         "factory= (a callable building one per slot) to run it per slot")
    return PerSlotProposer.build(factory, batch_size)
