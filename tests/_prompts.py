"""Token-id prompts for the engine tests: random, and repetitive so n-gram lookup finds matches."""

from __future__ import annotations

import torch


def random_prompt(length: int, seed: int, vocab_size: int = 256) -> torch.Tensor:
    return torch.randint(0, vocab_size, (length,), generator=torch.Generator().manual_seed(seed))


def repetitive_prompt(seed: int, vocab_size: int = 256) -> torch.Tensor:
    """A prompt that repeats a random phrase, so n-gram lookup finds matches."""
    phrase = random_prompt(6, seed, vocab_size)
    return torch.cat([phrase, random_prompt(3, seed + 100, vocab_size), phrase, phrase[:3]])
