"""rejection_chain_on_device keeps the target distribution exactly (chi-square on the first tokens of
a decode loop over the context-dependent 6-token target of test_rejection_sampling), does one host
transfer per call, and is what the decode loop uses for chains under the rejection rule.

Its random numbers are consumed differently from verify_rejection's (all uniforms of a chain in one
call, the next token by inverting the CDF), so only the distributions are compared, never tokens."""

from __future__ import annotations

import pytest
import torch

import specbench.engine.decode as decode_module
from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.device_verification import rejection_chain_on_device
from specbench.engine.draft import Draft
from specbench.engine.proposer import Proposer
from specbench.engine.sampling import SamplingParams, target_probs
from specbench.proposers.ngram import NgramProposer
from _prompts import repetitive_prompt
from test_rejection_sampling import (
    ALL_LOGITS, LOGITS, P_FLOOR, P_WRONG, Q_CHAIN, exact_pairs, p_value, pair_counts,
)
from test_rejection_sampling import first_tokens as decode_first_tokens

# 8,000 decodes (5,000 with top-p): the cell counts and the chi-square approximation are argued in
# test_rejection_sampling (DEPTH_SAMPLES); every test checks two joints, (t1, t2) and (t2, t3), each
# failing a correct rule below P_FLOOR = 1e-3 with probability 1e-3, so a correct rule fails a test
# with probability <= 2e-3 on a given seed (the seed is fixed). A wrong rule shifting the joint by
# a few percent gives p-values below P_WRONG = 1e-12.
SAMPLES = 8_000
TOP_P_SAMPLES = 5_000


def device_rule(draft: Draft, logits: torch.Tensor, params, gen):
    verify_ids = torch.cat([torch.tensor([0]), draft.tokens])  # the root's id is never read
    return rejection_chain_on_device(draft, verify_ids, logits, params, gen)


def first_tokens(params, *, draft_probs: bool, rule=device_rule, samples: int = SAMPLES, n: int = 3) -> torch.Tensor:
    """(samples, n) first n tokens of the decode loop of test_rejection_sampling, verifying on the device."""
    return decode_first_tokens(params, draft_probs=draft_probs, rule=rule, samples=samples, n=n, seed=2468)


@pytest.mark.parametrize(("params", "samples"), [
    (SamplingParams(temperature=1.0), SAMPLES),
    (SamplingParams(temperature=0.7, top_p=0.9), TOP_P_SAMPLES),
])
@pytest.mark.parametrize("draft_probs", [False, True], ids=["point-mass", "q-chain"])
def test_first_three_tokens_follow_the_target(params, samples, draft_probs):
    tokens = first_tokens(params, draft_probs=draft_probs, samples=samples)
    first_two, second_third = exact_pairs(params)
    assert p_value(pair_counts(tokens, 0), first_two) > P_FLOOR
    assert p_value(pair_counts(tokens, 1), second_third) > P_FLOOR


def _no_residual_rule(draft, logits, params, gen):
    """A classic bug: after a rejection the correction is drawn from p itself, not from the residual
    (the acceptance is the device rule's; only the correction token is replaced)."""
    accepted, next_token, new = device_rule(draft, logits, params, gen)
    if len(accepted) - 1 < len(draft):  # a rejection: draw the correction from the rejecting row p
        next_token = int(torch.multinomial(target_probs(logits[len(accepted) - 1], params), 1, generator=gen))
    return accepted, next_token, new[:-1] + [next_token]


def test_a_wrong_residual_fails_the_same_test():
    """The chi-square test has power: drawing the correction from p instead of the residual fails it."""
    params = SamplingParams(temperature=1.0)
    # the bug over-emits rejected point-mass tokens by p(x)^2 ~ 0.1 per rejection; 2,000 decodes suffice
    tokens = first_tokens(params, draft_probs=False, rule=_no_residual_rule, samples=2_000)
    first_two, _ = exact_pairs(params)
    assert p_value(pair_counts(tokens, 0), first_two) < P_WRONG


@pytest.mark.parametrize("draft_probs", [False, True])
def test_one_host_transfer_per_call(monkeypatch, draft_probs):
    params = SamplingParams(temperature=0.8, top_p=0.95)
    draft = Draft.chain(torch.tensor([3, 1, 4]), draft_probs=Q_CHAIN if draft_probs else None)
    verify_ids = torch.tensor([5, 3, 1, 4])
    logits = ALL_LOGITS[verify_ids]  # (4, 6)
    gen = torch.Generator().manual_seed(0)
    calls: list[int] = []
    original = torch.Tensor.tolist

    def tolist(self):
        calls.append(self.numel())
        return original(self)

    def forbidden(name):
        def fail(self, *args, **kwargs):
            raise AssertionError(f"rejection_chain_on_device synchronised through Tensor.{name}")
        return fail

    monkeypatch.setattr(torch.Tensor, "tolist", tolist)
    for name in ("item", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, forbidden(name))
    for _ in range(20):
        calls.clear()
        accepted, next_token, new = rejection_chain_on_device(draft, verify_ids, logits, params, gen)
        assert calls == [len(draft) + 3]  # one packed transfer: accepted count, next token, verify ids
        assert accepted == list(range(len(accepted))) and 1 <= len(new) <= len(draft) + 1
        assert new[: len(accepted) - 1] == [3, 1, 4][: len(accepted) - 1] and new[-1] == next_token


def test_an_empty_draft_samples_from_the_root_row():
    params = SamplingParams(temperature=1.0)
    gen = torch.Generator().manual_seed(5)
    empty = Draft.chain(torch.empty(0, dtype=torch.long))
    counts = torch.zeros(6)
    for _ in range(6_000):  # 6,000 draws over 6 tokens; the same p-value floor as above
        accepted, token, new = rejection_chain_on_device(empty, torch.tensor([0]), LOGITS, params, gen)
        assert accepted == [0] and new == [token]
        counts[token] += 1
    assert p_value(counts, target_probs(LOGITS[0], params)) > P_FLOOR


class _Sibling(Proposer):
    """Two point-mass siblings under the root: a tree, which stays on the host's verify_rejection."""

    name = "siblings-test"

    @classmethod
    def from_options(cls, target, **options):
        return cls()

    @property
    def max_draft_tokens(self) -> int:
        return 2

    def propose(self, state):
        last = state.token_ids[-1:]
        return Draft(tokens=torch.cat([last, (last + 1) % 256]), parents=torch.tensor([0, 0]))


@pytest.mark.parametrize("proposer", ["chain", "tree"])
def test_decoder_uses_it_for_chains_only(tiny_target, monkeypatch, proposer):
    calls = {"device": 0, "host": 0}
    device_rule, host_rule = decode_module.rejection_chain_on_device, decode_module.verify

    def counted_device(*args, **kwargs):
        calls["device"] += 1
        return device_rule(*args, **kwargs)

    def counted_host(draft, *args, **kwargs):
        calls["host"] += len(draft) > 0
        return host_rule(draft, *args, **kwargs)

    monkeypatch.setattr(decode_module, "rejection_chain_on_device", counted_device)
    monkeypatch.setattr(decode_module, "verify", counted_host)
    drafter = NgramProposer(num_speculative_tokens=3) if proposer == "chain" else _Sibling()
    config = GenerationConfig(max_new_tokens=32, sampling=SamplingParams(temperature=0.8), seed=1)
    result = Decoder(tiny_target, drafter, config).generate(repetitive_prompt(0))
    assert len(result.output_token_ids) == 32
    counters = result.counters
    assert counters.num_drafts > 0 and counters.num_accepted_tokens <= counters.num_draft_tokens
    if proposer == "chain":
        assert calls["device"] > 0 and calls["host"] == 0
    else:
        assert calls["host"] == counters.num_drafts and calls["device"] == 0
