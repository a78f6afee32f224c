"""bench/device_oracle.py: an oracle drafting on the device, its steps queued ahead, accepts every draft and
decodes exactly the greedy continuation (a CPU test of the bench's proposer, queued ahead as on a GPU)."""

from __future__ import annotations

import pytest

from _bench_scripts import load_bench_script
from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.static_target import StaticTarget
from test_batched_engine import tiny_llama_model
from _prompts import random_prompt, repetitive_prompt

DeviceOracle = load_bench_script("device_oracle").DeviceOracle


@pytest.mark.parametrize("k", [3, 5])
@pytest.mark.parametrize("ahead", [True, False])
def test_every_draft_is_accepted_and_the_tokens_are_plain_greedy(k, ahead):
    static = StaticTarget.from_hf_model(tiny_llama_model())
    config = GenerationConfig(max_new_tokens=17, ignore_eos=True)
    for prompt in (repetitive_prompt(0), random_prompt(9, 1)):
        truth = Decoder(static, None, GenerationConfig(max_new_tokens=17 + k + 1, ignore_eos=True)).generate(prompt)
        decoder = Decoder(static, DeviceOracle(truth.output_token_ids, k, static.device), config)
        decoder.queue_ahead = ahead
        result = decoder.generate(prompt)
        assert decoder._ahead == ahead
        assert result.output_token_ids == truth.output_token_ids[:17]
        # 16 tokens after the first in steps of K + 1, every draft accepted (the last step's output truncated)
        assert result.counters.num_accepted_tokens == result.counters.num_draft_tokens == k * -(-16 // (k + 1))


def test_a_rejected_draft_puts_it_out_of_step_which_its_acceptance_shows():
    """A continuation that is wrong at one token: the tokens stay the target's, and acceptance collapses after it."""
    static = StaticTarget.from_hf_model(tiny_llama_model())
    prompt = random_prompt(9, 1)
    truth = Decoder(static, None, GenerationConfig(max_new_tokens=24, ignore_eos=True)).generate(prompt).output_token_ids
    wrong = truth[:2] + [(truth[2] + 1) % static.vocab_size] + truth[3:]
    decoder = Decoder(static, DeviceOracle(wrong, 3, static.device), GenerationConfig(max_new_tokens=20, ignore_eos=True))
    decoder.queue_ahead = True
    result = decoder.generate(prompt)
    assert result.output_token_ids == truth[:20]
    assert result.counters.mean_acceptance_length < 2.0  # K + 1 = 4 only in the first step
