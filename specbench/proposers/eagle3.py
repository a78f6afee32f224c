"""EAGLE-3 proposer: EagleProposer's slots, catch-up and drafting rules over an EAGLE-3 head, which reads the target's
aux-layer features, scores through its own norm and lm_head and maps draft ids to target ids (docs/eagle.md#eagle-3)."""

from __future__ import annotations

import torch
from torch import nn

from specbench.eagle.eagle3 import Eagle3Head, eagle3_aux_layers
from specbench.proposers.eagle import EagleProposer
from specbench.proposers.registry import register_proposer


@register_proposer
class Eagle3Proposer(EagleProposer):
    name = "eagle3"
    needs_hidden_states = True  # the aux-layer features (T - 1, 3H), once from_options set the target's aux layers
    head_label, head_type = "EAGLE-3", "Eagle3Head"

    def __init__(self, head: Eagle3Head, embedding: nn.Module, *, target_vocab_size: int, **drafting):
        """``drafting``: EagleProposer's keyword options (batch_size, num_speculative_tokens, tree, top_k, depth,
        total_tokens, cuda_graphs, graph_backend); the head's lm_head bounds tree ranks and top_k by the draft
        vocabulary."""
        super().__init__(head, head.lm_head, embedding, **drafting)
        self.target_vocab_size = target_vocab_size
        self.draft_ids = head.draft_to_target()  # (Vd,) target id of each draft id
        self.identity_vocab = (head.config.draft_vocab_size == target_vocab_size
                               and torch.equal(self.draft_ids.cpu(), torch.arange(target_vocab_size)))

    @property
    def feature_width(self) -> int:
        """EAGLE-3's ``fc`` fuses the target's aux-layer streams alone: F = 3H."""
        return self.head.fc.in_features

    # -- EagleProposer.from_options' hooks: the head's own lm_head, the target's aux-layer features ----------

    @classmethod
    def _load_head(cls, target, path: str) -> Eagle3Head:
        from specbench.eagle.checkpoint3 import load_eagle3_head  # checkpoint formats load only when asked for

        return load_eagle3_head(path, target_hidden_size=target.hidden_size, target_vocab_size=target.vocab_size,
                                dtype=target.dtype, device=target.device, target_num_layers=target.num_layers)

    @classmethod
    def _head_fits(cls, head: Eagle3Head, target) -> bool:
        return head.config.hidden_size == target.hidden_size and head.config.vocab_size == target.vocab_size

    @classmethod
    def _for_target(cls, target, head: Eagle3Head, drafting: dict) -> "Eagle3Proposer":
        """The proposer, embedding through the target's embedding; only once the options are valid is the target
        asked for the features entering layers ``eagle3_aux_layers(L)``."""
        proposer = cls(head, target.embed_tokens, target_vocab_size=target.vocab_size, **drafting)
        target.set_aux_layers(eagle3_aux_layers(target.num_layers))
        return proposer

    def describe(self) -> dict:
        return {**super().describe(), "draft_vocab_size": self.head.config.draft_vocab_size}

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(R, V) fp32 over the target's ids: the draft vocabulary's logits at their target ids, -inf elsewhere, so
        only ids with ``t2d`` set are ever drafted (the expansion rules run unchanged)."""
        draft = self.head.logits(hidden)  # (R, Vd)
        if self.identity_vocab:
            return draft
        full = draft.new_full((draft.shape[0], self.target_vocab_size), -torch.inf)  # (R, V)
        return full.index_copy_(1, self.draft_ids, draft)
