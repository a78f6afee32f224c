"""Bad input fails early with a message that names the offending value.

Each message is matched whole (anchored, escaped), not by a fragment, so a message that loses the
value it should name, or gains a stale sentence, fails; where a limit exists, the value just inside
it is shown to pass, so an off-by-one in the check fails too.
"""

from __future__ import annotations

import re

import pytest
import torch

from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.draft import Draft
from specbench.engine.sampling import SamplingParams
from specbench.proposers import create_proposer
from specbench.proposers.registry import ENTRY_POINT_GROUP, available_proposers
from _prompts import random_prompt


def exactly(message: str) -> str:
    """A ``match=`` pattern for this whole message and nothing else."""
    return f"^{re.escape(message)}$"


def context_message(prompt_len: int, max_new_tokens: int, draft_room: int, limit: int, index: int = 0) -> str:
    needed = prompt_len + max_new_tokens + draft_room
    return (
        f"context length exceeded: prompt {index} ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) + draft "
        f"tokens per step ({draft_room}) = {needed} > the target's max context {limit}; shorten the prompt or lower "
        "max_new_tokens"
    )


def empty_message(index: int) -> str:
    return f"prompt {index} is empty: at least one prompt token is needed to start decoding"


def test_empty_prompt(tiny_target):
    decoder = Decoder(tiny_target, None, GenerationConfig(max_new_tokens=4))
    with pytest.raises(ValueError, match=exactly(empty_message(0))):
        decoder.generate(torch.empty(0, dtype=torch.long))
    with pytest.raises(ValueError, match=exactly(empty_message(1))):  # a queue's message names which prompt
        decoder.generate_all([random_prompt(3, 0), torch.empty(0, dtype=torch.long)])


def test_prompt_longer_than_context(tiny_target):
    limit = tiny_target.max_context
    too_long = random_prompt(limit + 1, 0)
    decoder = Decoder(tiny_target, None, GenerationConfig(max_new_tokens=4))
    with pytest.raises(ValueError, match=exactly(context_message(limit + 1, 4, 0, limit))):
        decoder.generate(too_long)
    with pytest.raises(ValueError, match=exactly(context_message(limit + 1, 4, 0, limit, index=2))):
        decoder.generate_all([random_prompt(3, 0), random_prompt(limit - 4, 1), too_long])  # limit - 4 + 4: fits


def test_draft_room_counts_against_the_context(tiny_target):
    limit = tiny_target.max_context
    proposer = create_proposer("ngram", tiny_target, num_speculative_tokens=5)
    decoder = Decoder(tiny_target, proposer, GenerationConfig(max_new_tokens=8))
    # one token over: prompt + 8 new + 5 draft = limit + 1
    with pytest.raises(ValueError, match=exactly(context_message(limit - 12, 8, 5, limit))):
        decoder.generate(random_prompt(limit - 12, 0))
    # exactly at the limit is allowed, and (no EOS configured) runs to max_new_tokens
    result = decoder.generate(random_prompt(limit - 13, 0))
    assert len(result.output_token_ids) == 8 and result.finish_reason == "length"


@pytest.mark.parametrize("k", [0, -2])
def test_k_below_one(tiny_target, k):
    with pytest.raises(ValueError, match=exactly(f"num_speculative_tokens (K) must be >= 1, got {k}")):
        create_proposer("ngram", tiny_target, num_speculative_tokens=k)


def test_k_of_one_is_accepted(tiny_target):
    assert create_proposer("ngram", tiny_target, num_speculative_tokens=1).max_draft_tokens == 1


def test_unknown_proposer(tiny_target):
    available = available_proposers()
    assert {"medusa", "ngram"} <= set(available)  # the built-ins are always listed
    with pytest.raises(ValueError, match=exactly(
        f"unknown proposer 'medusaa'; available: {', '.join(available)}. Third-party proposers register under "
        f"the entry-point group {ENTRY_POINT_GROUP!r}."
    )):
        create_proposer("medusaa", tiny_target)


def test_unknown_proposer_option(tiny_target):
    with pytest.raises(ValueError, match=exactly(
        "proposer 'ngram' does not take option(s) 'tree'; it takes: num_speculative_tokens, min_n, max_n, match"
    )):
        create_proposer("ngram", tiny_target, tree="x.json")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -1.0}, "temperature must be >= 0, got -1.0"),
        ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0"),
        ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5"),
        ({"acceptance": "lenient"}, "acceptance must be one of ('auto', 'greedy', 'rejection', 'typical'), got 'lenient'"),
    ],
)
def test_bad_sampling(kwargs, message):
    with pytest.raises(ValueError, match=exactly(message)):
        SamplingParams(**kwargs)


def test_sampling_limits_are_inclusive_where_documented():
    # temperature 0 (greedy) and top_p 1 (no truncation) are the defaults, so they must be valid
    assert SamplingParams(temperature=0.0, top_p=1.0).rule == "greedy"
    assert SamplingParams(temperature=0.5, top_p=1.0).rule == "rejection"


def test_bad_max_new_tokens():
    with pytest.raises(ValueError, match=exactly("max_new_tokens must be >= 1, got 0")):
        GenerationConfig(max_new_tokens=0)
    assert GenerationConfig(max_new_tokens=1).max_new_tokens == 1  # the smallest valid value


def test_malformed_draft():
    with pytest.raises(ValueError, match=exactly("Draft.parents must point to an earlier node (0 = root), got [0, 2]")):
        Draft(tokens=torch.tensor([1, 2]), parents=torch.tensor([0, 2]))
    with pytest.raises(ValueError, match=exactly(
        "Draft.tokens and Draft.parents must be 1-D of equal length, got shapes (2,) and (3,)"
    )):
        Draft(tokens=torch.tensor([1, 2]), parents=torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=exactly("Draft.draft_probs has 1 rows for 2 draft tokens")):
        Draft.chain(torch.tensor([1, 2]), draft_probs=torch.full((1, 6), 1 / 6))
