"""Token-id prompts for tokenizer-less tiny targets (tests, the no-download demo)."""

from __future__ import annotations

import torch


def synthetic_prompts(num_prompts: int, vocab_size: int = 256, seed: int = 0, phrase_len: int = 6) -> list[list[int]]:
    """A random phrase, noise, the phrase again, so prompt lookup has something to find (random
    weights make any acceptance incidental). The same seed gives the same prompts."""
    gen = torch.Generator().manual_seed(seed)
    prompts = []
    for _ in range(num_prompts):
        phrase = torch.randint(0, vocab_size, (phrase_len,), generator=gen)  # (P,)
        noise = torch.randint(0, vocab_size, (phrase_len // 2,), generator=gen)  # (P/2,)
        prompts.append(torch.cat([phrase, noise, phrase, phrase[: phrase_len // 2]]).tolist())
    return prompts
