"""A proposer's form for B slots: slot proposers as they are or rebuilt for B, EAGLE's batched heads, the rest per slot."""

from __future__ import annotations

from typing import Callable

from specbench.engine.slot_proposer import SlotProposer, PerSlotProposer
from specbench.engine.proposer import Proposer
from specbench.proposers.batched_eagle import BatchedEagleProposer
from specbench.proposers.eagle import EagleProposer
from specbench.proposers.ngram import NgramProposer


def for_batch(proposer: Proposer | None, batch_size: int, factory: Callable[[], Proposer] | None = None):
    """``proposer`` for ``batch_size`` slots: a slot proposer as it is (Medusa's heads serve any B) or rebuilt for B
    (``with_batch_size``: the draft model over the same draft weights); EAGLE (EAGLE-1/2/3 heads: chain, static and
    dynamic tree) batched; n-gram one per slot with its settings; anything else one per slot from ``factory`` (a
    proposer keeps per-request state, so one instance cannot serve two slots)."""
    if proposer is None and factory is None:
        return None
    if isinstance(proposer, SlotProposer):
        resize = getattr(proposer, "with_batch_size", None)
        return proposer if resize is None else resize(batch_size)
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
