"""Tree verification on the transformers target: accepted path, emitted tokens, and KV cache."""

from __future__ import annotations

import torch

from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.draft import Draft
from specbench.engine.hf_target import HFTarget
from specbench.engine.step_inputs import SlotInput
from specbench.engine.verification import verify_greedy
from _prompts import random_prompt

# fp32 logits of a k-token forward differ from a one-token forward only by summation order
# (~1e-6 relative here); a wrong or leaked KV entry moves them by O(0.1-1). 1e-4 separates both.
LOGITS_ATOL = 1e-4


def greedy_truth(model, prompt: torch.Tensor, n: int) -> list[int]:
    return Decoder(HFTarget(model), None, GenerationConfig(max_new_tokens=n)).generate(prompt).output_token_ids


def fresh_next_logits(model, tokens: list[int]) -> torch.Tensor:
    target = HFTarget(model)
    return target.prefill(0, torch.tensor(tokens)).logits[-1]


def wrong(token: int, vocab: int = 256, shift: int = 1) -> int:
    return (token + shift) % vocab


def test_hand_built_tree_accepts_the_correct_branch(tiny_model):
    prompt = random_prompt(11, 3)
    truth = greedy_truth(tiny_model, prompt, 8)  # truth[0] is the root, the next three follow it
    t1, t2, t3 = truth[1], truth[2], truth[3]
    # node: 1 wrong(t1)   2 t1   3 wrong(t2) under 2   4 t2 under 2   5 wrong(t3) under 4   6 t1+.. under 1
    draft = Draft(
        tokens=torch.tensor([wrong(t1), t1, wrong(t2), t2, wrong(t3), t2]),
        parents=torch.tensor([0, 0, 2, 2, 4, 1]),
    )
    target = HFTarget(tiny_model)
    target.prefill(0, prompt)
    verify_ids = torch.cat([torch.tensor([truth[0]]), draft.tokens])  # (7,)
    out = target.verify([SlotInput(verify_ids, draft.depths(), draft.tree_mask())])
    verdict = verify_greedy(draft, out.logits[0])
    assert verdict.accepted_nodes == [0, 2, 4]
    assert verdict.next_token == t3  # the correction at the rejected third position
    target.commit([verdict.accepted_nodes])
    assert target.cache_length == prompt.numel() + 3  # root + two accepted; rejected nodes are gone
    committed = prompt.tolist() + [truth[0], t1, t2]
    # the cache now behaves exactly like a fresh prefill of the committed tokens
    step = target.verify([SlotInput([t3], [0])])
    fresh = fresh_next_logits(tiny_model, committed + [t3])
    torch.testing.assert_close(step.logits[0, -1], fresh, atol=LOGITS_ATOL, rtol=0)


def test_cache_matches_fresh_prefill_after_many_tree_steps(tiny_model):
    """After any sequence of tree steps, next-token logits equal those of a fresh prefill."""
    prompt = random_prompt(9, 5)
    truth = greedy_truth(tiny_model, prompt, 80)
    gen = torch.Generator().manual_seed(0)
    target = HFTarget(tiny_model)
    target.prefill(0, prompt)
    tokens = prompt.tolist() + [truth[0]]
    emitted = 1
    for _ in range(12):
        # a random tree of 7 nodes; about half of them copy the true continuation at their depth
        parents = [0]
        for node in range(2, 8):
            parents.append(int(torch.randint(0, node, (1,), generator=gen)))
        depths = Draft(tokens=torch.zeros(7, dtype=torch.long), parents=torch.tensor(parents)).depths()
        draft_tokens = []
        for node in range(1, 8):
            true_token = truth[emitted + int(depths[node]) - 1]
            coin = bool(torch.rand((), generator=gen) < 0.5)
            draft_tokens.append(true_token if coin else wrong(true_token, shift=int(node)))
        draft = Draft(tokens=torch.tensor(draft_tokens), parents=torch.tensor(parents))
        verify_ids = torch.cat([torch.tensor([tokens[-1]]), draft.tokens])
        out = target.verify([SlotInput(verify_ids, draft.depths(), draft.tree_mask())])
        verdict = verify_greedy(draft, out.logits[0])
        target.commit([verdict.accepted_nodes])
        new = verify_ids[verdict.accepted_nodes[1:]].tolist() + [verdict.next_token]
        assert new == truth[emitted : emitted + len(new)]  # lossless
        tokens += new
        emitted += len(new)
        assert target.cache_length == len(tokens) - 1  # everything but the pending root
        live = out.logits[0, verdict.accepted_nodes[-1]]
        torch.testing.assert_close(live, fresh_next_logits(tiny_model, tokens[:-1]), atol=LOGITS_ATOL, rtol=0)
    assert emitted > 12 + 3, "some tree steps must have accepted tokens for this test to mean anything"
