"""The proposer protocols: over the slots of a batch (``SlotProposer``, what the decode loop calls), per sequence
(``Proposer``: n-gram, scripted, third-party), the per-slot adapter that runs the second as the first, and
``for_batch``, a proposer's form for B slots."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, ClassVar

import torch

from specbench.compile_watch import capture_seconds
from specbench.engine.draft import Draft

if TYPE_CHECKING:
    from specbench.engine.history import History
    from specbench.engine.target import Target


@dataclass
class ProposerState:
    # (T,) prompt + emitted tokens, the last the next draft's root (None: steps queued before the host knows T)
    token_ids: torch.Tensor | None
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

    def fresh(self) -> "Proposer":
        """A new proposer with these settings and no request state, for another slot (``for_batch``); one that keeps
        large state (a model) leaves this out and its caller passes a factory instead."""
        raise ValueError(f"{type(self).__name__} keeps per-request state and has no batched form: pass factory= (a "
                         "callable building one per slot) to run it per slot")


class SlotProposer(ABC):
    """Drafts for the active slots of a batch; ``propose`` maps slot -> state to slot -> draft (None: a plain step)."""

    needs_hidden_states: bool = False
    # True: propose_queued drafts from the device history alone, so greedy steps may be queued ahead of the host's
    # reads (docs/engines.md#steps-queued-ahead); a subclass or wrapper whose propose reads more sets it False
    queues_ahead: bool = False

    @property
    @abstractmethod
    def max_draft_tokens(self) -> int:
        """Most draft nodes one slot's step can propose (sizes the cache and the verify width)."""

    def reserve(self, num_tokens: int) -> None:
        """Size per-slot preallocated state for requests of up to ``num_tokens`` tokens."""

    def begin_request(self, slot: int, prompt_ids: torch.Tensor) -> None:
        """A new request ``(T,)`` enters ``slot``: reset that slot's state."""

    @abstractmethod
    def propose(self, states: dict[int, ProposerState]) -> dict[int, Draft | None]:
        """One draft (or None) per active slot."""

    def propose_queued(self, history: "History", lengths: dict[int, int]) -> dict[int, Draft | None]:
        """``propose`` for a step queued before the host knows the lengths: ``lengths`` maps each active slot to an
        upper bound of its history's (exact for a request just admitted). Each state holds the slot's hidden state
        alone (``history.hidden``), which suffices a proposer drafting from it (Medusa); EAGLE reads more."""
        return self.propose({b: ProposerState(None, history.hidden[b]) for b in lengths})

    def describe(self) -> dict:
        return {"name": "batched"}

    def with_batch_size(self, batch_size: int) -> "SlotProposer":
        """This proposer for ``batch_size`` slots (a registry's slot proposer is built for its target's)."""
        raise NotImplementedError(f"{type(self).__name__} is built for its batch size; it has no with_batch_size")


class PerSlotProposer(SlotProposer):
    """One per-sequence :class:`Proposer` per slot, called in turn (n-gram on each slot's host mirror, and any
    proposer without a batched form: docs/batching.md)."""

    def __init__(self, proposers: list[Proposer]):
        if not proposers:
            raise ValueError("PerSlotProposer needs one proposer per slot, got none")
        if len({id(p) for p in proposers}) != len(proposers):
            raise ValueError("PerSlotProposer needs a distinct proposer per slot (each keeps its slot's state); "
                             "build them with PerSlotProposer.build(factory, batch_size)")
        self.proposers = proposers
        self.needs_hidden_states = any(p.needs_hidden_states for p in proposers)

    @classmethod
    def build(cls, factory: Callable[[], Proposer], batch_size: int) -> "PerSlotProposer":
        return cls([factory() for _ in range(batch_size)])

    @property
    def max_draft_tokens(self) -> int:
        return max(p.max_draft_tokens for p in self.proposers)

    @property
    def capture_seconds(self) -> float:
        """Every slot's proposer's graph capture so far (a run checks that none happened while timed)."""
        return capture_seconds(*self.proposers)

    def reserve(self, num_tokens: int) -> None:
        for proposer in self.proposers:
            proposer.reserve(num_tokens)

    def begin_request(self, slot: int, prompt_ids: torch.Tensor) -> None:
        self.proposers[slot].begin_request(prompt_ids)

    def propose(self, states: dict[int, ProposerState]) -> dict[int, Draft | None]:
        return {slot: self.proposers[slot].propose(state) for slot, state in states.items()}

    def describe(self) -> dict:
        return {**self.proposers[0].describe(), "batching": "per-slot"}


def for_batch(proposer: Proposer | SlotProposer | None, batch_size: int, factory: Callable[[], Proposer] | None = None):
    """``proposer`` for ``batch_size`` slots: a slot proposer (Medusa, the draft model, EAGLE-1/2/3) through its
    ``with_batch_size``; a per-sequence one (n-gram, scripted, third-party) one per slot, from ``factory`` or its
    ``fresh()`` copies (it keeps per-request state, so one instance cannot serve two slots), itself at one slot."""
    if proposer is None and factory is None:
        return None
    if isinstance(proposer, SlotProposer):
        return proposer.with_batch_size(batch_size)
    if factory is None and batch_size == 1:  # one slot: the proposer itself keeps its one request's state
        return PerSlotProposer([proposer])
    return PerSlotProposer.build(factory or proposer.fresh, batch_size)
