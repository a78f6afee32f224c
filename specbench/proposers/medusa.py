"""Medusa proposer: heads on the target's last hidden state draft a chain (top-1 of each of K heads,
as vLLM did) or a static tree of top-k candidates (Medusa's tree decoding)."""

from __future__ import annotations

import torch
from torch import nn

from specbench.engine.draft import Draft
from specbench.engine.tree import TreeBuffers, TreeSpec, load_tree
from specbench.engine.proposer import Proposer, ProposerState
from specbench.medusa.heads import MedusaHeads
from specbench.proposers.registry import register_proposer


@register_proposer
class MedusaProposer(Proposer):
    name = "medusa"

    def __init__(
        self,
        heads: MedusaHeads,
        lm_head: nn.Module | None = None,
        *,
        num_speculative_tokens: int | None = None,
        tree: TreeSpec | None = None,
    ):
        num_heads = heads.config.num_heads
        if (num_speculative_tokens is None) == (tree is None):
            raise ValueError(
                "Medusa needs exactly one of num_speculative_tokens (a chain: top-1 of the first K heads) "
                f"or tree (a list of paths, a JSON file or a tree name); got num_speculative_tokens="
                f"{num_speculative_tokens!r}, tree={tree!r}"
            )
        if heads.lm_heads is None and lm_head is None:
            raise ValueError("these Medusa heads are version 2 (no vocab projection); pass the target's lm_head")
        self.tree: TreeBuffers | None = None
        if tree is not None:
            self.tree = load_tree(tree)
            depth = self.tree.max_depth
            if depth > num_heads:
                raise ValueError(
                    f"Medusa tree {self.tree.name or '(custom)'} is {depth} deep but the checkpoint has only "
                    f"{num_heads} heads; use a tree of depth <= {num_heads}"
                )
            vocab = heads.config.vocab_size
            if self.tree.top_k > vocab:
                raise ValueError(f"Medusa tree uses rank {self.tree.top_k - 1} but the vocabulary has {vocab} tokens")
        else:
            depth = num_speculative_tokens
            if not 1 <= depth <= num_heads:
                raise ValueError(
                    f"num_speculative_tokens (K) must be in 1..{num_heads} (the checkpoint's Medusa heads), got {depth}"
                )
        self.heads = heads.eval()
        self.heads.stack()  # per-head parameters become views of stacked tensors: all heads in one matmul per layer
        self.lm_head = lm_head
        self.depth = depth  # heads actually run per step
        device = next(heads.parameters()).device
        if self.tree is not None:
            self.tree = self.tree.to(device)

    @classmethod
    def from_options(
        cls,
        target,
        *,
        heads: MedusaHeads | None = None,
        path: str | None = None,
        num_speculative_tokens: int | None = None,
        tree: TreeSpec | None = None,
    ) -> "MedusaProposer":
        """Heads from ``heads`` (a module) or ``path`` (a checkpoint reference), moved to the target's
        device and dtype; the target's lm_head serves version-2 heads."""
        if (heads is None) == (path is None):
            raise ValueError(f"Medusa needs exactly one of heads (a MedusaHeads) or path (a checkpoint); got heads="
                             f"{type(heads).__name__ if heads is not None else None}, path={path!r}")
        lm_head = getattr(target, "lm_head", None)
        if path is not None:
            from specbench.medusa.checkpoint import load_medusa_heads  # checkpoint formats load only when asked for

            config = getattr(target, "config", None)
            hidden_size = getattr(config, "hidden_size", None)
            if hidden_size is None and lm_head is not None:
                hidden_size = int(lm_head.weight.shape[1])
            if hidden_size is None:
                raise ValueError(
                    f"cannot tell the hidden size of target {type(target).__name__}: it has neither "
                    "config.hidden_size nor an lm_head; pass heads= built by hand instead of path="
                )
            heads = load_medusa_heads(path, hidden_size=int(hidden_size), vocab_size=target.vocab_size, dtype=target.dtype)
        heads = heads.to(device=target.device, dtype=target.dtype)
        return cls(heads, lm_head, num_speculative_tokens=num_speculative_tokens, tree=tree)

    @property
    def max_draft_tokens(self) -> int:
        return self.tree.num_nodes if self.tree is not None else self.depth

    def describe(self) -> dict:
        settings = {"name": self.name, "num_heads": self.heads.config.num_heads}
        if self.tree is None:
            settings["num_speculative_tokens"] = self.depth
        else:
            settings.update(tree=self.tree.name or "custom", tree_nodes=self.tree.num_nodes, tree_depth=self.depth)
        return settings

    def head_logits(self, hidden_state: torch.Tensor) -> torch.Tensor:
        """(H,) hidden state -> (depth, V) logits of the heads this proposer uses.

        Only those heads run: each vocab projection is as large as the target's lm_head, so running
        unused heads would cost a noticeable fraction of a target step. They run together on the
        heads' stacked weights (MedusaHeads.stack; no copy of the weights is kept): L batched
        matmuls for the residual blocks, then one batched matmul for the vocab projections, or one
        matmul with the target's lm_head for version-2 heads.
        """
        stacked = self.heads.stack()  # the cached stacked tensors unless the heads' parameters were replaced
        x = hidden_state.to(stacked.block_bias.dtype)  # (H,)
        if stacked.vocab_weight is None:
            return self.lm_head(stacked.hidden(x, self.depth))  # (depth, V)
        return stacked.logits(x, self.depth)  # (depth, V)

    def draft_from_logits(self, head_logits: torch.Tensor) -> Draft:
        """(depth, V) head logits -> the chain of top-1 tokens, or the tree of top-k candidates."""
        if self.tree is None:
            return Draft.chain(head_logits.argmax(dim=-1))  # (K,)
        topk_tokens = head_logits.topk(self.tree.top_k, dim=-1).indices  # (depth, top_k), best first
        return self.tree.draft(topk_tokens)

    @torch.inference_mode()
    def propose(self, state: ProposerState) -> Draft:
        if state.hidden_state is None:
            raise ValueError("the Medusa proposer reads the target's last hidden state, but the decode loop passed none")
        return self.draft_from_logits(self.head_logits(state.hidden_state))
