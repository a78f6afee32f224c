"""Decode latency per case with pytest-benchmark (pedantic: fixed rounds, one warm-up round).

``Decoder.generate`` synchronises the device before it returns, so each round's wall time covers
the GPU work. Figures are reported, not asserted: speed is gated by the harness against baselines
recorded on the same hardware class (``specbench run`` / the suites). Under pytest-xdist,
pytest-benchmark disables timing and each benchmark runs once as a smoke test.

What is asserted is what every round must satisfy whatever the machine's speed: the case's prompt
count, the output length and finish reason against ``max_new_tokens`` and the EOS id, the counters
against the number of tokens emitted, identical tokens in every round and (greedy fp32) identical
speculative and plain outputs, and timing figures that are positive and finite.
"""

from __future__ import annotations

import math

import pytest

from specbench.engine.sampling import SamplingParams
from specbench.run.harness import build_proposer, generation_config, load_prompt_ids, load_target
from specbench.pytest_plugin import case_params, skip_unless_available

LATENCY_CASES = [p for p in case_params("medusa") if p.values[0].name in (
    "chain-k3", "tree-63", "chain-k3-cuda-fp32", "tree-63-cuda-bf16", "synth-7b-tree-63-bf16")]

ROUNDS, WARMUP_ROUNDS = 5, 1


def _exact_lossless(case) -> bool:
    """Greedy verification in fp32 promises the plain output token for token; in bf16 a near-tie
    between two logits may round either way in a 1-token and an (N+1)-token forward, so the
    harness reports a match fraction there instead of requiring equality."""
    return SamplingParams(**case.sampling).rule == "greedy" and case.dtype == "float32"


def _check_request(result, *, config, vocab_size: int) -> None:
    """One request's output against the generation config and its own counters and timings."""
    ids = result.output_token_ids
    eos = set() if config.ignore_eos else set(config.eos_token_ids)
    assert all(isinstance(t, int) and 0 <= t < vocab_size for t in ids), f"token outside the vocabulary {vocab_size}: {ids}"
    if result.finish_reason == "length":
        # not stopped early: exactly max_new_tokens tokens, none of them EOS (the first EOS ends decoding)
        assert len(ids) == config.max_new_tokens, (len(ids), config.max_new_tokens)
        assert not eos & set(ids), f"EOS {sorted(eos)} inside an output that ran to max_new_tokens: {ids}"
    else:
        # stopped at EOS: the last token is the EOS id, no earlier one is, and the cap still holds
        assert result.finish_reason == "eos", result.finish_reason
        assert eos, "finish_reason 'eos' with no EOS id configured (or ignore_eos set)"
        assert ids[-1] in eos and not eos & set(ids[:-1]), (sorted(eos), ids)
        assert 1 <= len(ids) <= config.max_new_tokens, (len(ids), config.max_new_tokens)

    counters = result.counters
    # the first token comes from the prefill; every verify forward then emits its accepted draft
    # tokens plus one target token, and the output is cut (max_new_tokens / EOS) only inside the
    # last step, which can add at most its draft depth beyond the cut (0 for plain decoding)
    emitted_by_steps = 1 + counters.num_target_forwards + counters.num_accepted_tokens
    max_depth = len(counters.accepted_per_position)  # the deepest draft verified
    assert 0 <= emitted_by_steps - len(ids) <= max_depth, (emitted_by_steps, len(ids), counters)
    assert counters.num_accepted_tokens <= counters.num_draft_tokens, counters

    timing = result.timing
    assert timing.num_output_tokens == len(ids)
    assert math.isfinite(timing.time_to_first_token_s) and timing.time_to_first_token_s > 0, timing
    # total_s is measured from the same start as the first token, after it
    assert math.isfinite(timing.total_s) and timing.total_s >= timing.time_to_first_token_s, timing
    assert math.isfinite(timing.tokens_per_s) and timing.tokens_per_s > 0, timing
    if len(ids) > 1:  # per-token latency is NaN by definition for a single token
        assert math.isfinite(timing.per_token_latency_s) and timing.per_token_latency_s >= 0, timing


@pytest.mark.parametrize("case", LATENCY_CASES)
@pytest.mark.parametrize("method", ["plain", "speculative"])
def test_decode_latency(case, method, benchmark):
    skip_unless_available(case)
    from specbench.engine.decode import Decoder

    target, tokenizer = load_target(case)
    config = generation_config(case, tokenizer)
    proposer = build_proposer(case, target) if method == "speculative" else None
    decoder = Decoder(target, proposer, config)
    prompts, _ = load_prompt_ids(case, tokenizer, target.vocab_size)
    # every latency case names num_prompts, and load_prompt_ids keeps exactly that many
    assert len(prompts) == case.prompts["num_prompts"], (len(prompts), case.prompts)
    prompt = prompts[0][1]

    rounds = []  # every call's result, so each round is checked, not only the one pedantic returns

    def generate(ids):
        result = decoder.generate(ids)
        rounds.append(result)
        return result

    benchmark.group = case.case_id
    benchmark.extra_info.update(case_id=case.case_id, method=method, device=case.device, dtype=case.dtype)
    result = benchmark.pedantic(generate, args=(prompt,), rounds=ROUNDS, warmup_rounds=WARMUP_ROUNDS, iterations=1)
    benchmark.extra_info["output_tokens"] = len(result.output_token_ids)
    benchmark.extra_info["mean_acceptance_length"] = result.counters.mean_acceptance_length

    # pedantic calls warm-up + rounds x iterations times; disabled (xdist) it calls once
    assert len(rounds) == (1 if benchmark.disabled else WARMUP_ROUNDS + ROUNDS)
    assert result is rounds[-1]
    for each in rounds:
        _check_request(each, config=config, vocab_size=target.vocab_size)
    if benchmark.enabled:
        stats = benchmark.stats.stats
        assert stats.rounds == ROUNDS and math.isfinite(stats.min) and stats.min > 0, stats.as_dict()

    if method == "plain":
        # plain decoding drafts nothing: one forward per token after the first, MAL 1.00 by definition
        assert result.counters.num_drafts == result.counters.num_draft_tokens == 0, result.counters
        assert result.counters.num_target_forwards == len(result.output_token_ids) - 1, result.counters
        assert result.counters.mean_acceptance_length == 1.0
    else:
        # a Medusa proposer drafts in every step, and a step runs unless the first token ended the request
        assert result.counters.num_drafts == result.counters.num_target_forwards, result.counters
        assert (result.counters.num_target_forwards == 0) == (len(result.output_token_ids) == 1), result.counters

    if _exact_lossless(case):
        # same prompt, same seed, deterministic fp32 kernels: every round emits the same tokens ...
        assert all(r.output_token_ids == result.output_token_ids for r in rounds), [r.output_token_ids for r in rounds]
        if method == "speculative":
            # ... and greedy verification is lossless: the plain output, token for token
            plain = Decoder(target, None, config).generate(prompt)
            assert result.output_token_ids == plain.output_token_ids, (result.output_token_ids, plain.output_token_ids)
            assert result.finish_reason == plain.finish_reason
