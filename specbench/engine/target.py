"""The target protocol the decode loop drives: B slots, each prefilled with a prompt, verified a step at a time and
committed along its accepted path (engine/static_target.py at any B; engine/hf_target.py, the reference, at B = 1).

``verify`` appends every node of each slot's input after that slot's committed entries; ``commit`` then keeps only
the accepted path's entries, moved to contiguous positions, so rejected entries never leak into later steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from specbench.engine.step_inputs import SlotInput, VerifiedStep


@dataclass
class TargetOutput:
    logits: torch.Tensor  # (B, W, V) float32 next-token logits of each input position ((1, V) from a prefill)
    hidden_states: torch.Tensor  # (B, W, H) final hidden states after the final norm ((T, H) from a prefill)
    # (B, W, A * H) the residual streams entering the layers set by ``set_aux_layers`` (EAGLE-3's fused features),
    # concatenated in that order; None unless asked for
    aux_hidden_states: torch.Tensor | None = None


class Target(Protocol):
    batch_size: int  # slots decoded together
    vocab_size: int
    hidden_size: int  # H of the final hidden states (what the lm_head reads)
    num_layers: int  # decoder layers (EAGLE-3 picks its aux layers by this count)
    embed_tokens: "torch.nn.Module"  # the token embedding (draft heads without their own embed through it)
    max_context: int  # positions the model supports; prompt + output + draft must fit
    device: torch.device
    dtype: torch.dtype
    cuda_graphs: bool

    def reserve(self, num_tokens: int, max_draft_tokens: int = 0) -> None:
        """Size every slot for requests of up to ``num_tokens`` cache entries whose steps verify up to
        ``max_draft_tokens`` draft nodes, before timing starts (a no-op for targets that grow on demand)."""

    def prepare_prefills(self, lengths) -> None:
        """Capture what prefills of these prompt ``lengths`` replay (a no-op for targets that capture nothing)."""

    def prepare_steps(self, shortest: int = 1, kinds: tuple[str, ...] = ("plain", "chain", "tree")) -> None:
        """Capture the verify steps ``reserve`` sized (a no-op for targets that capture nothing)."""

    def prefill_many(self, slots: list[int], prompts: list[torch.Tensor]) -> list[TargetOutput]:
        """Run prompt ``(T_i,)`` into slot ``slots[i]``; each output has the last position's logits ``(1, V)`` and
        every prompt position's hidden states ``(T_i, H)``."""

    def verify(self, inputs: list["SlotInput | None"]) -> TargetOutput:
        """Score each slot's ``[root, *draft]`` (None: an idle slot) after its cache in one forward."""

    def verified_step(self) -> "VerifiedStep":
        """The last verify's inputs on the device, as greedy verification reads them."""

    def commit(self, accepted: list[list[int] | None]) -> None:
        """Keep each slot's accepted nodes (ascending, root first; None for an idle slot) contiguously."""

    def commit_accepted(self, kept: torch.Tensor, source: torch.Tensor | None, host_kept) -> None:
        """``commit`` from the device verdict: ``kept`` ``(B,)``, ``source`` ``(B, P)`` paths or None (prefixes)."""

    def truncate(self, lengths: dict[int, int]) -> None:
        """Drop committed entries beyond ``lengths[slot]`` in each given slot."""

    def release(self, slot: int) -> None:
        """The slot's request ended."""
