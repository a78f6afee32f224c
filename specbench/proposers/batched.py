"""Batched forms of the runtime proposers: Medusa heads and greedy draft models over all slots at once, a slot
proposer (EAGLE) rebuilt for the batch size; the rest per slot."""

from __future__ import annotations

from typing import Callable

import torch

from specbench.engine.slot_proposer import SlotProposer, PerSlotProposer
from specbench.engine.draft import Draft
from specbench.engine.proposer import Proposer, ProposerState
from specbench.proposers.batched_draft import BatchedDraftModelProposer, PerSlotDraftModelProposer
from specbench.proposers.draft_model import DraftModelProposer
from specbench.proposers.medusa import MedusaProposer
from specbench.proposers.ngram import NgramProposer


class BatchedMedusaProposer(SlotProposer):
    """A :class:`~specbench.proposers.medusa.MedusaProposer`'s heads run once over the ``(n, H)`` last hidden
    states of the n active slots, and every slot's draft tokens are picked from them in one op: the chain's
    top-1 per head, or the tree's top-k candidates. All slots share the draft's shape (parents, depths, mask),
    built once by the proposer's own code, so no per-slot device op or host read runs in ``propose``."""

    def __init__(self, medusa):
        self.medusa = medusa
        heads = medusa.heads.config
        device = next(medusa.heads.parameters()).device
        template = medusa.draft_from_logits(torch.zeros(medusa.depth, heads.vocab_size, device=device))  # (depth, V)
        template.depths(), template.depth(), template.is_chain  # computed once here, shared by every slot's draft
        self._template = template
        tree = medusa.tree  # its (top_k, max_depth, (N,) candidate indices), read once
        self._tree = None if tree is None else (tree.top_k, tree.max_depth, tree.candidate_indices.to(device))

    @property
    def max_draft_tokens(self) -> int:
        return self.medusa.max_draft_tokens

    def _tokens(self, logits: torch.Tensor) -> torch.Tensor:
        """(depth, n, V) head logits -> (n, N) every slot's draft tokens, as ``draft_from_logits`` picks them."""
        if self._tree is None:
            return logits.argmax(dim=-1).T  # (n, K)
        top_k, max_depth, candidates = self._tree
        topk = logits.topk(top_k, dim=-1).indices  # (depth, n, top_k), best first
        table = topk[:max_depth].permute(1, 0, 2).reshape(topk.shape[1], -1)  # (n, max_depth * top_k)
        return table[:, candidates]  # (n, N)

    @torch.inference_mode()
    def propose(self, states: dict[int, ProposerState]) -> dict[int, Draft | None]:
        if not states:
            return {}
        slots = list(states)
        if any(states[s].hidden_state is None for s in slots):
            raise ValueError("the Medusa proposer reads each slot's last hidden state, but the decode loop passed none")
        hidden = torch.stack([states[s].hidden_state for s in slots])  # (n, H)
        tokens = self._tokens(self.medusa.head_logits(hidden))  # (n, N)
        return {slot: self._template.with_tokens(tokens[i]) for i, slot in enumerate(slots)}


    def describe(self) -> dict:
        return {**self.medusa.describe(), "batching": "batched heads"}


def for_batch(proposer: Proposer | SlotProposer | None, batch_size: int, factory: Callable[[], Proposer] | None = None):
    """The batched form of a proposer: a slot proposer (EAGLE-1/2/3 heads: chain, static and dynamic tree) for
    ``batch_size`` slots; Medusa and a greedy draft model batched; n-gram one per slot with its settings; anything
    else (a sampled draft model, ...) one per slot from ``factory`` (a proposer keeps per-request state, so one
    instance cannot serve two slots)."""
    if proposer is None and factory is None:
        return None
    if isinstance(proposer, SlotProposer):
        return proposer.with_batch_size(batch_size)
    if isinstance(proposer, MedusaProposer):
        return BatchedMedusaProposer(proposer)
    if isinstance(proposer, DraftModelProposer):
        batched = BatchedDraftModelProposer.from_proposer(proposer, batch_size)
        if batched is not None:
            return batched
        if factory is not None:
            return PerSlotDraftModelProposer.build(factory, batch_size)
    if factory is None and isinstance(proposer, NgramProposer):
        settings = proposer.describe()
        factory = lambda: NgramProposer(settings["num_speculative_tokens"], settings["min_n"], settings["max_n"],  # noqa: E731
                                        settings["match"])
    if factory is None and batch_size == 1:  # one slot: the proposer itself keeps its one request's state
        return PerSlotProposer([proposer])
    if factory is None:
        raise ValueError(f"proposer {type(proposer).__name__} keeps per-request state and has no batched form: pass "
                         "factory= (a callable building one per slot) to run it per slot")
    return PerSlotProposer.build(factory, batch_size)
