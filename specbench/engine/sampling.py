"""Sampling settings and the target distribution they define (temperature, then top-p)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

ACCEPTANCE_RULES = ("auto", "greedy", "rejection", "typical")


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    # "auto": greedy at temperature 0, else lossless rejection sampling. "typical" is Medusa's
    # typical acceptance: faster, NOT lossless (it changes the output distribution).
    acceptance: str = "auto"
    typical_epsilon: float = 0.09
    typical_delta: float = 0.3

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.acceptance not in ACCEPTANCE_RULES:
            raise ValueError(f"acceptance must be one of {ACCEPTANCE_RULES}, got {self.acceptance!r}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def rule(self) -> str:
        """The acceptance rule actually applied."""
        if self.acceptance == "auto":
            return "greedy" if self.is_greedy else "rejection"
        if self.acceptance == "rejection" and self.is_greedy:
            return "greedy"  # rejection sampling at temperature 0 is greedy verification
        return self.acceptance


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(..., V) logits -> (..., V) float32 probabilities after temperature and top-p."""
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)  # (..., V)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)  # (..., V)
        # keep the smallest prefix whose mass reaches top_p (the token crossing it is kept)
        drop = sorted_probs.cumsum(dim=-1) - sorted_probs >= params.top_p  # (..., V)
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from a (V,) distribution."""
    return int(torch.multinomial(probs, 1, generator=generator))
