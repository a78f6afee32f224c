"""Medusa proposer: heads on each slot's last hidden state draft a chain (top-1 of each of K heads, as vLLM did) or a
static tree of top-k candidates (Medusa's tree decoding), for every active slot at once."""

from __future__ import annotations

import torch
from torch import nn

from specbench.engine.draft import Draft
from specbench.engine.tree import TreeBuffers
from specbench.medusa.trees import TreeSpec, load_tree
from specbench.engine.proposer import ProposerState, SlotProposer
from specbench.medusa.captured import CAPTURE_HEADS, CapturedHeads
from specbench.medusa.heads import MedusaHeads
from specbench.proposers.registry import register_proposer


@register_proposer
class MedusaProposer(SlotProposer):
    """The heads run once over the ``(n, H)`` last hidden states of the n active slots, and every slot's draft tokens
    are picked from them in one op: the chain's top-1 per head, or the tree's top-k candidates. All slots share the
    draft's shape (parents, depths, mask), built once, so no per-slot device op or host read runs in ``propose``.
    ``cuda_graphs``: the heads run as one captured graph per batch size (medusa/captured.py)."""

    name = "medusa"
    queues_ahead = True

    def __init__(self, heads: MedusaHeads, lm_head: nn.Module | None = None, *,
                 num_speculative_tokens: int | None = None, tree: TreeSpec | None = None, cuda_graphs: bool = False,
                 graph_backend=None):
        num_heads = heads.config.num_heads
        if (num_speculative_tokens is None) == (tree is None):
            raise ValueError(
                "Medusa needs exactly one of num_speculative_tokens (a chain: top-1 of the first K heads) "
                f"or tree (a list of paths, a JSON file or a tree name); got num_speculative_tokens="
                f"{num_speculative_tokens!r}, tree={tree!r}"
            )
        if heads.lm_heads is None and lm_head is None:
            raise ValueError("these Medusa heads are version 2 (no vocab projection); pass the target's lm_head")
        device = next(heads.parameters()).device
        self.tree: TreeBuffers | None = None
        if tree is not None:
            self.tree = load_tree(tree).to(device)
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
        # every slot's draft shape, computed once: each propose hands out copies with the slot's tokens
        self._template = self.draft_from_logits(torch.zeros(depth, heads.config.vocab_size, device=device))
        self.captured = CapturedHeads(lambda hidden: (self.tokens_from_logits(self.head_logits(hidden)),),
                                      heads.config.hidden_size, heads.stack().block_bias.dtype, device,
                                      enabled=cuda_graphs, backend=graph_backend)
        self.batch_size = 1  # the rows of the graph the next reserve() captures (with_batch_size)

    @classmethod
    def from_options(cls, target, *, heads: MedusaHeads | None = None, path: str | None = None,
                     num_speculative_tokens: int | None = None, tree: TreeSpec | None = None) -> "MedusaProposer":
        """Heads from ``heads`` (a module) or ``path`` (a checkpoint reference), moved to the target's
        device and dtype; the target's lm_head serves version-2 heads; captured on a target with graphs on."""
        if (heads is None) == (path is None):
            raise ValueError(f"Medusa needs exactly one of heads (a MedusaHeads) or path (a checkpoint); got heads="
                             f"{type(heads).__name__ if heads is not None else None}, path={path!r}")
        if path is not None:
            from specbench.medusa.checkpoint import load_medusa_heads  # checkpoint formats load only when asked for

            heads = load_medusa_heads(path, hidden_size=target.hidden_size, vocab_size=target.vocab_size, dtype=target.dtype)
        heads = heads.to(device=target.device, dtype=target.dtype)
        return cls(heads, target.lm_head, num_speculative_tokens=num_speculative_tokens, tree=tree,
                   cuda_graphs=CAPTURE_HEADS and bool(getattr(target, "cuda_graphs", False))).with_batch_size(
            getattr(target, "batch_size", 1))

    @property
    def max_draft_tokens(self) -> int:
        return self.tree.num_nodes if self.tree is not None else self.depth

    def with_batch_size(self, batch_size: int) -> "MedusaProposer":
        """Itself: the heads keep no per-slot state, so one proposer drafts for any number of slots (its next
        ``reserve`` captures a graph of ``batch_size`` rows, with graphs on)."""
        self.batch_size = batch_size
        return self

    def reserve(self, num_tokens: int) -> None:
        self.captured.prepare(self.batch_size)  # before any clock starts

    capture_seconds = property(lambda self: self.captured.graphs.capture_seconds)

    def describe(self) -> dict:
        settings = {"name": self.name, "num_heads": self.heads.config.num_heads}
        if self.tree is None:
            settings["num_speculative_tokens"] = self.depth
        else:
            settings.update(tree=self.tree.name or "custom", tree_nodes=self.tree.num_nodes, tree_depth=self.depth)
        return settings

    def head_logits(self, hidden_state: torch.Tensor) -> torch.Tensor:
        """(H,) or (n, H) hidden states -> (depth, V) or (depth, n, V) logits of the heads this proposer uses.

        Only those heads run (each vocab projection costs as much as the target's lm_head), together on the stacked
        weights (MedusaHeads.stack): L batched matmuls, then one for the vocab projections (or the target's lm_head).
        """
        stacked = self.heads.stack()  # the cached stacked tensors unless the heads' parameters were replaced
        x = hidden_state.to(stacked.block_bias.dtype)  # (H,) or (n, H)
        if stacked.vocab_weight is None:
            return self.lm_head(stacked.hidden(x, self.depth))  # (depth, [n,] V)
        return stacked.logits(x, self.depth)  # (depth, [n,] V)

    def draft_from_logits(self, head_logits: torch.Tensor) -> Draft:
        """(depth, V) head logits -> the chain of top-1 tokens, or the tree of top-k candidates."""
        if self.tree is None:
            return Draft.chain(head_logits.argmax(dim=-1))  # (K,)
        topk_tokens = head_logits.topk(self.tree.top_k, dim=-1).indices  # (depth, top_k), best first
        return self.tree.draft(topk_tokens)

    def tokens_from_logits(self, head_logits: torch.Tensor) -> torch.Tensor:
        """(depth, n, V) head logits -> (n, N) every slot's draft tokens, as ``draft_from_logits`` picks them."""
        if self.tree is None:
            return head_logits.argmax(dim=-1).T  # (n, K)
        topk = head_logits.topk(self.tree.top_k, dim=-1).indices  # (depth, n, top_k), best first
        return self.tree.place(topk.transpose(0, 1))  # (n, N)

    @torch.inference_mode()
    def propose(self, states: dict[int, ProposerState]) -> dict[int, Draft | None]:
        if not states:
            return {}
        if any(state.hidden_state is None for state in states.values()):
            raise ValueError("the Medusa proposer reads each slot's last hidden state, but the decode loop passed none")
        hidden = torch.stack([state.hidden_state for state in states.values()])  # (n, H)
        tokens = self.captured.tokens(hidden)  # (n, N): the heads' graph replayed, or the heads run eagerly
        return {slot: self._template.with_tokens(tokens[i]) for i, slot in enumerate(states)}
