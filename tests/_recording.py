"""Decodes of one request at a time that also record every draft a proposer made, for the batched-proposer tests."""

from __future__ import annotations

from specbench.engine.decode import Decoder
from specbench.engine.proposer import SlotProposer


def decode_alone_recording(target, make, prompts, config):
    """Each prompt alone through the Decoder on ``target`` (the eager reference, or a static target of batch size 1)
    with a fresh ``make()`` proposer (per-sequence, or a slot proposer of one slot); (results, each request's drafts as
    token lists)."""
    results, drafts = [], []
    for prompt in prompts:
        proposer, seen = make(), []
        propose = proposer.propose
        if isinstance(proposer, SlotProposer):
            proposer.propose = lambda states, propose=propose, seen=seen: {
                slot: _keep(seen, draft) for slot, draft in propose(states).items()}
        else:
            proposer.propose = lambda state, propose=propose, seen=seen: _keep(seen, propose(state))
        results.append(Decoder(target, proposer, config).generate(prompt))
        drafts.append(seen)
    return results, drafts


def _keep(seen: list, draft):
    seen.append(draft.tokens.tolist())
    return draft
