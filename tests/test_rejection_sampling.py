"""Rejection sampling keeps the target distribution exactly (chi-square on a 6-token vocabulary):
the first emitted token against the root's distribution, and the first three tokens of a small
decode loop against a context-dependent target's own joint distributions."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from specbench.engine.draft import Draft
from specbench.engine.sampling import SamplingParams, target_probs
from specbench.engine.verification import verify_rejection, verify_typical

SAMPLES = 12_000
# With 12,000 samples over 6 tokens a correct rule gives a chi-square p-value spread uniformly on
# (0, 1): failing below 1e-3 flakes once in a thousand seeds (the seed is fixed). The wrong rules
# below shift some probabilities by >= 0.05, which gives p-values far below 1e-12.
P_FLOOR = 1e-3
P_WRONG = 1e-12

LOGITS = torch.tensor([[2.0, 1.0, 0.5, 0.0, -0.5, -1.0]])  # the root's target logits
Q = torch.tensor([0.05, 0.10, 0.40, 0.30, 0.10, 0.05])  # a draft distribution unlike p


def first_token_counts(make_draft, params, rule=verify_rejection, samples: int = SAMPLES) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1234)
    counts = torch.zeros(6)
    for _ in range(samples):
        draft = make_draft(gen)
        logits = LOGITS.expand(len(draft) + 1, 6)
        verdict = rule(draft, logits, params, gen)
        first = int(draft.tokens[verdict.accepted_nodes[1] - 1]) if verdict.num_accepted else verdict.next_token
        counts[first] += 1
    return counts


def p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Chi-square p-value on the support of probs; a token outside it must never appear."""
    support = probs > 0
    assert counts[~support].sum() == 0, f"tokens outside the target's support were emitted: {counts.tolist()}"
    expected = probs[support] * counts.sum()
    return float(chisquare(counts[support].numpy(), expected.numpy()).pvalue)


def chain_from_q(gen):
    x = torch.multinomial(Q, 1, generator=gen)
    return Draft.chain(x, draft_probs=Q[None])


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9)])
def test_draft_with_probabilities(params):
    probs = target_probs(LOGITS[0], params)
    assert p_value(first_token_counts(chain_from_q, params), probs) > P_FLOOR


def test_point_mass_chain():
    params = SamplingParams(temperature=1.0)
    probs = target_probs(LOGITS[0], params)
    counts = first_token_counts(lambda gen: Draft.chain(torch.tensor([3, 1])), params)
    assert p_value(counts, probs) > P_FLOOR


def test_point_mass_siblings():
    """Three distinct candidates under the root, tried in turn with the residual distribution."""
    params = SamplingParams(temperature=1.0)
    probs = target_probs(LOGITS[0], params)
    draft = Draft(tokens=torch.tensor([2, 0, 5]), parents=torch.tensor([0, 0, 0]))
    assert p_value(first_token_counts(lambda gen: draft, params), probs) > P_FLOOR


def test_a_wrong_rule_fails_the_same_test():
    """Typical acceptance is lossy: the same test must reject it, else the test has no power."""
    params = SamplingParams(temperature=1.0, acceptance="typical")
    probs = target_probs(LOGITS[0], params)
    # typical acceptance moves ~0.3 of the mass: 3,000 samples are plenty and keep the test short
    counts = first_token_counts(chain_from_q, params, rule=verify_typical, samples=3_000)
    assert p_value(counts, probs) < P_WRONG


def test_draft_probs_on_a_tree_are_refused():
    draft = Draft(tokens=torch.tensor([1, 2]), parents=torch.tensor([0, 0]), draft_probs=Q.expand(2, 6))
    with pytest.raises(ValueError, match="chain drafts only"):
        verify_rejection(draft, LOGITS.expand(3, 6), SamplingParams(temperature=1.0), None)


# --- depth >= 2: the first three tokens of a decode loop over a context-dependent target -----------
# The target is a Markov chain over the 6 tokens: after token x its logits are COND_LOGITS[x], at
# the start LOGITS[0]. A verify row therefore depends only on the token of its node (the root's row on
# the last emitted token), so the exact joint of the first tokens is known in closed form:
# P(t1=a, t2=b) = p0(a) p(b|a) and P(t2=b, t3=c) = (p0 P)(b) p(c|b). Each draft is a chain of 3, so
# tokens 2 and 3 are decided at draft depths 2 and 3 (after accepted tokens), by a correction after
# a rejection, or by the next step's root: every path of the verification rule is exercised.
COND_LOGITS = torch.tensor([
    [-1.0, 1.5, 0.0, 0.5, -0.5, 1.0],
    [0.5, -1.0, 1.5, 0.0, 1.0, -0.5],
    [1.0, 0.5, -1.0, 1.5, -0.5, 0.0],
    [0.0, 1.0, 0.5, -1.0, 1.5, -0.5],
    [1.5, -0.5, 1.0, 0.0, -1.0, 0.5],
    [-0.5, 0.0, 1.0, 0.5, 1.5, -1.0],
])  # row x: the target's logits after token x; every row differs from LOGITS[0] and from the others
ROOT = 6  # "no token emitted yet": row 6 of ALL_LOGITS is LOGITS[0]
ALL_LOGITS = torch.cat([COND_LOGITS, LOGITS])  # (7, 6)
# the draft model's distribution per chain position, unlike the target's and different per position,
# so a rule that read the wrong row of draft_probs would also show
Q_CHAIN = torch.stack([Q, torch.tensor([0.30, 0.05, 0.30, 0.05, 0.25, 0.05]), torch.tensor([0.05, 0.40, 0.05, 0.25, 0.20, 0.05])])
SUCCESSOR = [3, 0, 4, 1, 5, 2, 0]  # point-mass drafter: after token x (or the root, 6) it guesses SUCCESSOR[x]
DEPTH_SAMPLES = 8_000
# 8,000 decodes give 36-cell joints whose smallest expected count at temperature 1 is 7.3 (P(t1=5,
# t2=5) = 0.00091), above the 5 the chi-square approximation needs; with top-p 0.9 the cells left in
# the support (12 of (t1, t2), 24 of (t2, t3)) have P >= 0.0029, so 5,000 decodes (smallest expected count 14.6) suffice and save the costlier
# top-p steps. Two joints per test, each failing below P_FLOOR: a correct rule fails a given seed
# with probability <= 2e-3 (the seed is fixed).
TOP_P_DEPTH_SAMPLES = 5_000


def point_mass_chain(last: int) -> Draft:
    tokens = [SUCCESSOR[last]]
    for _ in range(2):
        tokens.append(SUCCESSOR[tokens[-1]])
    return Draft.chain(torch.tensor(tokens))


def emitted_tokens(outcome, draft: Draft) -> list[int]:
    """The tokens a step emits, from a Verdict (the host rules) or an (accepted, next_token, emitted)
    triple (the device rules, which must agree with their own accepted prefix)."""
    if isinstance(outcome, tuple):
        accepted, next_token, emitted = outcome
        assert emitted == draft.tokens[: len(accepted) - 1].tolist() + [next_token]
        return emitted
    return draft.tokens[[i - 1 for i in outcome.accepted_nodes[1:]]].tolist() + [outcome.next_token]


def first_tokens(params, *, draft_probs: bool, rule=verify_rejection, samples: int = DEPTH_SAMPLES, n: int = 3,
                 seed: int = 4321):
    """(samples, n) first n tokens of a decode loop: draft a chain of 3, verify with ``rule``, emit, repeat."""
    gen = torch.Generator().manual_seed(seed)
    # every step emits >= 1 token, so n steps per decode is the most a q-chain pool must hold
    pool = torch.multinomial(Q_CHAIN, samples * n, replacement=True, generator=gen).T.contiguous()  # (S * n, 3)
    point_mass = {last: point_mass_chain(last) for last in range(7)}
    out = torch.empty(samples, n, dtype=torch.long)
    step = 0
    for s in range(samples):
        emitted: list[int] = []
        while len(emitted) < n:
            last = emitted[-1] if emitted else ROOT
            if draft_probs:
                draft = Draft.chain(pool[step], draft_probs=Q_CHAIN)
                step += 1
            else:
                draft = point_mass[last]
            logits = ALL_LOGITS[torch.cat([torch.tensor([last]), draft.tokens])]  # (4, 6): root, then each node
            emitted += emitted_tokens(rule(draft, logits, params, gen), draft)
        out[s] = torch.tensor(emitted[:n])
    return out


def pair_counts(tokens: torch.Tensor, i: int) -> torch.Tensor:
    """(6, 6) counts of (token i, token i + 1) over the decodes."""
    return torch.bincount(tokens[:, i] * 6 + tokens[:, i + 1], minlength=36).reshape(6, 6).double()


def exact_pairs(params) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's own joints of (t1, t2) and (t2, t3), by exact ancestral probabilities (float64,
    so observed and expected totals agree to chisquare's 1e-8 tolerance)."""
    p0 = target_probs(LOGITS[0], params).double()  # (6,)
    step = target_probs(COND_LOGITS, params).double()  # (6, 6) row a: p(. | a)
    first_two = p0[:, None] * step
    second_third = (p0 @ step)[:, None] * step
    return first_two / first_two.sum(), second_third / second_third.sum()


@pytest.mark.parametrize(("params", "samples"), [
    (SamplingParams(temperature=1.0), DEPTH_SAMPLES),
    (SamplingParams(temperature=0.7, top_p=0.9), TOP_P_DEPTH_SAMPLES),
])
def test_first_three_tokens_with_draft_probabilities(params, samples):
    tokens = first_tokens(params, draft_probs=True, samples=samples)
    first_two, second_third = exact_pairs(params)
    assert p_value(pair_counts(tokens, 0), first_two) > P_FLOOR
    assert p_value(pair_counts(tokens, 1), second_third) > P_FLOOR


def test_first_three_tokens_point_mass_chain():
    params = SamplingParams(temperature=1.0)
    tokens = first_tokens(params, draft_probs=False)
    first_two, second_third = exact_pairs(params)
    assert p_value(pair_counts(tokens, 0), first_two) > P_FLOOR
    assert p_value(pair_counts(tokens, 1), second_third) > P_FLOOR


def _stale_context_rule(draft, logits, params, gen):
    """A bug only depth >= 2 can show: each draft node is judged on its parent's row, so the root
    (the first token) is right and every deeper node uses the wrong context."""
    parents = torch.cat([torch.zeros(1, dtype=torch.long), draft.parents])  # (N + 1,) node -> parent row
    return verify_rejection(draft, logits[parents], params, gen)


def test_a_depth_two_bug_passes_the_first_token_test_but_fails_the_joint():
    params = SamplingParams(temperature=1.0)
    # the bug moves p(t2 | t1) from COND_LOGITS[t1] to LOGITS[0] whenever t1 was an accepted draft
    # token (about half the decodes): 2,000 decodes are plenty for p < 1e-12 and keep the test short
    tokens = first_tokens(params, draft_probs=True, rule=_stale_context_rule, samples=2_000)
    first_two, _ = exact_pairs(params)
    first = torch.bincount(tokens[:, 0], minlength=6).double()
    p0 = target_probs(LOGITS[0], params).double()
    assert p_value(first, p0 / p0.sum()) > P_FLOOR  # the first token alone is exact
    assert p_value(pair_counts(tokens, 0), first_two) < P_WRONG


def test_seeded_sampling_is_reproducible(tiny_target):
    from specbench.engine.decode import Decoder, GenerationConfig
    from specbench.proposers import create_proposer
    from _prompts import repetitive_prompt

    config = GenerationConfig(max_new_tokens=24, sampling=SamplingParams(temperature=0.8, top_p=0.95), seed=7)
    proposer = create_proposer("ngram", tiny_target, num_speculative_tokens=3)
    first = Decoder(tiny_target, proposer, config).generate(repetitive_prompt(1))
    second = Decoder(tiny_target, proposer, config).generate(repetitive_prompt(1))
    assert first.output_token_ids == second.output_token_ids
    assert first.counters == second.counters
