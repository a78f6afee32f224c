"""The decode loop, batch size 1: plain and speculative decoding through one code path.

Plain decoding is the same loop with an empty draft, so both share the cache, the forward and
the timing, and a speedup compares like with like (docs/metrics.md). Each step verifies
``[root] + draft`` in one target forward, commits the accepted path and emits the accepted
tokens plus the target's own next token. Draft length is never shortened to fit
``max_new_tokens``; the output is truncated instead, and counters count what was verified.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from specbench.engine.transfers import host_to_device
from specbench.engine.draft import Draft
from specbench.engine.sampling import SamplingParams
from specbench.engine.target import Target
from specbench.engine.device_verification import greedy_on_device, rejection_chain_on_device
from specbench.engine.verification import verifies_greedily, verify
from specbench.metrics import RequestTiming, SpecCounters
from specbench.engine.proposer import Proposer, ProposerState


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
    output_token_ids: list[int]
    counters: SpecCounters
    timing: RequestTiming
    finish_reason: str  # "length" or "eos"


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Decoder:
    """Generate with ``target``, drafting with ``proposer`` (None = plain autoregressive decoding)."""

    def __init__(self, target: Target, proposer: Proposer | None, config: GenerationConfig):
        self.target = target
        self.proposer = proposer
        self.config = config

    def _check_lengths(self, prompt_len: int) -> None:
        limit = self.target.max_context
        if prompt_len == 0:
            raise ValueError("prompt is empty: at least one prompt token is needed to start decoding")
        draft_room = self.proposer.max_draft_tokens if self.proposer else 0
        needed = prompt_len + self.config.max_new_tokens + draft_room
        if needed > limit:
            raise ValueError(
                f"context length exceeded: prompt ({prompt_len} tokens) + max_new_tokens "
                f"({self.config.max_new_tokens}) + draft tokens per step ({draft_room}) = {needed} > the "
                f"target's max context {limit}; shorten the prompt or lower max_new_tokens"
            )

    @torch.inference_mode()
    def generate(self, prompt_ids: torch.Tensor | list[int], seed: int | None = None) -> GenerationResult:
        prompt = torch.as_tensor(prompt_ids, dtype=torch.long).flatten()  # (T,)
        self._check_lengths(prompt.numel())
        draft_room = self.proposer.max_draft_tokens if self.proposer else 0
        self.target.reserve(prompt.numel() + self.config.max_new_tokens + draft_room, draft_room)
        self.target.prepare_prefills([prompt.numel()])  # a prefill graph's capture, if any, before the clock starts
        self.target.prepare_steps()  # and the step graphs' (a kind the warm-up never stepped)
        if self.proposer is not None:
            self.proposer.reserve(prompt.numel() + self.config.max_new_tokens + draft_room)
        device = self.target.device
        sampling = self.config.sampling
        generator = torch.Generator(device=device)
        generator.manual_seed(self.config.seed if seed is None else seed)
        eos = set() if self.config.ignore_eos else set(self.config.eos_token_ids)
        counters = SpecCounters()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

        _synchronize(device)
        start = time.perf_counter()
        prefill = self.target.prefill(prompt)
        first = verify(_EMPTY_DRAFT, prefill.logits, sampling, generator)  # the first token, sampled as any
        _synchronize(device)
        time_to_first_token = time.perf_counter() - start

        # prompt + output + the tokens a step can emit beyond max_new_tokens, preallocated on the device;
        # tokens[:length] is the history, and positions below length are never written again
        tokens = torch.zeros(prompt.numel() + self.config.max_new_tokens + draft_room + 1, dtype=torch.long, device=device)
        tokens[: prompt.numel()] = prompt.to(device)
        tokens[prompt.numel()] = first.next_token
        length = prompt.numel() + 1
        emitted = [first.next_token]
        hidden = prefill.hidden_states[-1]  # (H,)
        features = None
        if self.proposer is not None and self.proposer.needs_hidden_states:
            # row i: the hidden state that predicted tokens[i + 1]; rows [0, length - 1) are filled
            # the aux layers' streams when the proposer asked the target for them (EAGLE-3), else the final ones
            source = prefill.aux_hidden_states if prefill.aux_hidden_states is not None else prefill.hidden_states
            features = source.new_zeros(tokens.numel(), source.shape[-1])  # (capacity, F)
            features[: prompt.numel()] = source
        finish_reason = "eos" if first.next_token in eos else "running"
        if self.proposer is not None:
            self.proposer.begin_request(prompt.to(device))
        while finish_reason == "running" and len(emitted) < self.config.max_new_tokens:
            draft = None
            if self.proposer is not None:
                draft = self.proposer.propose(ProposerState(
                    token_ids=tokens[:length], hidden_state=hidden,
                    hidden_states=None if features is None else features[: length - 1]))
            draft = draft if draft is not None and len(draft) else _EMPTY_DRAFT
            verify_ids = _verify_input(emitted[-1], tokens[length - 1 : length], draft.tokens, device)  # (N + 1,)
            tree_mask = None if draft.is_chain else draft.tree_mask()  # (N + 1, N + 1)
            out = self.target.verify(verify_ids, draft.depths(), tree_mask)
            accepted_nodes, new = verify_step(draft, verify_ids, out.logits, sampling, generator)
            self.target.commit(accepted_nodes, num_verified=verify_ids.numel())
            counters.record_step(draft.depth(), len(accepted_nodes) - 1)
            hidden = out.hidden_states[accepted_nodes[-1]]  # (H,) predicted the last emitted token
            end = length + len(new)
            if end > tokens.numel():  # a proposer drafting beyond its max_draft_tokens
                tokens = torch.cat([tokens, tokens.new_zeros(end - tokens.numel())])
                if features is not None:
                    features = torch.cat([features, features.new_zeros(end - features.shape[0], features.shape[1])])
            # host-known indices and tokens go up without a stream sync (a pinned, asynchronous copy on CUDA)
            if features is not None:  # the accepted path's hidden states predicted the tokens emitted now
                step = out.aux_hidden_states if out.aux_hidden_states is not None else out.hidden_states
                kept = len(accepted_nodes)
                contiguous = accepted_nodes[-1] == kept - 1  # a chain's path (ascending from 0): a slice
                rows = slice(0, kept) if contiguous else host_to_device(accepted_nodes, step.device)
                features[length - 1: end - 1] = step[rows]
            tokens[length:end] = host_to_device(new, device)
            length = end
            for token in new:
                emitted.append(token)
                if token in eos:
                    finish_reason = "eos"
                    break
        _synchronize(device)
        total = time.perf_counter() - start

        emitted = emitted[: self.config.max_new_tokens]
        finish_reason = "eos" if emitted[-1] in eos else "length"
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        timing = RequestTiming(
            num_output_tokens=len(emitted),
            time_to_first_token_s=time_to_first_token,
            total_s=total,
            peak_memory_bytes=peak,
        )
        return GenerationResult(output_token_ids=emitted, counters=counters, timing=timing, finish_reason=finish_reason)


_EMPTY_DRAFT = Draft.chain(torch.empty(0, dtype=torch.long))


def _verify_input(root: int, root_on_device: torch.Tensor, draft_tokens: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``[root, *draft_tokens]`` ``(N + 1,)`` on ``device``: a host-held draft (n-gram, scripted) goes up with the
    root, known on the host, in one asynchronous copy; a device-held one is joined to ``root_on_device`` ``(1,)``."""
    if draft_tokens.device.type == "cpu" and device.type != "cpu":  # reading a CPU tensor syncs nothing
        return host_to_device([root] + draft_tokens.tolist(), device)
    return torch.cat([root_on_device, draft_tokens.to(device)])


def verify_step(draft: Draft, verify_ids: torch.Tensor, logits: torch.Tensor, sampling,
                generator: torch.Generator | None) -> tuple[list[int], list[int]]:
    """(accepted nodes, emitted tokens) of one verify's ``(N + 1, V)`` logits: greedy and chain rejection
    sampling on the device (one device-to-host transfer), trees under sampling through ``verify`` on the host."""
    if verifies_greedily(sampling):
        accepted, _, new = greedy_on_device(draft, verify_ids, logits)
    elif draft.is_chain and sampling.rule == "rejection":
        accepted, _, new = rejection_chain_on_device(draft, verify_ids, logits, sampling, generator)
    else:
        verdict = verify(draft, logits, sampling, generator)
        accepted = verdict.accepted_nodes
        new = verify_ids[accepted[1:]].tolist() + [verdict.next_token]
    return accepted, new
