"""EAGLE-3 proposer: EagleProposer's catch-up and drafting rules over an EAGLE-3 head, which reads the target's
aux-layer features, scores through its own norm and lm_head and maps draft ids to target ids (docs/eagle.md#eagle-3)."""

from __future__ import annotations

import torch
from torch import nn

from specbench.eagle.eagle3 import Eagle3Head, eagle3_aux_layers
from specbench.engine.graph_capture import GraphBackend
from specbench.engine.tree import TreeSpec
from specbench.proposers.eagle import EagleProposer, target_captures_steps, target_hidden_size, target_input_embedding
from specbench.proposers.registry import register_proposer


def target_num_layers(target) -> int:
    """The target's decoder-layer count: ``config.num_hidden_layers``, else a StaticTarget's ``module.shape``."""
    layers = getattr(getattr(target, "config", None), "num_hidden_layers", None)
    if layers is None:
        layers = getattr(getattr(getattr(target, "module", None), "shape", None), "num_layers", None)
    if layers is None:
        raise ValueError(f"cannot tell the layer count of target {type(target).__name__}, which EAGLE-3 needs")
    return int(layers)


@register_proposer
class Eagle3Proposer(EagleProposer):
    name = "eagle3"
    needs_hidden_states = True  # the aux-layer features (T - 1, 3H), once from_options set the target's aux layers

    def __init__(
        self,
        head: Eagle3Head,
        embedding: nn.Module,
        *,
        target_vocab_size: int,
        num_speculative_tokens: int | None = None,
        tree: TreeSpec | None = None,
        top_k: int | None = None,
        depth: int | None = None,
        total_tokens: int | None = None,
        cuda_graphs: bool = False,
        graph_backend: GraphBackend | None = None,
    ):
        # the head's lm_head bounds tree ranks and top_k by the draft vocabulary
        super().__init__(head, head.lm_head, embedding, num_speculative_tokens=num_speculative_tokens, tree=tree,
                         top_k=top_k, depth=depth, total_tokens=total_tokens, cuda_graphs=cuda_graphs,
                         graph_backend=graph_backend)
        self.target_vocab_size = target_vocab_size
        self.draft_ids = head.draft_to_target()  # (Vd,) target id of each draft id
        self.identity_vocab = (head.config.draft_vocab_size == target_vocab_size
                               and torch.equal(self.draft_ids.cpu(), torch.arange(target_vocab_size)))

    @classmethod
    def from_options(
        cls,
        target,
        *,
        head: Eagle3Head | None = None,
        path: str | None = None,
        num_speculative_tokens: int | None = None,
        tree: TreeSpec | None = None,
        top_k: int | None = None,
        depth: int | None = None,
        total_tokens: int | None = None,
        cuda_graphs: bool | None = None,
        graph_backend: GraphBackend | None = None,
    ) -> "Eagle3Proposer":
        """A head from ``head`` or ``path``, on the target's device and dtype; the target is asked for the features
        entering layers ``eagle3_aux_layers(L)`` and its embedding serves the draft. ``cuda_graphs`` and
        ``graph_backend`` as EagleProposer.from_options."""
        if (head is None) == (path is None):
            raise ValueError(f"EAGLE-3 needs exactly one of head (an Eagle3Head) or path (a checkpoint); got head="
                             f"{type(head).__name__ if head is not None else None}, path={path!r}")
        hidden = target_hidden_size(target)
        if path is not None:
            from specbench.eagle.checkpoint3 import load_eagle3_head  # checkpoint formats load only when asked for

            head = load_eagle3_head(path, target_hidden_size=hidden, target_vocab_size=target.vocab_size,
                                    dtype=target.dtype, device=target.device,
                                    target_num_layers=target_num_layers(target))
        elif head.config.hidden_size != hidden or head.config.vocab_size != target.vocab_size:
            raise ValueError(
                f"the EAGLE-3 head has hidden_size {head.config.hidden_size} and vocab_size {head.config.vocab_size}; "
                f"the target has {hidden} and {target.vocab_size}"
            )
        head = head.to(device=target.device, dtype=target.dtype)
        embedding = target_input_embedding(target)
        cuda_graphs = target_captures_steps(target) if cuda_graphs is None else cuda_graphs
        proposer = cls(head, embedding, target_vocab_size=target.vocab_size, num_speculative_tokens=num_speculative_tokens,
                       tree=tree, top_k=top_k, depth=depth, total_tokens=total_tokens, cuda_graphs=cuda_graphs,
                       graph_backend=graph_backend)
        target.set_aux_layers(eagle3_aux_layers(target_num_layers(target)))  # only once the options are valid
        return proposer

    def describe(self) -> dict:
        settings = super().describe()
        settings.update(draft_vocab_size=self.head.config.draft_vocab_size)
        return settings

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(W, V) fp32 over the target's ids: the draft vocabulary's logits at their target ids, -inf elsewhere, so
        only ids with ``t2d`` set are ever drafted (the expansion rules run unchanged)."""
        draft = self.head.logits(hidden)  # (W, Vd)
        if self.identity_vocab:
            return draft
        full = draft.new_full((draft.shape[0], self.target_vocab_size), -torch.inf)  # (W, V)
        return full.index_copy_(1, self.draft_ids, draft)
