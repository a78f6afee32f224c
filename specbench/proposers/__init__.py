"""Proposers: one file each, behind a per-sequence (:mod:`specbench.engine.proposer`) or per-batch
(:mod:`specbench.engine.slot_proposer`) protocol; found through ``registry.py``."""

from specbench.engine.proposer import Proposer, ProposerState
from specbench.engine.slot_proposer import SlotProposer
from specbench.proposers.registry import available_proposers, create_proposer, get_proposer_class, register_proposer

__all__ = [
    "Proposer",
    "ProposerState",
    "SlotProposer",
    "available_proposers",
    "create_proposer",
    "get_proposer_class",
    "register_proposer",
]
