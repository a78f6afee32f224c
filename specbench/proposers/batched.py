"""A proposer's form for B slots: a slot proposer rebuilt for B, n-gram and any other per-sequence proposer per slot."""

from __future__ import annotations

from typing import Callable

from specbench.engine.proposer import Proposer, SlotProposer, PerSlotProposer
from specbench.proposers.ngram import NgramProposer


def for_batch(proposer: Proposer | SlotProposer | None, batch_size: int, factory: Callable[[], Proposer] | None = None):
    """``proposer`` for ``batch_size`` slots: a slot proposer (Medusa, the draft model, EAGLE-1/2/3) through its
    ``with_batch_size``; n-gram one per slot with its settings; anything else one per slot from ``factory`` (a
    proposer keeps per-request state, so one instance cannot serve two slots)."""
    if proposer is None and factory is None:
        return None
    if isinstance(proposer, SlotProposer):
        return proposer.with_batch_size(batch_size)
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
