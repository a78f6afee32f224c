"""The n-gram proposer's host mirror (issue #12): the same drafts as a full-history lookup over a
whole decode, a per-step host copy of the new tokens only, and a reset per request."""

from __future__ import annotations

import pytest
import torch

from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.proposer import ProposerState
from specbench.engine.sampling import SamplingParams
from specbench.proposers.ngram import NgramProposer
from _prompts import random_prompt, repetitive_prompt


def reference_draft(context: torch.Tensor, k: int, min_n: int, max_n: int) -> list[int] | None:
    """The lookup as it was before the mirror: the whole history copied to the host each step."""
    context = context.cpu()  # (T,)
    length = context.numel()
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = context[length - n :]  # (n,)
        windows = context[: length - 1].unfold(0, n, 1)  # (T - n, n): every earlier n-gram
        starts = (windows == suffix).all(dim=1).nonzero().flatten()
        if starts.numel():
            begin = int(starts[-1]) + n
            return context[begin : begin + k].tolist()
    return None


class Recording(NgramProposer):
    """Checks every draft against the reference, on the full history it was given."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.steps = 0
        self.drafted = 0

    def propose(self, state):
        expected = reference_draft(state.token_ids, self.k, self.min_n, self.max_n)
        draft = super().propose(state)
        got = None if draft is None else draft.tokens.tolist()
        assert got == expected, f"step {self.steps}: mirror drafted {got}, full history gives {expected}"
        self.steps += 1
        self.drafted += draft is not None
        return draft


@pytest.mark.parametrize(("k", "min_n", "max_n"), [(3, 1, 3), (5, 2, 4), (1, 1, 1)])
@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.9)])
def test_drafts_equal_the_full_history_lookup(tiny_target, k, min_n, max_n, sampling):
    proposer = Recording(num_speculative_tokens=k, min_n=min_n, max_n=max_n)
    decoder = Decoder(tiny_target, proposer, GenerationConfig(max_new_tokens=40, sampling=sampling, seed=3))
    for prompt in (repetitive_prompt(0), repetitive_prompt(1), random_prompt(11, 5)):
        decoder.generate(prompt)  # the same proposer across requests, as the harness runs it
    if sampling.is_greedy or min_n == 1:  # a sampled output may never repeat a bigram of the prompt
        assert proposer.drafted > 0, "the repetitive prompts must give the proposer something to draft"


def test_random_histories_match_the_reference():
    """Histories over a 4-token vocabulary, grown by 1-4 tokens a step: many matches and ties."""
    gen = torch.Generator().manual_seed(0)
    for case in range(30):
        proposer = NgramProposer(num_speculative_tokens=1 + case % 4, min_n=1 + case % 2, max_n=2 + case % 3)
        history = torch.randint(0, 4, (1 + case % 5,), generator=gen)
        proposer.begin_request(history)
        for _ in range(25):
            history = torch.cat([history, torch.randint(0, 4, (int(torch.randint(1, 5, (1,), generator=gen)),), generator=gen)])
            draft = proposer.propose(ProposerState(token_ids=history))
            got = None if draft is None else draft.tokens.tolist()
            assert got == reference_draft(history, proposer.k, proposer.min_n, proposer.max_n)


def test_each_step_copies_only_the_new_tokens(tiny_target, monkeypatch):
    """Every host copy inside propose is recorded: per step exactly the tokens emitted since the last."""
    copies: list[int] = []
    inside = [False]
    original_tolist, original_cpu = torch.Tensor.tolist, torch.Tensor.cpu

    def tolist(self):
        if inside[0]:
            copies.append(self.numel())
        return original_tolist(self)

    def cpu(self, *args, **kwargs):
        assert not inside[0], "propose copied a tensor to the host with .cpu()"
        return original_cpu(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "tolist", tolist)
    monkeypatch.setattr(torch.Tensor, "cpu", cpu)

    class Measured(NgramProposer):
        def __init__(self):
            super().__init__(num_speculative_tokens=3)
            self.lengths: list[int] = []  # the history length at each propose
            self.copied: list[int] = []  # tokens copied to the host at each propose

        def propose(self, state):
            before = len(copies)
            inside[0] = True
            try:
                draft = super().propose(state)
            finally:
                inside[0] = False
            self.lengths.append(state.token_ids.numel())
            self.copied.append(sum(copies[before:]))
            return draft

    proposer = Measured()
    prompt = repetitive_prompt(2)
    result = Decoder(tiny_target, proposer, GenerationConfig(max_new_tokens=40)).generate(prompt)
    assert result.counters.num_accepted_tokens > 0  # steps emitted several tokens, so the sizes vary
    previous = [prompt.numel()] + proposer.lengths[:-1]
    assert proposer.copied == [now - before for now, before in zip(proposer.lengths, previous)]
    assert max(proposer.copied) <= proposer.k + 1  # a step emits at most K + 1 tokens


def test_begin_request_resets_the_mirror():
    proposer = NgramProposer(num_speculative_tokens=2)
    first = torch.tensor([1, 2, 3, 1, 2, 3, 1])
    proposer.begin_request(first[:5])
    assert proposer.propose(ProposerState(token_ids=first)).tokens.tolist() == [2, 3]
    # a second request of the same length but different tokens: nothing of the first may survive
    second = torch.tensor([7, 8, 9, 7, 5, 6, 4])
    proposer.begin_request(second[:5])
    assert proposer._history == [7, 8, 9, 7, 5]
    assert proposer.propose(ProposerState(token_ids=second)) is None  # 4 never occurred before
    assert proposer._history == second.tolist()
    # and a longer one that would reuse stale index entries if the reset were missing
    third = torch.tensor([4, 9, 9, 1, 2])
    proposer.begin_request(third[:3])
    assert proposer.propose(ProposerState(token_ids=third)) is None  # (1, 2), (2) are new to this request
    assert proposer._history == third.tolist()
