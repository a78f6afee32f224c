"""An oracle proposer that drafts on the device, so its steps are queued ahead like plain and Medusa ones
(docs/engines.md#steps-queued-ahead): the target's own greedy continuation, held on the device, sliced at each
slot's position. The host advances a slot's position by K + 1 per step without reading anything, because an exact
oracle has every draft accepted. Bench-only (bench/speed_7b.py's oracle rows beside the host-scripted oracle,
which reads each step): a draft the target rejects (a continuation computed on another engine whose numerics
differ) puts it out of step for the rest of the request, which its mean acceptance length shows.
"""

from __future__ import annotations

import torch

from specbench.engine.draft import Draft
from specbench.engine.proposer import ProposerState, SlotProposer


class DeviceOracle(SlotProposer):
    """Drafts ``truth[p : p + K]`` for a slot at output position p (output token 0 comes from the prefill)."""

    queues_ahead = True  # it reads no state at all: each draft is a device slice at a host-known position

    def __init__(self, truth: list[int], num_speculative_tokens: int, device, batch_size: int = 1):
        self.k, self.truth_ids, self.device = num_speculative_tokens, list(truth), torch.device(device)
        padded = self.truth_ids + [0] * (num_speculative_tokens + 1)  # drafts past the end: token 0, rejected
        self.truth = torch.tensor(padded, dtype=torch.long, device=self.device)  # (T + K + 1,)
        self.position = [0] * batch_size  # per slot: the output index of its next draft's first token
        self._template = Draft.chain(torch.zeros(num_speculative_tokens, dtype=torch.long, device=self.device))

    @property
    def max_draft_tokens(self) -> int:
        return self.k

    def with_batch_size(self, batch_size: int) -> "DeviceOracle":
        return type(self)(self.truth_ids, self.k, self.device, batch_size)

    def describe(self) -> dict:
        return {"name": "device-oracle", "num_speculative_tokens": self.k}

    def begin_request(self, slot: int, prompt_ids: torch.Tensor) -> None:
        self.position[slot] = 1

    def propose(self, states: dict[int, ProposerState]) -> dict[int, Draft]:
        drafts = {}
        for slot in states:
            start = min(self.position[slot], len(self.truth_ids))
            drafts[slot] = self._template.with_tokens(self.truth[start: start + self.k])  # (K,) on the device
            self.position[slot] = start + self.k + 1  # every draft accepted, and the target's own token after it
        return drafts
