"""Draft-model proposer: a small causal LM with the target's vocabulary drafts K tokens autoregressively per slot.

The draft model is a :class:`~specbench.engine.target.Target` of the target's B slots on the target's engine
(``HFTarget``, one slot, beside an eager target; ``StaticTarget`` beside a static one, its steps graph-captured too)
with its own KV cache. A ``propose`` call runs K batched draft forwards whatever B: one ragged catch-up step, then
K - 1 single-token steps. In the catch-up a slot keeps the K - 1 tokens it fed last time as far as the target
accepted them, ``min(fed, len(history) - anchor - 1)`` (the history beyond the anchor is the accepted draft tokens
and one token of the target's own: host-known, nothing read back), truncates the rest and feeds the new tokens (at
least the root); a new request is prefilled into its slot alone. Queued ahead of the host's reads, the same catch-up
is formed on the device (``propose_queued``). Greedy drafts are argmaxes on the device; with a
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
        self._anchors = torch.zeros(batch, dtype=torch.long, device=draft.device)  # (B,) the same, queued ahead
        self._rows, self._pair = torch.arange(batch, device=draft.device), torch.arange(2, device=draft.device)
        self._template = Draft.chain(torch.zeros(num_speculative_tokens, dtype=torch.long, device=draft.device))
        # greedy drafts queue ahead on a draft target taking device lengths, which holds two steps' drafts then too
        self.queues_ahead, self.max_context = self.temperature == 0 and hasattr(draft, "truncate_to"), draft.max_context

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
        return self._draft(self._catch_up(states), list(states)) if states else {}

    @torch.inference_mode()
    def propose_queued(self, history, lengths: dict[int, int]) -> dict[int, Draft | None]:
        """``propose`` for a step queued ahead of the host's reads (docs/engines.md#steps-queued-ahead): the catch-up
        of :meth:`_catch_up` formed on the device from the history, each slot's new tokens padded to 2 (the most a
        catch-up feeds), the draft's host lengths set from ``lengths``, upper bounds of the history's."""
        draft, batch = self.draft, self.draft.batch_size
        admitted = {b: history.tokens[b, :n] for b, n in lengths.items() if not self._anchor[b]}  # exact: just admitted
        fresh, known = self._begin(lengths, admitted)
        caught = [b in lengths and b not in fresh for b in range(batch)]  # the slots this catch-up feeds
        live = host_to_device(caught, draft.device).bool()  # (B,)
        ends = history.lengths  # (B,)
        keep = torch.minimum(self._anchors + (self.k - 1), ends - 1)  # (B,) as _catch_up's, per slot
        draft.truncate_to(torch.where(live, keep, draft.cache_capacity), {b: n - 1 for b, n in lengths.items()
                                                                          if b not in fresh})
        columns = (keep[:, None] + self._pair).clamp(0, history.tokens.shape[1] - 1)  # (B, 2)
        new = history.tokens.gather(1, columns)  # (B, 2) a second node past a slot's count is padding
        counts = torch.where(live, ends - keep, 0)  # (B,) 1 or 2 per catching-up slot
        self._anchors = torch.where(live, ends, self._anchors)
        inputs = [SlotInput([], [0, 1], tail=new[b]) if caught[b] else None for b in range(batch)]
        return self._draft(self._feed(draft, inputs, counts, known), list(lengths))

    def _draft(self, logits: torch.Tensor, slots: list[int]) -> dict[int, Draft]:
        """The K draft tokens of ``slots`` from the catch-up's logits ``(B, V)``: K - 1 single-token draft steps."""
        draft, batch = self.draft, self.draft.batch_size
        picks = [self._pick(logits, slots)]  # per draft position: (B,) tokens, (B, V) probs or None
        live = [int(b in slots) for b in range(batch)]
        kept = host_to_device(live, draft.device) if self.k > 1 else None  # (B,) one node per active slot, 0 idle
        for _ in range(self.k - 1):  # the last draft token is never fed: the target verifies it
            token = picks[-1][0]  # (B,)
            logits = draft.verify([SlotInput([], [0], tail=token[b : b + 1]) if live[b] else None
                                   for b in range(batch)]).logits  # (B, 1, V)
            draft.commit_accepted(kept, None, lambda: live)
            picks.append(self._pick(logits[:, 0], slots))
        tokens = torch.stack([token for token, _ in picks], dim=1)  # (B, K)
        drafts = {}
        for slot in slots:
            drafts[slot] = self._template.with_tokens(tokens[slot])
            if self.temperature > 0:
                drafts[slot].draft_probs = torch.stack([probs[slot] for _, probs in picks])  # (K, V)
        return drafts

    def _pick(self, logits: torch.Tensor, slots) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B,) each slot's draft token from its logits row ``(B, V)``, and (B, V) the distributions they were drawn
        from (None for greedy point masses); each active slot samples with its own generator."""
        if self.temperature == 0:
            return logits.argmax(dim=-1), None
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)  # (B, V)
        token = torch.zeros(probs.shape[0], dtype=torch.long, device=probs.device)  # (B,) idle rows: 0
        for slot in slots:
            token[slot : slot + 1] = torch.multinomial(probs[slot], 1, generator=self.generators[slot])  # (1,)
        return token, probs

    def _catch_up(self, states: dict[int, ProposerState]) -> torch.Tensor:
        """Bring every active slot's draft cache to its history; returns ``(B, V)`` the logits after each history's
        last token (rows of idle slots: anything). New requests are prefilled together (``prefill_many``); the rest
        truncate what the target rejected and feed their new tokens in one ragged batched step."""
        draft, batch = self.draft, self.draft.batch_size
        inputs: list[SlotInput | None] = [None] * batch
        truncate = {}
        fresh, known = self._begin(states, {b: state.token_ids for b, state in states.items()
                                            if self._anchor[b] == 0 or self._anchor[b] > state.token_ids.numel()})
        for slot, state in states.items():
            length, anchor, fed = state.token_ids.numel(), self._anchor[slot], self.k - 1  # host-known
            if slot not in fresh:
                keep = anchor + min(fed, length - 1 - anchor)  # at most length - 1: re-feed the last
                if keep != anchor + fed:  # the cache holds anchor + fed entries
                    truncate[slot] = keep
                new = state.token_ids[keep:]  # (n,) n >= 1, device-held
                inputs[slot] = SlotInput([], list(range(new.numel())), tail=new)
            self._anchor[slot] = length
        if truncate:
            draft.truncate(truncate)
        counts = [0 if x is None else len(x) for x in inputs]
        return self._feed(draft, inputs, host_to_device(counts, draft.device), known, counts)

    def _begin(self, active, fresh: dict[int, torch.Tensor]) -> tuple[dict, dict[int, torch.Tensor]]:
        """Free the rows of slots no longer decoding and prefill the ``fresh`` histories ``(T,)`` (new requests, or
        a shorter history) together: (fresh, each one's logits after its last token ``(V,)``)."""
        for slot in set(range(self.draft.batch_size)) - set(active):
            self._reset(slot)
        outputs = self.draft.prefill_many(list(fresh), list(fresh.values())) if fresh else []
        for slot, history in fresh.items():
            self._anchor[slot] = history.numel()
            self._anchors[slot] = history.numel()
        return fresh, {slot: out.logits[-1] for slot, out in zip(fresh, outputs)}

    def _feed(self, draft, inputs: list[SlotInput | None], counts: torch.Tensor, known: dict[int, torch.Tensor],
              host_counts: list[int] | None = None) -> torch.Tensor:
        """One ragged draft step feeding each slot's ``counts[b]`` ``(B,)`` new tokens (host-known as ``host_counts``;
        queued ahead, one per live input, which leaves the host lengths ``propose_queued`` set upper bounds): ``(B,
        V)`` the logits after each slot's last, ``known``'s rows (prefilled slots) as given, idle rows anything."""
        if all(x is None for x in inputs):  # every active slot was prefilled
            logits = torch.zeros(draft.batch_size, draft.vocab_size, device=draft.device)  # (B, V)
        else:
            bounds = host_counts or [0 if x is None else 1 for x in inputs]
            out = draft.verify(inputs).logits  # (B, W, V) row b's first counts[b] are real
            draft.commit_accepted(counts, None, lambda: bounds)
            logits = out[self._rows, (counts - 1).clamp_min(0)]  # (B, V)
        for slot, row in known.items():
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
