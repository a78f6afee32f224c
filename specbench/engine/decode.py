"""The decode loop of every engine: a prompt queue, B slots decoded together (B = 1 for one sequence), slots refilled
as requests end; plain and speculative decoding through one code path.

Plain decoding is the same loop without a proposer, so both share the cache, the forward and the timing, and a
speedup compares like with like (docs/metrics.md). Each step every active slot proposes, one verify scores all
slots at the step kind's fixed width, greedy verification judges all slots at once on the device (sampling: each
slot with its own generator), each slot's ragged path is committed and its history appended by batch-wide device
ops, and the host reads the step's outcome in one transfer. Draft length is never shortened to fit
``max_new_tokens``; the output is truncated instead, and counters count what was verified. A request that ends
(EOS unless ignore_eos, or max_new_tokens) frees its slot, which the next queued prompt refills (docs/batching.md).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch

from specbench.engine.proposer import ProposerState, Proposer, SlotProposer, for_batch
from specbench.engine.step_inputs import SlotInput, slot_input
from specbench.engine.device_verification import (BatchVerdict, read_step, rejection_chain_on_device,
                                                  verify_batch_greedy as verify_batch)
from specbench.engine.draft import Draft
from specbench.engine.history import History
from specbench.engine.sampling import SamplingParams
from specbench.engine.verification import verifies_greedily, verify
from specbench.metrics import RequestTiming, SpecCounters

_EMPTY_DRAFT = Draft.chain(torch.empty(0, dtype=torch.long))


@dataclass
class GenerationConfig:
    max_new_tokens: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    ignore_eos: bool = False
    eos_token_ids: tuple[int, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class GenerationResult:
    """One request's output, counters and timing (TTFT from its admission to its first token); ``slot`` held it and
    ``queue_s`` is the time it waited for a free slot."""

    output_token_ids: list[int]
    counters: SpecCounters
    timing: RequestTiming
    finish_reason: str  # "length" or "eos"
    slot: int = 0
    queue_s: float = 0.0


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class RunStats:
    num_steps: int = 0  # batched verify forwards
    num_admissions: int = 0  # prompts prefilled into a slot
    num_refills: int = 0  # admissions into a slot a finished request had used
    active_per_step: list[int] = field(default_factory=list)  # slots decoding in each step
    step_tokens: int = 0  # output tokens the verify steps emitted (each request's first comes from its prefill)
    admission_s: float = 0.0  # wall time of admissions: group prefills and first tokens
    step_s: float = 0.0  # wall time of the verify steps, proposing included

    @property
    def decode_throughput_tokens_per_s(self) -> float:
        """Output tokens of the steps / their wall time: the decode phase's throughput, admissions left out."""
        return self.step_tokens / self.step_s if self.step_s > 0 else float("nan")


@dataclass
class _Slot:
    """One request in flight: its host-side length, emitted tokens, counters and clocks (its device rows live in
    the decoder's :class:`~specbench.engine.history.History`)."""

    request: int
    length: int  # tokens in its history: prompt + emitted
    emitted: list[int]
    generator: torch.Generator
    admitted_at: float
    first_token_s: float
    counters: SpecCounters = field(default_factory=SpecCounters)
    finished: bool = False
    ended_at: float | None = None  # when its last token reached the host, if a later step was already queued


class Decoder:
    """Generate every prompt of a queue with ``target``'s B slots, drafting with ``proposer`` (None = plain; a
    per-sequence :class:`Proposer` runs per slot: ``for_batch``)."""

    def __init__(self, target, proposer: SlotProposer | Proposer | None, config: GenerationConfig):
        if isinstance(proposer, Proposer):
            proposer = for_batch(proposer, target.batch_size)
        self.target, self.proposer, self.config = target, proposer, config
        self.stats = RunStats()
        # greedy steps queued one ahead of their reads (plain; drafted from the device history alone) where the device
        # runs apart from the host and the target settles host lengths later (docs/engines.md#steps-queued-ahead)
        self.queue_ahead = target.device.type != "cpu"
        self._queued: tuple | None = None  # the step in flight: what _read takes
        self._depth_list: tuple[torch.Tensor, list[int]] | None = None  # (the last static tree's depths, as a list)

    def prepare(self, prompts: list[torch.Tensor]) -> None:
        """Size every slot for the longest of ``prompts`` (the memory check comes first) and capture every graph they
        can replay (prefills, steps at every span, the proposer's); ``generate_all`` calls it, and a caller that warms
        up on fewer prompts calls it on the full set first, so nothing is captured once the clock runs."""
        limit, room = self.target.max_context, self.proposer.max_draft_tokens if self.proposer else 0  # room: per step
        longest = max(p.numel() for p in prompts) + self.config.max_new_tokens
        # queued ahead, a slot's cache holds two steps' drafts; where they do not fit, steps are read one by one
        self._ahead = (self.queue_ahead and hasattr(self.target, "settle") and verifies_greedily(self.config.sampling)
                       and longest + 2 * room <= min(limit, getattr(self.proposer, "max_context", limit))  # a draft's
                       and (self.proposer is None or self.proposer.queues_ahead))
        for index, prompt in enumerate(prompts):
            if prompt.numel() == 0:
                raise ValueError(f"prompt {index} is empty: at least one prompt token is needed to start decoding")
            needed = prompt.numel() + self.config.max_new_tokens + room
            if needed > limit:
                raise ValueError(
                    f"context length exceeded: prompt {index} ({prompt.numel()} tokens) + max_new_tokens "
                    f"({self.config.max_new_tokens}) + draft tokens per step ({room}) = {needed} > the "
                    f"target's max context {limit}; shorten the prompt or lower max_new_tokens"
                )
        longest += room * (1 + self._ahead)
        self.target.reserve(longest, room)
        self.target.prepare_prefills([p.numel() for p in prompts])  # lone admissions replay these graphs
        kinds = ("plain",) if self.proposer is None else ("plain", "chain", "tree")  # a plain run verifies no draft
        self.target.prepare_steps(min(p.numel() for p in prompts), kinds)  # every step graph, at every attention span
        self._history = History(self.target.batch_size, longest + 1, self.target.device)
        if self.proposer is not None:
            self.proposer.reserve(longest)

    def generate(self, prompt_ids, seed: int | None = None) -> GenerationResult:
        """One request alone: ``generate_all([prompt_ids])``'s result, with the peak memory of its run on CUDA."""
        device = self.target.device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        result = self.generate_all([prompt_ids], None if seed is None else [seed])[0]
        if device.type == "cuda":
            result.timing.peak_memory_bytes = torch.cuda.max_memory_allocated(device)
        return result

    @torch.inference_mode()
    def generate_all(self, prompts: list, seeds: list[int] | None = None) -> list[GenerationResult]:
        """Decode every prompt; results in prompt order. Request i samples with ``seeds[i]`` (default: the config's
        seed), as ``Decoder.generate(prompt, seed)`` would alone."""
        prompts = [torch.as_tensor(p, dtype=torch.long).flatten() for p in prompts]
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"seeds must give one seed per prompt ({len(prompts)}), got {len(seeds)}")
        self.prepare(prompts)
        self.stats, self._queued = RunStats(), None
        self._eos = () if self.config.ignore_eos else self.config.eos_token_ids  # the tokens that end a request
        queue = deque(range(len(prompts)))
        slots: list[_Slot | None] = [None] * self.target.batch_size
        used = [False] * self.target.batch_size
        results: list[GenerationResult | None] = [None] * len(prompts)
        run_start = time.perf_counter()
        while True:
            self._refill(slots, used, queue, prompts, seeds, results, run_start)
            active = [b for b, s in enumerate(slots) if s is not None]
            if not active:
                break
            started = time.perf_counter()
            self._step(slots, active)  # ends with a step's readback (queued ahead: the step queued before it)
            self.stats.step_s += time.perf_counter() - started
            for b in active:
                self._retire(slots, b, results, run_start)
        self._queued = None  # a step queued after every request ended: its tokens are nobody's
        return results

    def _refill(self, slots, used, queue, prompts, seeds, results, run_start) -> None:
        """Admit queued prompts into the free slots, all together; a request done at its first token frees its slot,
        which the next admission round refills."""
        while queue:
            free = [b for b, s in enumerate(slots) if s is None][: len(queue)]
            if not free:
                return
            indices = [queue.popleft() for _ in free]
            for b in free:
                self.stats.num_admissions += 1
                self.stats.num_refills += used[b]
                used[b] = True
            seeds_of = [self.config.seed if seeds is None else seeds[i] for i in indices]
            admitted = self._admit(free, indices, [prompts[i] for i in indices], seeds_of)
            for b, state in zip(free, admitted):
                slots[b] = state
                self._retire(slots, b, results, run_start)

    def _retire(self, slots, b: int, results, run_start: float) -> None:
        """Slot ``b``'s request, if it ended: its result recorded, the slot freed."""
        if slots[b].finished:
            results[slots[b].request] = self._finish(slots[b], b, run_start)
            slots[b] = None
            self.target.release(b)

    def _admit(self, free: list[int], indices: list[int], prompts: list[torch.Tensor], seeds: list[int]) -> list[_Slot]:
        """Prefill ``prompts`` into slots ``free`` in one group and take each one's first token: each
        request's TTFT is the group's (docs/batching.md#admission)."""
        device, started = self.target.device, time.perf_counter()
        _synchronize(device)  # a step of this run queued ahead runs out first: its time is the steps'
        admitted_at = time.perf_counter()
        self.stats.step_s += admitted_at - started if self._queued is not None else 0.0
        on_device = [p.to(device) for p in prompts]
        prefills = self.target.prefill_many(free, on_device)
        generators = [torch.Generator(device=device).manual_seed(seed) for seed in seeds]
        if verifies_greedily(self.config.sampling):  # every first token in one read
            firsts = torch.cat([out.logits for out in prefills]).argmax(dim=-1).tolist()  # (n,)
        else:
            firsts = [verify(_EMPTY_DRAFT, out.logits, self.config.sampling, g).next_token
                      for out, g in zip(prefills, generators)]
        _synchronize(device)
        first_token_s = time.perf_counter() - admitted_at
        self.stats.admission_s += first_token_s
        states = []
        for slot, index, prompt, first, out, generator in zip(free, indices, on_device, firsts, prefills, generators):
            features = None
            if self.proposer is not None and self.proposer.needs_hidden_states:
                features = out.aux_hidden_states if out.aux_hidden_states is not None else out.hidden_states
            self._history.admit(slot, prompt, first, out.hidden_states[-1], features)
            state = _Slot(index, prompt.numel() + 1, [first], generator, admitted_at, first_token_s)
            state.finished = self._ended(state)
            if self.proposer is not None and not state.finished:
                self.proposer.begin_request(slot, prompt)
            states.append(state)
        return states

    def _ended(self, state: _Slot) -> bool:
        return state.emitted[-1] in self._eos or len(state.emitted) >= self.config.max_new_tokens

    def _step(self, slots: list[_Slot | None], active: list[int]) -> None:
        """Propose for every active slot, verify all slots in one forward, verify all slots at once (greedy) and commit
        on the device; the host reads the step's outcome once, then does its per-request bookkeeping. Queued ahead,
        each root is the last token in the device history, the commit advances the host's lengths by upper bounds, and
        the host reads the step queued before this one while this one runs (docs/engines.md#steps-queued-ahead)."""
        ahead, history, device = self._ahead, self._history, self.target.device
        drafts = self._propose(slots, active)
        roots = history.tokens.gather(1, (history.lengths - 1).clamp_min(0)[:, None]) if ahead else None  # (B, 1)
        inputs: list[SlotInput | None] = [None] * len(slots)
        for b in active:
            inputs[b] = slot_input(roots[b] if ahead else slots[b].emitted[-1], drafts[b], device, self._host_depths)
        out = self.target.verify(inputs)  # logits (B, W, V), hidden (B, W, H)
        # no row clamps a write; queued ahead, the host's lengths lag the device's by up to a step
        history.ensure(max(slots[b].length for b in active) + (1 + ahead) * out.logits.shape[1])
        if verifies_greedily(self.config.sampling):
            step = self.target.verified_step()  # ids (B, W), ancestors (B, W, W), counts (B,) on the device
            verdict = verify_batch(step.ids, out.logits, step.ancestors, step.counts, chain=step.chain)
            unknown = any(drafts[b].precomputed_depth is None for b in active)  # trees drafted anew (EAGLE-2)
            # (B,) each slot's deepest node (padding: 0), which _read hands to the drafts whose depth is device-only
            readback = read_step(verdict, step.depths.amax(dim=1) if unknown else None)  # the step's one transfer
            emitted, depths = readback.tokens, readback.depths
        else:
            verdict, tokens = self._verify_sampled(slots, active, drafts, inputs, out)
            emitted, depths = (lambda: tokens), None  # host verification reads them (and the drafts' depths)
        history.record(verdict, out)
        # trees' paths may need moving: P >= the longest path, from host-known depths or bounds (EAGLE-2's)
        moved = [1 + (d.depth() if d.precomputed_depth is not None or depths is None else d.depth_bound or len(d))
                 for d in (drafts[b] for b in active) if not d.is_chain]
        source = verdict.nodes[:, : max(moved)] if moved else None  # (B, P)
        bounds = [0 if x is None else len(x) for x in inputs] if ahead else None  # (B,) the most nodes a slot keeps
        self.target.commit_accepted(verdict.kept, source, (lambda: bounds) if ahead else
                                    (lambda: [len(t) for t in emitted()]))
        step = (list(slots), drafts, emitted, bounds, depths)
        if ahead:
            step, self._queued = self._queued, step
        if step is not None:
            self._read(*step)

    def _read(self, states: list[_Slot | None], drafts: dict[int, Draft], emitted, bounds: list[int] | None,
              depths) -> None:
        """Record a step's tokens for its requests but those that ended before it (queued ahead of their end: dropped,
        counting no step and no token); settle host lengths its commit advanced by ``bounds`` to the nodes kept;
        drafts whose depth only the device knew take it from ``depths()``, the step's readback."""
        tokens = emitted()  # waits for that step only
        live = [b for b, state in enumerate(states) if state is not None and not state.finished]
        if live:
            self.stats.num_steps += 1
            self.stats.active_per_step.append(len(live))
        if bounds is not None:
            self.target.settle({b: bounds[b] - len(tokens[b]) for b in live})
        for b in live:
            if depths is not None and drafts[b].precomputed_depth is None:
                drafts[b].precomputed_depth = depths()[b]  # what Draft.depth() would read, slot by slot
            self.stats.step_tokens += self._record(states[b], drafts[b], tokens[b])
            if bounds is not None and states[b].finished:  # its last token is on the host: its end, not the next step's
                states[b].ended_at = time.perf_counter()

    def _host_depths(self, depths: torch.Tensor) -> list[int]:
        """A tree's depths ``(N + 1,)`` as a host list, read once per depths tensor: a static tree (Medusa, EAGLE-1)
        hands every slot the same tensor at every step, so its depths cost no read and no copy after the first."""
        if self._depth_list is None or self._depth_list[0] is not depths:
            self._depth_list = (depths, depths.tolist())
        return self._depth_list[1]

    def _verify_sampled(self, slots, active, drafts, inputs, out) -> tuple[BatchVerdict, list[list[int]]]:
        """Sampling: each slot verified on its own with its own generator (rejection sampling of chains on the
        device, trees on the host); the verdict goes back in one copy."""
        step_ids = self.target.verified_step().ids  # (B, W)
        paths, emitted = [None] * len(slots), [[] for _ in slots]  # per slot: accepted nodes, emitted tokens
        for b in active:
            n = len(inputs[b])
            paths[b], emitted[b] = verify_sampled(drafts[b], step_ids[b, :n], out.logits[b, :n], self.config.sampling,
                                               slots[b].generator)
        return BatchVerdict.from_host(paths, emitted, out.logits.shape[1], self.target.device), emitted

    def _propose(self, slots: list[_Slot | None], active: list[int]) -> dict[int, Draft]:
        if self.proposer is None:
            return {b: _EMPTY_DRAFT for b in active}
        history, states = self._history, {}
        if self._ahead:  # the host's lengths lag the step in flight: the proposer drafts from the device history,
            # each bounded by the target's host mirror (cache + root), which counts the step in flight's nodes in full
            drafts = self.proposer.propose_queued(history, {b: self.target.cache_length(b) + 1 for b in active})
        else:
            for b in active:
                length = slots[b].length
                features = None if history.features is None else history.features[b, : length - 1]  # (T - 1, F)
                states[b] = ProposerState(history.tokens[b, :length], history.hidden[b], features)
            drafts = self.proposer.propose(states)
        return {b: d if d is not None and len(d) else _EMPTY_DRAFT for b, d in drafts.items()}

    def _record(self, state: _Slot, draft: Draft, new: list[int]) -> int:
        """The host's bookkeeping of one slot's step: counters, length, emitted tokens and its end. Returns the
        output tokens it kept (none past EOS or max_new_tokens)."""
        state.counters.record_step(draft.depth(), len(new) - 1)
        state.length += len(new)
        before = min(len(state.emitted), self.config.max_new_tokens)
        for token in new:
            state.emitted.append(token)
            if token in self._eos:
                break
        state.finished = self._ended(state)
        return min(len(state.emitted), self.config.max_new_tokens) - before

    def _finish(self, state: _Slot, slot: int, run_start: float) -> GenerationResult:
        if state.ended_at is None:
            _synchronize(self.target.device)
        total = (state.ended_at or time.perf_counter()) - state.admitted_at
        emitted = state.emitted[: self.config.max_new_tokens]
        timing = RequestTiming(num_output_tokens=len(emitted), time_to_first_token_s=state.first_token_s, total_s=total)
        return GenerationResult(
            output_token_ids=emitted, counters=state.counters, timing=timing,
            finish_reason="eos" if emitted[-1] in self._eos else "length", slot=slot, queue_s=state.admitted_at - run_start,
        )


def verify_sampled(draft: Draft, verify_ids: torch.Tensor, logits: torch.Tensor, sampling,
                   generator: torch.Generator | None) -> tuple[list[int], list[int]]:
    """(accepted nodes, emitted tokens) of one slot's sampled verify of ``(N + 1, V)`` logits: chain rejection
    sampling on the device (one device-to-host transfer), anything else through ``verify`` on the host."""
    if draft.is_chain and sampling.rule == "rejection":
        accepted, _, new = rejection_chain_on_device(draft, verify_ids, logits, sampling, generator)
        return accepted, new
    verdict = verify(draft, logits, sampling, generator)
    return verdict.accepted_nodes, verify_ids[verdict.accepted_nodes[1:]].tolist() + [verdict.next_token]
