"""The proposer protocol: given the decoding state, return a draft chain or tree (or nothing)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from specbench.engine.draft import Draft

if TYPE_CHECKING:
    from specbench.engine.target import Target


@dataclass
class ProposerState:
    token_ids: torch.Tensor  # (T,) prompt + emitted tokens; the last one is the root of the next draft
    # (H,) the target's final hidden state at the position that predicted token_ids[-1]
    hidden_state: torch.Tensor | None = None
    # (T - 1, H) the target's final hidden state at every position but the last: row i predicted token_ids[i + 1]
    # (EAGLE's "features"); filled only for proposers that set ``needs_hidden_states``; (T - 1, A * H) the aux
    # layers' residual streams instead when the proposer asked the target for them (``set_aux_layers``, EAGLE-3)
    hidden_states: torch.Tensor | None = None


class Proposer(ABC):
    """Base class of every proposer. Subclasses set ``name`` and build themselves in ``from_options``."""

    name: ClassVar[str]
    # True: the decode loop keeps every position's target hidden state for ProposerState.hidden_states
    needs_hidden_states: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def from_options(cls, target: "Target", **options) -> "Proposer":
        """Build from a target and user options (CLI flags, case files); reject unknown options."""

    @property
    @abstractmethod
    def max_draft_tokens(self) -> int:
        """Most draft nodes one step can propose (sizes the context-length check)."""

    def reserve(self, num_tokens: int) -> None:
        """Size preallocated state (a draft model's cache) for requests of up to ``num_tokens`` tokens; called
        with the target's reserve, before timing starts."""

    def begin_request(self, prompt_ids: torch.Tensor) -> None:
        """Reset per-request state; ``prompt_ids`` is ``(T,)``."""

    @abstractmethod
    def propose(self, state: ProposerState) -> Draft | None:
        """Return the next draft, or None for a plain decoding step."""

    def describe(self) -> dict:
        """Settings that identify this proposer in results and baselines."""
        return {"name": self.name}
