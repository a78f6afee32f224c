"""Single-sequence decodes that also record every draft a proposer made, for the batched-proposer tests."""

from __future__ import annotations

from specbench.engine.decode import Decoder


def decode_alone_recording(static, make, prompts, config):
    """Each prompt through the single-sequence Decoder with a fresh ``make()`` proposer; (results, each request's
    drafts as token lists)."""
    results, drafts = [], []
    for prompt in prompts:
        proposer, seen = make(), []
        propose = proposer.propose
        proposer.propose = lambda state, propose=propose, seen=seen: _keep(seen, propose(state))
        results.append(Decoder(static, proposer, config).generate(prompt))
        drafts.append(seen)
    return results, drafts


def _keep(seen: list, draft):
    seen.append(draft.tokens.tolist())
    return draft
