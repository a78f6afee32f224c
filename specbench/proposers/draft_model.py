"""Draft-model proposer: a small causal LM with the target's vocabulary drafts K tokens autoregressively per slot.

The draft model is a :class:`~specbench.engine.target.Target` of the target's B slots on the target's engine
(``HFTarget``, one slot, beside an eager target; ``StaticTarget`` beside a static one, its steps graph-captured too)
with its own KV cache. A ``propose`` call runs K batched draft forwards whatever B: one ragged catch-up step, then
K - 1 single-token steps. In the catch-up a slot keeps the K - 1 tokens it fed last time as far as the target
accepted them, ``min(fed, len(history) - anchor - 1)`` (the history beyond the anchor is the accepted draft tokens
and one token of the target's own: host-known, nothing read back), truncates the rest and feeds the new tokens (at
least the root); a new request is prefilled into its slot alone. Greedy drafts are argmaxes on the device; with a
draft ``temperature`` > 0 each slot samples with its own generator (seeded with ``seed`` per request) and keeps its
``(K, V)`` draft probabilities, so rejection sampling stays lossless for any draft (docs/verification.md).
"""

from __future__ import annotations

import torch

from specbench.compile_watch import capture_seconds
from specbench.engine.draft import Draft
from specbench.engine.proposer import ProposerState, SlotProposer
from specbench.engine.step_inputs import SlotInput
from specbench.engine.transfers import host_to_device
from specbench.proposers.registry import register_proposer


@register_proposer
class DraftModelProposer(SlotProposer):
    name = "draft"

    def __init__(self, draft, *, num_speculative_tokens: int, temperature: float = 0.0, seed: int = 0, source: str = ""):
        """``draft``: a Target of B slots over the draft model (prefill / verify / commit / truncate / release)."""
        if not isinstance(num_speculative_tokens, int) or num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens (K) must be an integer >= 1, got {num_speculative_tokens!r}")
        if temperature < 0:
            raise ValueError(f"the draft temperature must be >= 0 (0 = greedy drafts), got {temperature!r}")
        self.draft, self.k, self.temperature, self.seed, self.source = draft, num_speculative_tokens, float(temperature), seed, source
        batch = draft.batch_size
        self.generators = [torch.Generator(device=draft.device) for _ in range(batch)]  # each slot's draft sampling
        # per slot: history positions below it are in the draft cache and final; beyond it the cache holds the K - 1
        # draft tokens the last propose fed (maybe rejected)
        self._anchor = [0] * batch
        self._rows = torch.arange(batch, device=draft.device)  # (B,)
        self._template = Draft.chain(torch.zeros(num_speculative_tokens, dtype=torch.long, device=draft.device))

    @classmethod
    def from_options(cls, target, *, path: str | None = None, draft=None, num_speculative_tokens: int = 3,
                     temperature: float = 0.0, seed: int = 0) -> "DraftModelProposer":
        """The draft model from ``path`` (a checkpoint reference) on the target's engine, device, dtype and batch size,
        or a ready ``draft`` Target of the target's slots; its vocabulary must be the target's."""
        if (path is None) == (draft is None):
            raise ValueError(f"the draft-model proposer needs exactly one of path (a checkpoint) or draft (a Target); "
                             f"got path={path!r}, draft={type(draft).__name__ if draft is not None else None}")
        if path is not None:
            draft = _load_draft(path, target)
        if draft.vocab_size != target.vocab_size:
            raise ValueError(f"draft model {path or type(draft).__name__} has a vocabulary of {draft.vocab_size} tokens "
                             f"but the target's has {target.vocab_size}: a draft model must share the target's "
                             "tokenizer; pick a draft of the same model family")
        if draft.batch_size != target.batch_size:
            raise ValueError(f"the draft target has {draft.batch_size} slots but the target has {target.batch_size}: "
                             "pass a draft of the target's batch size (StaticTarget.with_batch_size)")
        return cls(draft, num_speculative_tokens=num_speculative_tokens, temperature=temperature, seed=seed,
                   source=str(path or type(draft).__name__))

    def with_batch_size(self, batch_size: int) -> "DraftModelProposer":
        """This proposer for a target of ``batch_size`` slots (itself at its own): a draft target over the same weights
        with its own cache, its prefills eager (they run inside timed steps, at lengths known only then)."""
        if batch_size == self.draft.batch_size:
            return self
        if not hasattr(self.draft, "with_batch_size"):
            raise ValueError(f"draft model {self.source} runs on the eager engine ({type(self.draft).__name__}, one "
                             f"slot), so it cannot draft for {batch_size} slots; set engine = \"static\" in the case")
        draft = self.draft.with_batch_size(batch_size, prefill_graphs=False)
        return type(self)(draft, num_speculative_tokens=self.k, temperature=self.temperature, seed=self.seed,
                          source=self.source)

    @property
    def max_draft_tokens(self) -> int:
        return self.k

    @property
    def capture_seconds(self) -> float:
        """The draft target's graph capture so far (a run checks that none happened while timed)."""
        return capture_seconds(self.draft)

    def describe(self) -> dict:
        out = {"name": self.name, "draft": self.source, "num_speculative_tokens": self.k,
               "temperature": self.temperature, "engine": type(self.draft).__name__}
        return out if self.draft.batch_size == 1 else {**out, "batching": "batched draft model"}

    def reserve(self, num_tokens: int) -> None:
        # the draft cache holds the history plus the K - 1 drafted tokens it feeds; catch-up steps feed up to 2
        self.draft.reserve(num_tokens, 1)
        for slot in range(self.draft.batch_size):  # between runs (a new cache or not): every slot starts over
            self._reset(slot)
        self.draft.prepare_steps(kinds=("plain", "chain"))  # its step graphs at every span, before the clock

    def begin_request(self, slot: int, prompt_ids: torch.Tensor) -> None:
        self._reset(slot)
        self.generators[slot].manual_seed(self.seed)

    def _reset(self, slot: int) -> None:
        if self._anchor[slot]:  # the slot holds draft cache entries: free them (its idle padding stays inside)
            self.draft.release(slot)
        self._anchor[slot] = 0

    @torch.inference_mode()
    def propose(self, states: dict[int, ProposerState]) -> dict[int, Draft | None]:
        if not states:
            return {}
        draft, batch = self.draft, self.draft.batch_size
        for slot in set(range(batch)) - set(states):  # a slot no longer decoding frees its rows
            self._reset(slot)
        picks = [self._pick(self._catch_up(states), states)]  # per draft position: (B,) tokens, (B, V) probs or None
        live = [int(b in states) for b in range(batch)]
        kept = host_to_device(live, draft.device) if self.k > 1 else None  # (B,) one node per active slot, 0 idle
        for _ in range(self.k - 1):  # the last draft token is never fed: the target verifies it
            token = picks[-1][0]  # (B,)
            logits = draft.verify([SlotInput([], [0], tail=token[b : b + 1]) if live[b] else None
                                   for b in range(batch)]).logits  # (B, 1, V)
            draft.commit_accepted(kept, None, lambda: live)
            picks.append(self._pick(logits[:, 0], states))
        tokens = torch.stack([token for token, _ in picks], dim=1)  # (B, K)
        drafts = {}
        for slot in states:
            drafts[slot] = self._template.with_tokens(tokens[slot])
            if self.temperature > 0:
                drafts[slot].draft_probs = torch.stack([probs[slot] for _, probs in picks])  # (K, V)
        return drafts

    def _pick(self, logits: torch.Tensor, states) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B,) each slot's draft token from its logits row ``(B, V)``, and (B, V) the distributions they were drawn
        from (None for greedy point masses); each active slot samples with its own generator."""
        if self.temperature == 0:
            return logits.argmax(dim=-1), None
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)  # (B, V)
        token = torch.zeros(probs.shape[0], dtype=torch.long, device=probs.device)  # (B,) idle rows: 0
        for slot in states:
            token[slot : slot + 1] = torch.multinomial(probs[slot], 1, generator=self.generators[slot])  # (1,)
        return token, probs

    def _catch_up(self, states: dict[int, ProposerState]) -> torch.Tensor:
        """Bring every active slot's draft cache to its history; returns ``(B, V)`` the logits after each history's
        last token (rows of idle slots: anything). New requests are prefilled together (``prefill_many``); the rest
        truncate what the target rejected and feed their new tokens in one ragged batched step."""
        draft, batch = self.draft, self.draft.batch_size
        inputs: list[SlotInput | None] = [None] * batch
        truncate, fresh = {}, {}
        for slot, state in states.items():
            length, anchor, fed = state.token_ids.numel(), self._anchor[slot], self.k - 1  # host-known
            if anchor == 0 or anchor > length:  # a new request (or a shorter history): start over
                fresh[slot] = state.token_ids
            else:
                keep = anchor + min(fed, length - 1 - anchor)  # at most length - 1: re-feed the last
                if keep != anchor + fed:  # the cache holds anchor + fed entries
                    truncate[slot] = keep
                new = state.token_ids[keep:]  # (n,) n >= 1, device-held
                inputs[slot] = SlotInput([], list(range(new.numel())), tail=new)
            self._anchor[slot] = length
        outputs = draft.prefill_many(list(fresh), list(fresh.values())) if fresh else []
        prefilled = {slot: out.logits[-1] for slot, out in zip(fresh, outputs)}  # (V,) each
        if all(x is None for x in inputs):  # every active slot was prefilled
            logits = torch.zeros(batch, draft.vocab_size, device=draft.device)  # (B, V)
        else:
            if truncate:
                draft.truncate(truncate)
            counts = [0 if x is None else len(x) for x in inputs]
            out = draft.verify(inputs).logits  # (B, W, V) row b's first counts[b] are real
            last = host_to_device([max(n - 1, 0) for n in counts], draft.device)  # (B,)
            draft.commit_accepted(host_to_device(counts, draft.device), None, lambda: counts)
            logits = out[self._rows, last]  # (B, V)
        for slot, row in prefilled.items():
            logits[slot] = row
        return logits


def _load_draft(path: str, target):
    """The draft checkpoint as a Target of the target's slots on its engine (static beside static), device and dtype."""
    from specbench.engine.static_target import StaticTarget

    if isinstance(target, StaticTarget):
        # its prefill runs inside the first timed propose of each request: kept eager, so no capture lands there
        return StaticTarget.from_pretrained(path, dtype=target.dtype, device=target.device, prefill_graphs=False,
                                            batch_size=target.batch_size)
    from specbench.checkpoints.resolve import load_target_model
    from specbench.engine.hf_target import HFTarget

    return HFTarget(load_target_model(path, dtype=target.dtype, device=target.device))
