"""A proposer for B slots: Medusa as it is, greedy draft models and EAGLE heads in batched form; the rest per slot."""

from __future__ import annotations

from typing import Callable

from specbench.engine.slot_proposer import SlotProposer, PerSlotProposer
from specbench.engine.proposer import Proposer
from specbench.proposers.batched_draft import BatchedDraftModelProposer, PerSlotDraftModelProposer
from specbench.proposers.batched_eagle import BatchedEagleProposer
from specbench.proposers.draft_model import DraftModelProposer
from specbench.proposers.eagle import EagleProposer
from specbench.proposers.ngram import NgramProposer


def for_batch(proposer: Proposer | None, batch_size: int, factory: Callable[[], Proposer] | None = None):
    """The batched form of a proposer: Medusa, a greedy draft model and EAGLE (EAGLE-1/2/3 heads: chain, static
    and dynamic tree) batched; n-gram one per slot with its settings; anything else (a sampled draft model, ...)
    one per slot from ``factory`` (a proposer keeps per-request state, so one instance cannot serve two slots)."""
    if proposer is None and factory is None:
        return None
    if isinstance(proposer, SlotProposer):  # Medusa's heads: one form for any number of slots
        return proposer
    if isinstance(proposer, DraftModelProposer):
        batched = BatchedDraftModelProposer.from_proposer(proposer, batch_size)
        if batched is not None:
            return batched
        if factory is not None:
            return PerSlotDraftModelProposer.build(factory, batch_size)
    if isinstance(proposer, EagleProposer):
        return BatchedEagleProposer.from_proposer(proposer, batch_size)
    if factory is None and isinstance(proposer, NgramProposer):
        settings = proposer.describe()
        factory = lambda: NgramProposer(settings["num_speculative_tokens"], settings["min_n"], settings["max_n"],  # noqa: E731
                                        settings["match"])
    if factory is None and batch_size == 1:  # one slot: the proposer itself keeps its one request's state
        return PerSlotProposer([proposer])
    if factory is None:
        raise ValueError(f"proposer {type(proposer).__name__} keeps per-request state and has no batched form: pass "
                         "factory= (a callable building one per slot) to run it per slot")
    return PerSlotProposer.build(factory, batch_size)
