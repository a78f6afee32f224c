"""The batched decode loop (offline serving): a prompt queue, B slots decoded together, slots refilled as requests end.

Each step every active slot proposes, one batched verify scores all slots at the step kind's fixed
width, each slot is verified on its own (greedy, or rejection sampling with its own generator) and
commits its own ragged path; counters and output tokens are kept per request, as
:class:`~specbench.engine.decode.Decoder` keeps them for one. A request that ends (EOS unless
ignore_eos, or max_new_tokens) frees its slot, which the next queued prompt refills. Plain decoding
is the same loop without a proposer (docs/batching.md).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch

from specbench.engine.batched_cache import host_to_device
from specbench.engine.batched_proposers import BatchedProposer
from specbench.engine.batched_target import BatchedStaticTarget, SlotInput
from specbench.engine.decode import GenerationConfig, GenerationResult, _synchronize, verify_step
from specbench.engine.draft import Draft
from specbench.engine.proposer import ProposerState
from specbench.engine.verification import verify
from specbench.metrics import RequestTiming, SpecCounters

_EMPTY_DRAFT = Draft.chain(torch.empty(0, dtype=torch.long))


@dataclass
class BatchedGenerationResult(GenerationResult):
    """A request's :class:`GenerationResult` from a batched run: its timing is measured in that run
    (TTFT from its admission to its first token); ``queue_s`` is the time it waited for a free slot."""

    slot: int = -1
    queue_s: float = 0.0


@dataclass
class BatchedRunStats:
    num_steps: int = 0  # batched verify forwards
    num_admissions: int = 0  # prompts prefilled into a slot
    num_refills: int = 0  # admissions into a slot a finished request had used
    active_per_step: list[int] = field(default_factory=list)  # slots decoding in each step


@dataclass
class _Slot:
    """One request in flight: its device history, counters and clocks."""

    request: int
    tokens: torch.Tensor  # (capacity,) prompt + emitted tokens; tokens[:length] is the history
    length: int
    emitted: list[int]
    hidden: torch.Tensor  # (H,) the target's hidden state that predicted tokens[length - 1]
    generator: torch.Generator
    admitted_at: float
    first_token_s: float
    features: torch.Tensor | None = None  # (capacity, F) row i predicted tokens[i + 1] (feature-reading proposers)
    counters: SpecCounters = field(default_factory=SpecCounters)
    finished: bool = False


class BatchedDecoder:
    """Generate every prompt of a queue with ``target``'s B slots, drafting with ``proposer`` (None = plain)."""

    def __init__(self, target: BatchedStaticTarget, proposer: BatchedProposer | None, config: GenerationConfig):
        self.target, self.proposer, self.config = target, proposer, config
        self.stats = BatchedRunStats()

    @property
    def _draft_room(self) -> int:
        return self.proposer.max_draft_tokens if self.proposer else 0

    def _reserve(self, prompts: list[torch.Tensor]) -> None:
        """Size every slot for the longest request before anything runs (the memory check comes first)."""
        limit = self.target.max_context
        for index, prompt in enumerate(prompts):
            if prompt.numel() == 0:
                raise ValueError(f"prompt {index} is empty: at least one prompt token is needed to start decoding")
            needed = prompt.numel() + self.config.max_new_tokens + self._draft_room
            if needed > limit:
                raise ValueError(
                    f"context length exceeded: prompt {index} ({prompt.numel()} tokens) + max_new_tokens "
                    f"({self.config.max_new_tokens}) + draft tokens per step ({self._draft_room}) = {needed} > the "
                    f"target's max context {limit}; shorten the prompt or lower max_new_tokens"
                )
        longest = max(p.numel() for p in prompts) + self.config.max_new_tokens + self._draft_room
        self.target.reserve(longest, self._draft_room)
        if self.proposer is not None:
            self.proposer.reserve(longest)

    @torch.inference_mode()
    def generate_all(self, prompts: list, seeds: list[int] | None = None) -> list[BatchedGenerationResult]:
        """Decode every prompt; results in prompt order. Request i samples with ``seeds[i]`` (default: the config's
        seed), as ``Decoder.generate(prompt, seed)`` would alone."""
        prompts = [torch.as_tensor(p, dtype=torch.long).flatten() for p in prompts]
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"seeds must give one seed per prompt ({len(prompts)}), got {len(seeds)}")
        self._reserve(prompts)
        self.stats = BatchedRunStats()
        queue = deque(range(len(prompts)))
        slots: list[_Slot | None] = [None] * self.target.batch_size
        used = [False] * self.target.batch_size
        results: list[BatchedGenerationResult | None] = [None] * len(prompts)
        run_start = time.perf_counter()
        while True:
            self._refill(slots, used, queue, prompts, seeds, results, run_start)
            active = [b for b, s in enumerate(slots) if s is not None]
            if not active:
                break
            self._step(slots, active)
            for b in active:
                if slots[b].finished:
                    results[slots[b].request] = self._finish(slots[b], b, run_start)
                    slots[b] = None
                    self.target.release(b)
        return results

    def _refill(self, slots, used, queue, prompts, seeds, results, run_start) -> None:
        """Admit queued prompts into free slots; a request done at its first token frees its slot at once."""
        for b in range(len(slots)):
            while slots[b] is None and queue:
                index = queue.popleft()
                self.stats.num_admissions += 1
                self.stats.num_refills += used[b]
                used[b] = True
                seed = self.config.seed if seeds is None else seeds[index]
                slots[b] = self._admit(b, index, prompts[index], seed)
                if slots[b].finished:
                    results[index] = self._finish(slots[b], b, run_start)
                    slots[b] = None
                    self.target.release(b)

    def _admit(self, slot: int, index: int, prompt: torch.Tensor, seed: int) -> _Slot:
        """Prefill ``prompt`` into ``slot`` and take its first token, as the single-sequence loop does."""
        device = self.target.device
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)
        _synchronize(device)
        admitted_at = time.perf_counter()
        prefill = self.target.prefill(slot, prompt)
        first = verify(_EMPTY_DRAFT, prefill.logits, self.config.sampling, generator)
        _synchronize(device)
        first_token_s = time.perf_counter() - admitted_at
        tokens = torch.zeros(prompt.numel() + self.config.max_new_tokens + self._draft_room + 1, dtype=torch.long,
                             device=device)  # (capacity,)
        tokens[: prompt.numel()] = prompt.to(device)
        tokens[prompt.numel()] = first.next_token
        state = _Slot(index, tokens, prompt.numel() + 1, [first.next_token], prefill.hidden_states[-1], generator,
                      admitted_at, first_token_s)
        if self.proposer is not None and self.proposer.needs_hidden_states:
            source = prefill.aux_hidden_states if prefill.aux_hidden_states is not None else prefill.hidden_states
            state.features = source.new_zeros(tokens.numel(), source.shape[-1])  # (capacity, F)
            state.features[: prompt.numel()] = source
        state.finished = self._ended(state)
        if self.proposer is not None and not state.finished:
            self.proposer.begin_request(slot, prompt.to(device))
        return state

    def _ended(self, state: _Slot) -> bool:
        eos = () if self.config.ignore_eos else self.config.eos_token_ids
        return state.emitted[-1] in eos or len(state.emitted) >= self.config.max_new_tokens

    def _step(self, slots: list[_Slot | None], active: list[int]) -> None:
        """Propose for every active slot, verify all slots in one forward, verify and commit each slot."""
        drafts = self._propose(slots, active)
        inputs: list[SlotInput | None] = [None] * len(slots)
        nodes = {}  # slot -> its verify input's node count
        for b in active:
            state, draft = slots[b], drafts[b]
            if draft.tokens.device.type == "cpu":  # plain, n-gram, scripted: the whole input is host-known
                # the root is the last emitted token (tokens[length - 1] of an active slot): no device read
                ids = torch.tensor([state.emitted[-1], *draft.tokens.tolist()], dtype=torch.long)  # (N + 1,)
            else:
                ids = torch.cat([state.tokens[state.length - 1: state.length], draft.tokens.to(state.tokens.device)])  # (N + 1,)
            nodes[b] = ids.numel()
            inputs[b] = SlotInput(ids, draft.depths(), None if draft.is_chain else draft.tree_mask())
        out = self.target.verify(inputs)  # logits (B, W, V), hidden (B, W, H)
        step_ids = self.target.verified_ids()  # (B, W) the verify input on the device
        paths: list[list[int] | None] = [None] * len(slots)
        emitted = {}
        for b in active:
            n = nodes[b]
            paths[b], emitted[b] = verify_step(drafts[b], step_ids[b, :n], out.logits[b, :n], self.config.sampling,
                                                 slots[b].generator)
        self.target.commit(paths)
        self.stats.num_steps += 1
        self.stats.active_per_step.append(len(active))
        for b in active:
            self._advance(slots[b], drafts[b], paths[b], emitted[b], out, b)

    def _propose(self, slots: list[_Slot | None], active: list[int]) -> dict[int, Draft]:
        if self.proposer is None:
            return {b: _EMPTY_DRAFT for b in active}
        states = {}
        for b in active:
            s = slots[b]
            states[b] = ProposerState(token_ids=s.tokens[: s.length], hidden_state=s.hidden,
                                      hidden_states=None if s.features is None else s.features[: s.length - 1])
        drafts = self.proposer.propose(states)
        return {b: d if d is not None and len(d) else _EMPTY_DRAFT for b, d in drafts.items()}

    def _advance(self, state: _Slot, draft: Draft, path: list[int], new: list[int], out, b: int) -> None:
        """Record slot ``b``'s step: counters, hidden state, history, features, emitted tokens and its end."""
        state.counters.record_step(draft.depth(), len(path) - 1)
        state.hidden = out.hidden_states[b, path[-1]]  # (H,) predicted the last emitted token
        end = state.length + len(new)
        if end > state.tokens.numel():  # a proposer drafting beyond its max_draft_tokens
            state.tokens = torch.cat([state.tokens, state.tokens.new_zeros(end - state.tokens.numel())])
            if state.features is not None:
                grow = state.features.new_zeros(end - state.features.shape[0], state.features.shape[1])
                state.features = torch.cat([state.features, grow])
        if state.features is not None:  # the accepted path's hidden states predicted the tokens emitted now
            source = out.aux_hidden_states if out.aux_hidden_states is not None else out.hidden_states
            state.features[state.length - 1: end - 1] = source[b, path]
        state.tokens[state.length: end].copy_(host_to_device(new, state.tokens.device))  # no stream sync
        state.length = end
        eos = () if self.config.ignore_eos else self.config.eos_token_ids
        for token in new:
            state.emitted.append(token)
            if token in eos:
                break
        state.finished = self._ended(state)

    def _finish(self, state: _Slot, slot: int, run_start: float) -> BatchedGenerationResult:
        _synchronize(self.target.device)
        total = time.perf_counter() - state.admitted_at
        emitted = state.emitted[: self.config.max_new_tokens]
        eos = () if self.config.ignore_eos else self.config.eos_token_ids
        timing = RequestTiming(num_output_tokens=len(emitted), time_to_first_token_s=state.first_token_s, total_s=total)
        return BatchedGenerationResult(
            output_token_ids=emitted, counters=state.counters, timing=timing,
            finish_reason="eos" if emitted[-1] in eos else "length", slot=slot, queue_s=state.admitted_at - run_start,
        )
