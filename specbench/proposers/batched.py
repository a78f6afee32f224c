"""Batched forms of the runtime proposers: Medusa heads run once over all slots; n-gram and the rest one per slot."""

from __future__ import annotations

from typing import Callable

import torch

from specbench.engine.batched_proposers import BatchedProposer, PerSlotProposer
from specbench.engine.draft import Draft
from specbench.engine.proposer import Proposer, ProposerState
from specbench.proposers.medusa import MedusaProposer
from specbench.proposers.ngram import NgramProposer


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
