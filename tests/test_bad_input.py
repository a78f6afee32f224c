"""Bad input fails early with a message that names the offending value."""

from __future__ import annotations

import pytest
import torch

from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.draft import Draft
from specbench.engine.sampling import SamplingParams
from specbench.proposers import create_proposer
from _prompts import random_prompt


def test_empty_prompt(tiny_target):
    with pytest.raises(ValueError, match="prompt is empty"):
        Decoder(tiny_target, None, GenerationConfig(max_new_tokens=4)).generate(torch.empty(0, dtype=torch.long))


def test_prompt_longer_than_context(tiny_target):
    too_long = random_prompt(tiny_target.max_context + 1, 0)
    with pytest.raises(ValueError, match=rf"prompt \({too_long.numel()} tokens\).*max context {tiny_target.max_context}"):
        Decoder(tiny_target, None, GenerationConfig(max_new_tokens=4)).generate(too_long)


def test_draft_room_counts_against_the_context(tiny_target):
    proposer = create_proposer("ngram", tiny_target, num_speculative_tokens=5)
    prompt = random_prompt(tiny_target.max_context - 10, 0)
    with pytest.raises(ValueError, match=r"draft tokens per step \(5\)"):
        Decoder(tiny_target, proposer, GenerationConfig(max_new_tokens=8)).generate(prompt)


@pytest.mark.parametrize("k", [0, -2])
def test_k_below_one(tiny_target, k):
    with pytest.raises(ValueError, match=rf"num_speculative_tokens \(K\) must be >= 1, got {k}"):
        create_proposer("ngram", tiny_target, num_speculative_tokens=k)


def test_unknown_proposer(tiny_target):
    with pytest.raises(ValueError, match=r"unknown proposer 'medusaa'.*available: .*ngram"):
        create_proposer("medusaa", tiny_target)


def test_unknown_proposer_option(tiny_target):
    with pytest.raises(ValueError, match=r"proposer 'ngram' does not take option\(s\) 'tree'; it takes: num_spec"):
        create_proposer("ngram", tiny_target, tree="x.json")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -1.0}, "temperature must be >= 0, got -1.0"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\], got 0.0"),
        ({"acceptance": "lenient"}, "acceptance must be one of .* got 'lenient'"),
    ],
)
def test_bad_sampling(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_bad_max_new_tokens():
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1, got 0"):
        GenerationConfig(max_new_tokens=0)


def test_malformed_draft():
    with pytest.raises(ValueError, match=r"must point to an earlier node .*\[0, 2\]"):
        Draft(tokens=torch.tensor([1, 2]), parents=torch.tensor([0, 2]))
