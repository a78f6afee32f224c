"""Proposers: one file each, behind the protocol in :mod:`specbench.engine.proposer`; found through ``registry.py``."""

from specbench.engine.proposer import Proposer, ProposerState
from specbench.proposers.registry import available_proposers, create_proposer, get_proposer_class, register_proposer

__all__ = [
    "Proposer",
    "ProposerState",
    "available_proposers",
    "create_proposer",
    "get_proposer_class",
    "register_proposer",
]
