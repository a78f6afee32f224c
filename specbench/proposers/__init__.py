"""Proposers: one file each, behind the slot (per batch) or per-sequence protocol of :mod:`specbench.engine.proposer`;
found through ``registry.py``."""

from specbench.engine.proposer import ProposerState, Proposer, SlotProposer
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
