"""Greedy speculative decoding must reproduce plain greedy decoding token for token (fp32)."""

from __future__ import annotations

import pytest

from specbench.engine.decode import Decoder, GenerationConfig
from specbench.proposers import create_proposer
from specbench.proposers.scripted import ScriptedProposer
from _prompts import random_prompt, repetitive_prompt

MAX_NEW = 48


def predicted_counts(k: int, wrong: set[int], max_new: int) -> tuple[int, int, list[int]]:
    """Replay the loop on paper: each step accepts the leading correct draft tokens, emits one more."""
    emitted, drafts, accepted, per_position = 1, 0, 0, [0] * k
    while emitted < max_new:
        run = 0
        while run < k and emitted + run not in wrong:
            run += 1
        drafts += 1
        accepted += run
        for i in range(run):
            per_position[i] += 1
        emitted += run + 1
    return drafts, accepted, per_position


@pytest.fixture(scope="module")
def plain_outputs(tiny_model):
    from specbench.engine.hf_target import HFTarget

    target = HFTarget(tiny_model)
    decoder = Decoder(target, None, GenerationConfig(max_new_tokens=MAX_NEW + 8))
    prompts = [repetitive_prompt(seed) for seed in range(3)] + [random_prompt(17, 7)]
    return prompts, [decoder.generate(p).output_token_ids for p in prompts]


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_ngram_matches_plain_greedy(tiny_target, plain_outputs, k):
    prompts, truths = plain_outputs
    proposer = create_proposer("ngram", tiny_target, num_speculative_tokens=k)
    decoder = Decoder(tiny_target, proposer, GenerationConfig(max_new_tokens=MAX_NEW))
    drafted = 0
    for prompt, truth in zip(prompts, truths):
        result = decoder.generate(prompt)
        assert result.output_token_ids == truth[:MAX_NEW]
        counters = result.counters
        assert counters.num_draft_tokens <= k * counters.num_drafts  # a chain step drafts at most K
        drafted += counters.num_drafts
    assert drafted > 0, "the repetitive prompts must give the n-gram proposer something to draft"


@pytest.mark.parametrize(
    ("k", "wrong"),
    [(1, set()), (3, {2, 3, 10, 11, 12}), (5, {1, 7, 20, 21, 33}), (4, set(range(0, MAX_NEW + 8, 3)))],
)
def test_oracle_with_injected_errors_gives_predicted_counts(tiny_target, plain_outputs, k, wrong):
    prompts, truths = plain_outputs
    prompt, truth = prompts[3], truths[3]
    proposer = ScriptedProposer(truth, k, tiny_target.vocab_size, wrong_positions=wrong)
    result = Decoder(tiny_target, proposer, GenerationConfig(max_new_tokens=MAX_NEW)).generate(prompt)
    assert result.output_token_ids == truth[:MAX_NEW]
    drafts, accepted, per_position = predicted_counts(k, wrong, MAX_NEW)
    assert result.counters.num_drafts == drafts
    assert result.counters.num_draft_tokens == drafts * k  # fixed draft length, never shortened
    assert result.counters.num_accepted_tokens == accepted
    assert result.counters.accepted_per_position == per_position
    assert result.counters.mean_acceptance_length == pytest.approx(1 + accepted / drafts)


def test_matches_transformers_generate(tiny_model, tiny_target):
    """Cross-check with an implementation nobody here wrote: transformers' own generate."""
    for seed in range(3):
        prompt = repetitive_prompt(seed)
        reference = tiny_model.generate(prompt[None], max_new_tokens=MAX_NEW, do_sample=False)[0, prompt.numel() :]
        plain = Decoder(tiny_target, None, GenerationConfig(max_new_tokens=MAX_NEW)).generate(prompt)
        assert plain.output_token_ids == reference.tolist()  # plain steps in blocks, each fed on the device
        for k in (1, 3, 5):
            lookup = tiny_model.generate(
                prompt[None], max_new_tokens=MAX_NEW, do_sample=False, prompt_lookup_num_tokens=k
            )[0, prompt.numel() :]
            ours = Decoder(
                tiny_target,
                create_proposer("ngram", tiny_target, num_speculative_tokens=k),
                GenerationConfig(max_new_tokens=MAX_NEW),
            ).generate(prompt)
            assert ours.output_token_ids == reference.tolist() == lookup.tolist()


def test_eos_stops_and_ignore_eos_continues(tiny_target, plain_outputs):
    prompts, truths = plain_outputs
    prompt, truth = prompts[0], truths[0]
    eos = truth[5]
    first_eos = truth.index(eos)
    config = GenerationConfig(max_new_tokens=MAX_NEW, eos_token_ids=(eos,))
    for proposer in (None, create_proposer("ngram", tiny_target, num_speculative_tokens=4)):
        result = Decoder(tiny_target, proposer, config).generate(prompt)
        assert result.output_token_ids == truth[: first_eos + 1]
        assert result.finish_reason == "eos"
    config = GenerationConfig(max_new_tokens=MAX_NEW, eos_token_ids=(eos,), ignore_eos=True)
    result = Decoder(tiny_target, None, config).generate(prompt)
    assert result.output_token_ids == truth[:MAX_NEW]
    assert result.finish_reason == "length"


def test_plain_decoding_counts_no_drafts(tiny_target):
    result = Decoder(tiny_target, None, GenerationConfig(max_new_tokens=10)).generate(random_prompt(5, 1))
    assert len(result.output_token_ids) == 10
    assert result.counters.num_drafts == 0
    assert result.counters.mean_acceptance_length == 1.0  # plain decoding scores 1.00 (docs/metrics.md)
    assert result.counters.num_target_forwards == 9  # the prefill gives the first token


@pytest.mark.parametrize(("accuracy", "expected_rate"), [((1.0,), 1.0), ((0.0,), 0.0)])
def test_scripted_position_accuracy_bounds(tiny_target, plain_outputs, accuracy, expected_rate):
    """Always right accepts every draft token; never right accepts none; the output stays lossless."""
    prompts, truths = plain_outputs
    proposer = ScriptedProposer(truths[3], 3, tiny_target.vocab_size, position_accuracy=accuracy)
    result = Decoder(tiny_target, proposer, GenerationConfig(max_new_tokens=MAX_NEW)).generate(prompts[3])
    assert result.output_token_ids == truths[3][:MAX_NEW]
    assert result.counters.acceptance_rate == expected_rate
