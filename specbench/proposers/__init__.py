"""Proposers: one file each, behind the small protocol in ``base.py``; found through ``registry.py``."""

from specbench.proposers.base import Proposer, ProposerState
from specbench.proposers.registry import available_proposers, create_proposer, get_proposer_class, register_proposer

__all__ = [
    "Proposer",
    "ProposerState",
    "available_proposers",
    "create_proposer",
    "get_proposer_class",
    "register_proposer",
]
