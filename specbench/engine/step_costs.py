"""Same-run step costs of a case: T(1), the verify cost of its proposer's draft, and the draft's own cost.

The speedup speculative decoding can reach follows from three times measured on the same target in the
same process (docs/metrics.md#step-costs): T(1), one plain verify step; T(draft), one verify of the root
plus a draft of the case's proposer (width K + 1 for a chain, nodes + 1 for a tree); and the proposer's
``propose`` call. Each is timed with the device synchronised before and after, on a freshly prefilled
prompt, ``reps`` times after ``warmup`` untimed calls; the medians are kept. Ratios of the three do not
depend on how fast the host is, which is why they are gated tightly where absolute timings are not.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch

from specbench.engine.draft import Draft
from specbench.engine.proposer import Proposer, ProposerState
from specbench.engine.target import Target

DEFAULT_REPS = 10
DEFAULT_WARMUP = 2


@dataclass
class StepCosts:
    """Median seconds of one plain verify, one verify with the draft, and one ``propose``."""

    t1_s: float
    verify_s: float
    draft_s: float
    verify_width: int  # nodes the draft verify scored (root included)
    reps: int

    @property
    def verify_cost_ratio(self) -> float:
        """T(K + 1) / T(1): what verifying the draft costs in plain steps."""
        return self.verify_s / self.t1_s

    @property
    def draft_cost_ratio(self) -> float:
        """Proposer time per step / T(1)."""
        return self.draft_s / self.t1_s

    def predicted_speedup(self, mean_acceptance_length: float) -> float:
        """MAL plain steps' worth of tokens per speculative step, which costs verify + draft: MAL / (ratios)."""
        return mean_acceptance_length / (self.verify_cost_ratio + self.draft_cost_ratio)

    def to_dict(self) -> dict:
        return {**asdict(self), "verify_cost_ratio": self.verify_cost_ratio, "draft_cost_ratio": self.draft_cost_ratio}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(device: torch.device, fn) -> tuple[float, object]:
    _sync(device)
    start = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - start, out


@torch.inference_mode()
def measure_step_costs(target: Target, proposer: Proposer | None, prompt_ids, *, reps: int = DEFAULT_REPS,
                       warmup: int = DEFAULT_WARMUP) -> StepCosts:
    """Time T(1), the verify of ``proposer``'s first draft after ``prompt_ids`` and that ``propose`` call.

    Without a proposer the draft verify is the plain one and the draft cost 0; a proposer that drafts nothing
    there is charged its ``propose`` time and the verify of a chain of its ``max_draft_tokens``.
    """
    if reps < 1 or warmup < 0:
        raise ValueError(f"step costs need reps >= 1 and warmup >= 0, got reps={reps}, warmup={warmup}")
    device = target.device
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long).flatten()  # (T,)
    prefill = target.prefill(prompt)
    root = prefill.logits[-1].argmax().reshape(1).to(device)  # (1,) the first output token
    tokens = torch.cat([prompt.to(device), root])  # (T + 1,)
    features = prefill.aux_hidden_states if prefill.aux_hidden_states is not None else prefill.hidden_states  # (T, F)
    state = ProposerState(token_ids=tokens, hidden_state=prefill.hidden_states[-1], hidden_states=features)

    draft, draft_times = None, []
    if proposer is not None:
        proposer.begin_request(prompt.to(device))
        for i in range(warmup + reps):
            seconds, draft = _timed(device, lambda: proposer.propose(state))
            if i >= warmup:
                draft_times.append(seconds)
    if not draft_times:
        draft_times = [0.0]  # no proposer: plain decoding drafts nothing
    if (draft is None or not len(draft)) and proposer is not None and proposer.max_draft_tokens > 0:
        # nothing drafted at this prompt (an n-gram without a match): verify a full-width chain instead,
        # the step the model charges every speculative step with; its cost does not depend on the tokens
        draft = Draft.chain(root.cpu().repeat(proposer.max_draft_tokens))
    draft = draft if draft is not None else Draft.chain(torch.empty(0, dtype=torch.long))

    def verify_times(step: Draft) -> list[float]:
        ids = torch.cat([root, step.tokens.to(device)])  # (N + 1,) root first
        mask = None if step.is_chain else step.tree_mask()
        depths = step.depths()
        times = []
        for i in range(warmup + reps):
            target.prefill(prompt)  # every timed verify starts from the same cache state
            seconds, _ = _timed(device, lambda: target.verify(ids, depths, mask))
            target.commit([0], num_verified=ids.numel())
            if i >= warmup:
                times.append(seconds)
        return times

    t1 = statistics.median(verify_times(Draft.chain(torch.empty(0, dtype=torch.long))))
    verify = statistics.median(verify_times(draft)) if len(draft) else t1
    return StepCosts(t1_s=t1, verify_s=verify, draft_s=statistics.median(draft_times), verify_width=len(draft) + 1, reps=reps)
