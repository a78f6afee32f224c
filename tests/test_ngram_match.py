"""The n-gram proposer's match rule (docs/conformance.md#n-gram): "latest" drafts after the most recent earlier
occurrence of the longest matching suffix (specbench's rule, the default), "earliest" after the first (vLLM's)."""

from __future__ import annotations

import pytest
import torch

from specbench.engine.proposer import ProposerState
from specbench.proposers import create_proposer
from specbench.proposers.ngram import NgramProposer


def draft(proposer: NgramProposer, context: list[int]) -> list[int] | None:
    found = proposer.propose(ProposerState(token_ids=torch.tensor(context)))
    return None if found is None else found.tokens.tolist()


# [1, 2] occurs at 0 (followed by 9, 9) and at 3 (followed by 8, 7) before the suffix [1, 2]
CONTEXT = [1, 2, 9, 9, 1, 2, 8, 7, 5, 1, 2]


@pytest.mark.parametrize("match, expected", [("latest", [8, 7]), ("earliest", [9, 9])])
def test_the_match_rule_picks_which_occurrence_the_draft_follows(match, expected):
    assert draft(NgramProposer(2, 1, 2, match=match), CONTEXT) == expected


def test_earliest_keeps_the_first_occurrence_as_the_history_grows():
    proposer = NgramProposer(1, 1, 1, match="earliest")
    assert draft(proposer, [4, 5, 4, 6, 4]) == [5]
    assert draft(proposer, [4, 5, 4, 6, 4, 7, 4]) == [5]  # the mirror extended, the index's first start kept
    assert draft(NgramProposer(1, 1, 1), [4, 5, 4, 6, 4, 7, 4]) == [7]


def test_the_longest_match_still_wins_over_an_earlier_shorter_one():
    # [2] alone first occurs at 1, but [3, 2] occurs at 4: n = 2 is tried first under either rule
    assert draft(NgramProposer(1, 1, 2, match="earliest"), [9, 2, 5, 0, 3, 2, 6, 3, 2]) == [6]


def test_an_unknown_match_rule_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"n-gram match = 'newest', expected one of 'latest', 'earliest'"):
        create_proposer("ngram", None, match="newest")
    assert NgramProposer(match="earliest").describe()["match"] == "earliest"
