"""The draft-model proposer of B slots: one draft model in batched form drafts every active slot's chain at once."""

from __future__ import annotations


import torch

from specbench.engine.transfers import host_to_device
from specbench.engine.slot_proposer import SlotProposer, PerSlotProposer
from specbench.engine.step_inputs import SlotInput
from specbench.engine.draft import Draft
from specbench.engine.proposer import ProposerState
from specbench.engine.static_target import StaticTarget
from specbench.proposers.draft_model import DraftModelProposer


class BatchedDraftModelProposer(SlotProposer):
    """A greedy :class:`~specbench.proposers.draft_model.DraftModelProposer` for B slots: its draft model as one
    :class:`StaticTarget` (the draft's weights shared, its own ``(layers, 2, B, ...)`` cache), so a propose
    call runs K batched draft forwards whatever B: one ragged catch-up step, then K - 1 single-token steps.

    Each slot follows the single-sequence proposer's rule (draft_model.py): the K - 1 tokens it fed last time
    are kept as far as the target accepted them, the rest is truncated and the new tokens (at least the last
    one) are fed. The history beyond the slot's anchor is the accepted draft tokens, then one token of the
    target's own (a lossless verifier never emits the rejected draft token), so the single proposer's common
    prefix is ``min(fed, accepted)`` with ``accepted = len(history) - anchor - 1``: known on the host from the
    lengths alone, nothing is read back. A new request (or a shorter history) is prefilled into its slot alone.
    Draft tokens are argmaxes on the device; each slot's draft is a device-held ``(K,)`` chain."""

    def __init__(self, draft: StaticTarget, *, num_speculative_tokens: int, source: str = "",
                 settings: dict | None = None):
        if not isinstance(num_speculative_tokens, int) or num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens (K) must be an integer >= 1, got {num_speculative_tokens!r}")
        self.target, self.k, self.source = draft, num_speculative_tokens, source
        self._settings = settings or {"name": DraftModelProposer.name, "draft": source,
                                      "num_speculative_tokens": num_speculative_tokens, "temperature": 0.0}
        batch = draft.batch_size
        self._anchor = [0] * batch  # per slot: history positions below it are in the draft cache and final
        self._fed = [0] * batch  # per slot: draft tokens fed beyond the anchor last time (maybe rejected)
        self._rows = torch.arange(batch, device=draft.device)  # (B,)
        self._template = Draft.chain(torch.zeros(num_speculative_tokens, dtype=torch.long, device=draft.device))

    @classmethod
    def from_proposer(cls, proposer: DraftModelProposer, batch_size: int) -> "BatchedDraftModelProposer | None":
        """The batched form of ``proposer`` (its draft model's weights shared), or None where it has none: a
        ``temperature`` > 0 draft (its sampling stays per slot) or a draft not on the static engine."""
        if proposer.temperature > 0 or not isinstance(proposer.draft, StaticTarget):
            return None
        # its prefills stay eager: they happen inside timed steps, at lengths known only then (docs/batching.md)
        target = proposer.draft.with_batch_size(batch_size, prefill_graphs=False)
        return cls(target, num_speculative_tokens=proposer.k, source=proposer.source, settings=proposer.describe())

    @property
    def max_draft_tokens(self) -> int:
        return self.k

    @property
    def capture_seconds(self) -> float:
        """The draft target's graph capture so far (a run checks that none happened while timed)."""
        return self.target.capture_seconds

    def describe(self) -> dict:
        return {**self._settings, "engine": type(self.target).__name__,
                "batching": "batched draft model (greedy; a temperature > 0 draft runs per slot)"}

    def reserve(self, num_tokens: int) -> None:
        # as the single proposer: the history plus the K - 1 tokens fed; catch-up steps feed up to 2
        self.target.reserve(num_tokens, 1)
        for slot in range(self.target.batch_size):  # between runs (a new cache or not): every slot starts over
            self._reset(slot)
        self.target.prepare_steps(kinds=("plain", "chain"))  # its steps' graphs at every span, before the timed run

    def begin_request(self, slot: int, prompt_ids: torch.Tensor) -> None:
        self._reset(slot)

    def _reset(self, slot: int) -> None:
        self._anchor[slot], self._fed[slot] = 0, 0
        if self.target.cache_length(slot):
            self.target.release(slot)

    @torch.inference_mode()
    def propose(self, states: dict[int, ProposerState]) -> dict[int, Draft | None]:
        if not states:
            return {}
        target, batch = self.target, self.target.batch_size
        for slot in range(batch):  # a slot no longer decoding frees its rows (its padding stays in the cache)
            if slot not in states and (self._anchor[slot] or target.cache_length(slot)):
                self._reset(slot)
        slots = list(states)
        token = self._catch_up(states)  # (B,) each slot's first draft token
        columns = [token]
        if self.k > 1:
            live = [int(b in states) for b in range(batch)]
            kept = host_to_device(live, target.device)  # (B,) one node kept per active slot, 0 idle
            for _ in range(self.k - 1):  # the last draft token is never fed: the target verifies it
                inputs = [SlotInput([], [0], tail=token[b : b + 1]) if live[b] else None for b in range(batch)]
                logits = target.verify(inputs).logits  # (B, 1, V)
                target.commit_accepted(kept, None, lambda: live)
                token = logits[:, 0].argmax(dim=-1)  # (B,)
                columns.append(token)
        tokens = torch.stack(columns, dim=1)  # (B, K)
        for slot in slots:
            self._fed[slot] = self.k - 1
        return {slot: self._template.with_tokens(tokens[slot]) for slot in slots}

    def _catch_up(self, states: dict[int, ProposerState]) -> torch.Tensor:
        """Bring every active slot's draft cache to its history; returns ``(B,)`` the argmax after each history's
        last token (rows of idle slots: anything). New requests are prefilled alone; the rest truncate what the
        target rejected and feed their new tokens in one ragged batched step."""
        target, batch = self.target, self.target.batch_size
        inputs: list[SlotInput | None] = [None] * batch
        truncate, prefilled = {}, {}
        for slot, state in states.items():
            length, anchor = state.token_ids.numel(), self._anchor[slot]  # host-known: the view's shape
            if anchor == 0 or anchor > length:  # a new request (or a shorter history): start over
                prefilled[slot] = target.prefill(slot, state.token_ids).logits[-1]  # (V,)
            else:
                keep = anchor + min(self._fed[slot], length - 1 - anchor)  # at most length - 1: re-feed the last
                if keep != target.cache_length(slot):
                    truncate[slot] = keep
                new = state.token_ids[keep:]  # (n,) n >= 1, device-held
                inputs[slot] = SlotInput([], list(range(new.numel())), tail=new)
            self._anchor[slot] = length
        token = None
        if any(x is not None for x in inputs):
            if truncate:
                target.truncate(truncate)
            counts = [0 if x is None else len(x) for x in inputs]
            logits = target.verify(inputs).logits  # (B, W, V) row b's first counts[b] are real
            last = host_to_device([max(n - 1, 0) for n in counts], target.device)  # (B,)
            target.commit_accepted(host_to_device(counts, target.device), None, lambda: counts)
            token = logits[self._rows, last].argmax(dim=-1)  # (B,)
        if token is None:
            token = torch.zeros(batch, dtype=torch.long, device=target.device)  # (B,)
        for slot, logits in prefilled.items():
            token[slot] = logits.argmax()
        return token



class PerSlotDraftModelProposer(PerSlotProposer):
    """A draft model with no batched form (a ``temperature`` > 0 draft: its sampling is not batched; or a draft
    off the static engine), one single-sequence proposer per slot."""

    def describe(self) -> dict:
        reason = "temperature > 0 draft" if self.proposers[0].temperature > 0 else "draft not on the static engine"
        return {**super().describe(), "batching": f"per-slot ({reason}: not batched)"}
