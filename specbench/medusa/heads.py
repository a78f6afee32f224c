"""Medusa heads as an nn.Module: per head, L residual blocks then a vocab projection (docs/checkpoints.md).

Head i reads the target's final hidden state at position t and predicts token t + i + 2 (the
target's own lm_head predicts t + 1). "Version 2" heads have no vocab projection of their own and
reuse the target's lm_head.
"""

from __future__ import annotations

import torch
from torch import nn

from specbench.checkpoints.medusa_config import MedusaHeadsConfig


class ResBlock(nn.Module):
    """x + SiLU(Linear(x)); the Linear has a bias and starts at zero (identity block)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size, bias=True)
        nn.init.zeros_(self.linear.weight)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))  # (..., H)


class MedusaHeads(nn.Module):
    def __init__(self, config: MedusaHeadsConfig):
        super().__init__()
        self.config = config
        self.blocks = nn.ModuleList(
            nn.Sequential(*[ResBlock(config.hidden_size) for _ in range(config.num_layers)])
            for _ in range(config.num_heads)
        )
        self.lm_heads = (
            nn.ModuleList(nn.Linear(config.hidden_size, config.vocab_size, bias=False) for _ in range(config.num_heads))
            if config.has_vocab_projection
            else None
        )

    def forward(self, hidden_states: torch.Tensor, base_lm_head: nn.Module | None = None) -> torch.Tensor:
        """(..., H) final hidden states -> (num_heads, ..., V) logits."""
        if self.lm_heads is None and base_lm_head is None:
            raise ValueError("these Medusa heads have no vocab projection (version 2); pass the target's lm_head")
        logits = []
        for h, blocks in enumerate(self.blocks):
            x = blocks(hidden_states)  # (..., H)
            projection = self.lm_heads[h] if self.lm_heads is not None else base_lm_head
            logits.append(projection(x))  # (..., V)
        return torch.stack(logits)  # (num_heads, ..., V)

    def init_from_lm_head(self, lm_head_weight: torch.Tensor) -> None:
        """Start every vocab projection from the target's lm_head (Medusa's initialisation)."""
        if self.lm_heads is not None:
            for projection in self.lm_heads:
                projection.weight.data.copy_(lm_head_weight)
