"""Verification rules: which draft nodes the target accepts and which token it adds.

All rules take the verify-input logits ``(N + 1, V)`` (row 0 = the root) and return a
:class:`Verdict`. Greedy and rejection sampling are lossless (docs/verification.md); typical
acceptance is Medusa's lossy sampling mode.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.engine.draft import Draft
from specbench.engine.sampling import SamplingParams, sample, target_probs


@dataclass
class Verdict:
    accepted_nodes: list[int]  # verify-input indices of the accepted path, root (0) first
    next_token: int  # the target's token after the path: bonus or correction

    @property
    def num_accepted(self) -> int:
        return len(self.accepted_nodes) - 1


def _children(draft: Draft) -> list[list[int]]:
    kids: list[list[int]] = [[] for _ in range(len(draft) + 1)]
    for child, parent in enumerate(draft.parents.tolist(), start=1):
        kids[parent].append(child)
    return kids


def _longest_path(draft: Draft, node_ok: list[bool]) -> list[int]:
    """Longest root-to-node path whose every draft node is ok; ties go to the earlier node."""
    parents = [0] + draft.parents.tolist()
    on_path = [True] + [False] * len(draft)
    depth = [0] * (len(draft) + 1)
    best = 0
    for node in range(1, len(draft) + 1):
        on_path[node] = node_ok[node] and on_path[parents[node]]
        depth[node] = depth[parents[node]] + 1
        if on_path[node] and depth[node] > depth[best]:
            best = node
    path = [best]
    while path[-1] != 0:
        path.append(parents[path[-1]])
    return path[::-1]


def verify_greedy(draft: Draft, logits: torch.Tensor) -> Verdict:
    """Accept draft tokens equal to the target's argmax after their parent."""
    target_tokens = logits.argmax(dim=-1).tolist()  # (N + 1,)
    tokens, parents = draft.tokens.tolist(), draft.parents.tolist()
    node_ok = [True] + [tokens[i] == target_tokens[parents[i]] for i in range(len(tokens))]
    path = _longest_path(draft, node_ok)
    return Verdict(accepted_nodes=path, next_token=target_tokens[path[-1]])


def verify_rejection(
    draft: Draft, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> Verdict:
    """Lossless speculative sampling (Leviathan/Chen), node by node down the tree.

    At each node the children are tried in order. With draft probabilities q (chains only),
    child x is accepted with probability min(1, p(x)/q(x)), else p <- norm(max(p - q, 0)).
    With point-mass drafts q = delta_x: accept with probability p(x), else p <- norm(p with x
    removed) and the next sibling is tried; this recursive rule keeps the output distributed
    exactly as p for any number of distinct siblings.
    """
    if draft.draft_probs is not None and not draft.is_chain:
        raise ValueError("draft probabilities are supported for chain drafts only; propose a chain or drop draft_probs")
    probs = target_probs(logits, params)  # (N + 1, V)
    kids = _children(draft)
    tokens = draft.tokens.tolist()
    path = [0]
    while True:
        node = path[-1]
        p = probs[node]  # (V,)
        accepted = None
        for child in kids[node]:
            x = tokens[child - 1]
            u = float(torch.rand((), generator=generator, device=p.device))
            if draft.draft_probs is not None:
                q = draft.draft_probs[child - 1].to(p)  # (V,)
                if u * float(q[x]) < float(p[x]):  # u < p(x)/q(x) without dividing by 0
                    accepted = child
                    break
                residual = (p - q).clamp_min(0.0)
            else:
                if u < float(p[x]):
                    accepted = child
                    break
                residual = p.clone()
                residual[x] = 0.0
            mass = float(residual.sum())
            p = residual / mass if mass > 0 else p
        if accepted is None:
            return Verdict(accepted_nodes=path, next_token=sample(p, generator))
        path.append(accepted)


def verify_typical(
    draft: Draft, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> Verdict:
    """Medusa's typical acceptance (lossy): accept x when p(x) > min(eps, delta * exp(-H(p)))."""
    probs = target_probs(logits, params)  # (N + 1, V)
    entropy = -(probs * torch.log(probs.clamp_min(1e-30))).sum(dim=-1)  # (N + 1,)
    threshold = torch.minimum(
        torch.full_like(entropy, params.typical_epsilon), params.typical_delta * torch.exp(-entropy)
    )  # (N + 1,)
    parents = draft.parents.to(probs.device)
    token_prob = probs[parents, draft.tokens.to(probs.device)]  # (N,) p_parent(token)
    node_ok = [True] + (token_prob > threshold[parents]).tolist()
    path = _longest_path(draft, node_ok)
    return Verdict(accepted_nodes=path, next_token=sample(probs[path[-1]], generator))


def verifies_greedily(params: SamplingParams) -> bool:
    """Whether :func:`verify` applies greedy verification for ``params`` (typical at temperature 0 included)."""
    return params.rule == "greedy" or (params.rule == "typical" and params.is_greedy)


def verify(
    draft: Draft, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> Verdict:
    """Apply the rule ``params`` selects (``SamplingParams`` admits greedy, rejection and typical only)."""
    if verifies_greedily(params):
        return verify_greedy(draft, logits)
    if params.rule == "rejection":
        return verify_rejection(draft, logits, params, generator)
    return verify_typical(draft, logits, params, generator)
