"""An oracle proposer for tests and benchmarks: it drafts a known continuation (usually the target's
own greedy output), wrong exactly where asked — at chosen output positions, or at random with a
given probability per draft position — so acceptance is known in advance."""

from __future__ import annotations

import random

import torch

from specbench.engine.draft import Draft
from specbench.engine.proposer import Proposer, ProposerState


class ScriptedProposer(Proposer):
    name = "scripted"

    def __init__(
        self,
        truth: list[int],
        num_speculative_tokens: int,
        vocab_size: int,
        *,
        wrong_positions: set[int] | frozenset[int] = frozenset(),
        position_accuracy: tuple[float, ...] | None = None,
        seed: int = 0,
    ):
        """``truth[j]`` is output token j; ``wrong_positions`` are output indices drafted wrong;
        ``position_accuracy[i]`` is the chance draft position i is right (the last entry repeats)."""
        self.truth, self.k, self.vocab_size = list(truth), num_speculative_tokens, vocab_size
        self.wrong_positions, self.position_accuracy = set(wrong_positions), position_accuracy
        self.rng = random.Random(seed)
        self.prompt_len = 0

    @classmethod
    def from_options(cls, target, *, truth: list[int], num_speculative_tokens: int, **options) -> "ScriptedProposer":
        return cls(truth, num_speculative_tokens, target.vocab_size, **options)

    @property
    def max_draft_tokens(self) -> int:
        return self.k

    def begin_request(self, prompt_ids: torch.Tensor) -> None:
        self.prompt_len = prompt_ids.numel()

    def _is_wrong(self, output_index: int, draft_position: int) -> bool:
        if output_index in self.wrong_positions:
            return True
        if self.position_accuracy is None:
            return False
        accuracy = self.position_accuracy[min(draft_position, len(self.position_accuracy) - 1)]
        return self.rng.random() >= accuracy

    def propose(self, state: ProposerState) -> Draft:
        emitted = state.token_ids.numel() - self.prompt_len
        tokens = []
        for i in range(self.k):
            j = emitted + i
            true_token = self.truth[j] if j < len(self.truth) else 0
            tokens.append((true_token + 1) % self.vocab_size if self._is_wrong(j, i) else true_token)
        return Draft.chain(torch.tensor(tokens))
