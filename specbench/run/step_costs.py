"""Same-run step costs of a case: T(1), the verify cost of its proposer's draft, and the draft's own cost.

The speedup speculative decoding can reach follows from three times measured on the same target in the
same process (docs/metrics.md#step-costs): T(1), one plain verify step; T(draft), one verify of the root
plus a draft of the case's proposer (width K + 1 for a chain, nodes + 1 for a tree); and the proposer's
``propose`` call. Each is timed with the device synchronised before and after, on a freshly prefilled
prompt, ``reps`` times after ``warmup`` untimed calls; the medians are kept. Ratios of the three do not
depend on how fast the host is, which is why they are gated tightly where absolute timings are not.
At batch size B each covers every slot, all active (docs/batching.md).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch

from specbench.engine.proposer import ProposerState, SlotProposer
from specbench.engine.step_inputs import SlotInput, slot_input
from specbench.engine.draft import Draft
from specbench.engine.target import Target

DEFAULT_REPS = 10
DEFAULT_WARMUP = 2


@dataclass
class StepCosts:
    """Median seconds of one plain verify, one verify with the draft, and one ``propose``, at batch size B."""

    t1_s: float
    verify_s: float
    draft_s: float
    verify_width: int  # nodes the draft verify scored per slot (root included)
    reps: int
    batch_size: int = 1  # slots each verify and propose covered

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


def _check_reps(reps: int, warmup: int) -> None:
    if reps < 1 or warmup < 0:
        raise ValueError(f"step costs need reps >= 1 and warmup >= 0, got reps={reps}, warmup={warmup}")


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
def measure_step_costs(target: Target, proposer: SlotProposer | None, prompts, *,
                               reps: int = DEFAULT_REPS, warmup: int = DEFAULT_WARMUP) -> StepCosts:
    """T(1) and T(W) at B = ``target.batch_size`` with every slot active, and one batched ``propose`` over B slots.

    Slot b is prefilled with ``prompts[b % len(prompts)]`` (token ids); T(1) is the plain step (width 1 per slot),
    T(W) the verify of each slot's root plus its draft from ``proposer``'s last timed ``propose`` (W: the step's
    fixed per-slot width, K + 1 for a chain, nodes + 1 for a tree; a slot that drafted nothing is charged a chain
    of ``max_draft_tokens``, the step every speculative step is charged with). Needs a reserved target with idle slots (between runs);
    after each timed verify the slots keep the root alone and are truncated back to their prompts, so every timed
    step starts from the same cache state, and every slot is released at the end (the proposer's slots are
    begun anew by the next run's admissions)."""
    _check_reps(reps, warmup)
    device, batch = target.device, target.batch_size
    # slot b's prompt (T_b,), the run's prompt set over again where B is larger
    prompt_ids = [torch.as_tensor(prompts[b % len(prompts)], dtype=torch.long).flatten() for b in range(batch)]
    features_needed = proposer is not None and proposer.needs_hidden_states
    roots, states = [], {}
    for b, prompt in enumerate(prompt_ids):
        prefill = target.prefill(b, prompt)
        root = prefill.logits[-1].argmax().reshape(1).to(device)  # (1,) the slot's first output token
        roots.append(int(root))
        features = None
        if features_needed:  # (T_b, F) row i predicted prompt[i + 1]
            features = prefill.aux_hidden_states if prefill.aux_hidden_states is not None else prefill.hidden_states
        states[b] = ProposerState(token_ids=torch.cat([prompt.to(device), root]),  # (T_b + 1,)
                                  hidden_state=prefill.hidden_states[-1], hidden_states=features)  # (H,), (T_b, F)

    drafts, draft_times = {}, []
    if proposer is not None:
        for b, prompt in enumerate(prompt_ids):
            proposer.begin_request(b, prompt.to(device))
        for i in range(warmup + reps):
            seconds, drafts = _timed(device, lambda: proposer.propose(states))
            if i >= warmup:
                draft_times.append(seconds)
    full = proposer.max_draft_tokens if proposer is not None else 0

    def draft_of(slot: int) -> Draft:
        draft = drafts.get(slot)
        if draft is not None and len(draft):
            return draft
        # nothing drafted for this slot: the full-width chain every speculative step is charged with
        return Draft.chain(torch.full((full,), roots[slot], dtype=torch.long))

    lengths = {b: prompt.numel() for b, prompt in enumerate(prompt_ids)}

    def verify_times(inputs: list[SlotInput]) -> tuple[list[float], int]:
        """(seconds of the timed calls, the step's width W: the kind's fixed width, which may pad the widest slot)."""
        times, width = [], 1
        for i in range(warmup + reps):
            seconds, out = _timed(device, lambda: target.verify(inputs))  # logits (B, W, V)
            width = out.logits.shape[1]
            target.commit([[0]] * batch)
            target.truncate(lengths)  # back to the prompts: every timed verify starts from the same cache state
            if i >= warmup:
                times.append(seconds)
        return times, width

    t1 = statistics.median(verify_times([SlotInput([root], [0]) for root in roots])[0])
    step = [slot_input(roots[b], draft_of(b), device) for b in range(batch)]
    verify, width = t1, 1
    if max(len(x) for x in step) > 1:
        times, width = verify_times(step)
        verify = statistics.median(times)
    for b in range(batch):
        target.release(b)
    return StepCosts(t1_s=t1, verify_s=verify, draft_s=statistics.median(draft_times) if draft_times else 0.0,
                            verify_width=width, reps=reps, batch_size=batch)
