"""Random Medusa heads for the engine tests: decisive enough (std 0.2, biases 0.5) that drafts get accepted."""

from __future__ import annotations

import torch
from torch import nn

from specbench.medusa.heads import MedusaHeads, MedusaHeadsConfig


def random_heads(hidden: int, vocab: int, seed: int = 1) -> MedusaHeads:
    """Five one-layer heads over ``hidden``-wide states and ``vocab`` tokens, seeded without touching the global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        heads = MedusaHeads(MedusaHeadsConfig(5, 1, hidden, vocab, True))
        for name, p in heads.named_parameters():
            nn.init.normal_(p, std=0.5 if name.endswith("bias") else 0.2)
    return heads
