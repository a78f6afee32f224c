"""EAGLE's drafting options checked into its drafting rule and sizes: a top-1 chain of K, EAGLE-1's static tree or
EAGLE-2's dynamic tree, exactly one of them (docs/eagle.md#drafting)."""

from __future__ import annotations

from dataclasses import dataclass

from specbench.eagle.expansion import (DraftingRule, StaticTreePlan, chain_rule, dynamic_pool_size, dynamic_tree_rule,
                                       static_tree_rule)
from specbench.medusa.trees import TreeSpec, load_tree


@dataclass(frozen=True)
class Drafting:
    mode: str  # "chain", "tree" or "dynamic"
    rule: DraftingRule
    num_nodes: int  # draft nodes per step (the verify's width - 1)
    expansion_slots: int  # draft-cache entries one propose writes past the committed ones
    max_depth: int  # the deepest node a draft can hold: a step accepts at most this many tokens
    plan: StaticTreePlan | None = None  # EAGLE-1's tree, on the head's device


def drafting(vocab: int, device, *, num_speculative_tokens: int | None = None, tree: TreeSpec | None = None,
             top_k: int | None = None, depth: int | None = None, total_tokens: int | None = None) -> Drafting:
    """The drafting of exactly one of ``num_speculative_tokens``, ``tree`` or (``top_k``, ``depth``,
    ``total_tokens``) over a vocabulary of ``vocab``; a refusal names the option, what was expected and the fix."""
    dynamic = {"top_k": top_k, "depth": depth, "total_tokens": total_tokens}
    given = [name for name, on in (("num_speculative_tokens", num_speculative_tokens is not None),
                                   ("tree", tree is not None),
                                   ("top_k/depth/total_tokens", any(v is not None for v in dynamic.values()))) if on]
    if len(given) != 1:
        raise ValueError(
            "EAGLE needs exactly one of num_speculative_tokens (a top-1 chain of K), tree (EAGLE-1: a static tree "
            "name, JSON file or list of paths) or top_k, depth and total_tokens (EAGLE-2's dynamic tree); got "
            f"{', '.join(given) or 'none'}"
        )
    if given[0] == "num_speculative_tokens":
        k = num_speculative_tokens
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"num_speculative_tokens (K) must be an integer >= 1, got {k!r}")
        return Drafting("chain", chain_rule(k), k, k - 1, k)
    if given[0] == "tree":
        buffers = load_tree(tree)
        if buffers.top_k > vocab:
            raise ValueError(f"EAGLE tree uses rank {buffers.top_k - 1} but the vocabulary has {vocab} tokens")
        plan = StaticTreePlan.from_tree(buffers).to(device)
        return Drafting("tree", static_tree_rule(plan), buffers.num_nodes, plan.num_expanded, buffers.max_depth, plan)
    missing = [name for name, value in dynamic.items() if value is None]
    if missing:
        raise ValueError(f"EAGLE-2's dynamic tree needs top_k, depth and total_tokens; missing {', '.join(missing)}")
    bad = [f"{name}={value!r}" for name, value in dynamic.items() if not isinstance(value, int) or value < 1]
    if bad:
        raise ValueError(f"EAGLE-2's top_k, depth and total_tokens must be integers >= 1, got {', '.join(bad)}")
    if top_k > vocab:
        raise ValueError(f"EAGLE-2 top_k={top_k} exceeds the vocabulary of {vocab} tokens")
    pool = dynamic_pool_size(top_k, depth)
    if total_tokens > pool:
        raise ValueError(
            f"EAGLE-2 total_tokens={total_tokens} exceeds the {pool} candidates top_k={top_k}, depth={depth} "
            f"scores (top_k + (depth - 1) * top_k^2); lower total_tokens or raise top_k or depth"
        )
    rule = dynamic_tree_rule(top_k=top_k, depth=depth, total_tokens=total_tokens)
    return Drafting("dynamic", rule, total_tokens, top_k * (depth - 1), min(depth, total_tokens))
