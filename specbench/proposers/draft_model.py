"""Draft-model proposer: a small causal LM with the target's vocabulary drafts K tokens autoregressively.

The draft model runs as a one-slot :class:`~specbench.engine.target.Target` of its own, on the engine the target
uses (``HFTarget`` beside an eager target, ``StaticTarget`` beside a static one, so its steps are
graph-captured too), with its own KV cache. Each ``propose`` first catches that cache up with the
history: the tokens it fed last time beyond the last committed position are kept as far as the
target accepted them, the rest is truncated, and the new tokens (at least the root) are fed in one
chain step; then K - 1 single-token steps follow. Greedy drafts are point masses; with a draft
``temperature`` > 0 the tokens are sampled and their probabilities kept, so rejection sampling stays
lossless for any draft distribution (docs/verification.md).
"""

from __future__ import annotations

import torch

from specbench.compile_watch import capture_seconds
from specbench.engine.draft import Draft
from specbench.engine.proposer import Proposer, ProposerState
from specbench.engine.step_inputs import SlotInput
from specbench.proposers.registry import register_proposer


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@register_proposer
class DraftModelProposer(Proposer):
    name = "draft"

    def __init__(self, draft, *, num_speculative_tokens: int, temperature: float = 0.0, seed: int = 0, source: str = ""):
        """``draft``: a Target over the draft model (prefill / verify / commit / truncate / reserve)."""
        if not isinstance(num_speculative_tokens, int) or num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens (K) must be an integer >= 1, got {num_speculative_tokens!r}")
        if temperature < 0:
            raise ValueError(f"the draft temperature must be >= 0 (0 = greedy drafts), got {temperature!r}")
        self.draft, self.k, self.temperature, self.seed, self.source = draft, num_speculative_tokens, float(temperature), seed, source
        self.generator = torch.Generator(device=draft.device)
        self._anchor = 0  # history positions below this are in the draft cache and final
        self._fed_beyond: list[int] = []  # draft tokens fed at positions anchor, anchor + 1, ... (maybe rejected)

    @classmethod
    def from_options(cls, target, *, path: str | None = None, draft=None, num_speculative_tokens: int = 3,
                     temperature: float = 0.0, seed: int = 0) -> "DraftModelProposer":
        """The draft model from ``path`` (a checkpoint reference) on the target's engine, device and dtype, or a
        ready ``draft`` Target; its vocabulary must be the target's."""
        if (path is None) == (draft is None):
            raise ValueError(f"the draft-model proposer needs exactly one of path (a checkpoint) or draft (a Target); "
                             f"got path={path!r}, draft={type(draft).__name__ if draft is not None else None}")
        if path is not None:
            draft = _load_draft(path, target)
        if draft.vocab_size != target.vocab_size:
            raise ValueError(
                f"draft model {path or type(draft).__name__} has a vocabulary of {draft.vocab_size} tokens but the "
                f"target's has {target.vocab_size}: a draft model must share the target's tokenizer; pick a draft "
                "of the same model family"
            )
        return cls(draft, num_speculative_tokens=num_speculative_tokens, temperature=temperature, seed=seed,
                   source=str(path or type(draft).__name__))

    @property
    def max_draft_tokens(self) -> int:
        return self.k

    @property
    def capture_seconds(self) -> float:
        """The draft target's graph capture so far (a run checks that none happened while timed)."""
        return capture_seconds(self.draft)

    def describe(self) -> dict:
        return {"name": self.name, "draft": self.source, "num_speculative_tokens": self.k,
                "temperature": self.temperature, "engine": type(self.draft).__name__}

    def reserve(self, num_tokens: int) -> None:
        # the draft cache holds the history plus the K - 1 drafted tokens it feeds; catch-up steps feed up to 2
        self.draft.reserve(num_tokens, 1)
        self.draft.prepare_steps()  # its step graphs before the clock: a short warm-up may never reach the chain step

    def begin_request(self, prompt_ids: torch.Tensor) -> None:
        self._anchor, self._fed_beyond = 0, []
        self.generator.manual_seed(self.seed)

    def _pick(self, logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        """(token, its draft distribution (V,) or None for a greedy point mass) from one row of logits (V,)."""
        if self.temperature == 0:
            return int(logits.argmax()), None
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)  # (V,)
        return int(torch.multinomial(probs, 1, generator=self.generator)), probs

    def _catch_up(self, tokens: torch.Tensor) -> torch.Tensor:
        """Bring the draft cache to the history ``tokens`` (L,); returns the logits (V,) after its last token."""
        length = tokens.numel()
        if self._anchor == 0 or self._anchor > length:  # a new request (or a shorter history): start over
            out = self.draft.prefill(0, tokens)
            self._anchor, self._fed_beyond = length, []
            return out.logits[-1]
        tail = tokens[self._anchor:].tolist()  # what the target emitted since the last propose (a few tokens)
        keep = min(self._anchor + _common_prefix(self._fed_beyond, tail), length - 1)  # always re-feed the last
        self.draft.truncate({0: keep})
        new = tokens[keep:]  # (n,) n >= 1
        out = self.draft.verify([SlotInput(new, list(range(new.numel())))])  # logits (1, n, V)
        self.draft.commit([list(range(new.numel()))])
        self._anchor, self._fed_beyond = length, []
        return out.logits[0, new.numel() - 1]

    @torch.inference_mode()
    def propose(self, state: ProposerState) -> Draft:
        logits = self._catch_up(state.token_ids.to(self.draft.device))
        tokens, probs = [], []
        for i in range(self.k):
            token, p = self._pick(logits)
            tokens.append(token)
            probs.append(p)
            if i + 1 < self.k:  # the last draft token is never fed: the target verifies it
                logits = self.draft.verify([SlotInput([token], [0])]).logits[0, 0]  # (V,)
                self.draft.commit([[0]])
                self._fed_beyond.append(token)
        draft_probs = None if self.temperature == 0 else torch.stack(probs)  # (K, V)
        return Draft.chain(torch.tensor(tokens, dtype=torch.long), draft_probs=draft_probs)


def _load_draft(path: str, target):
    """The draft checkpoint as a Target on the target's engine (static beside static), device and dtype."""
    from specbench.engine.static_target import StaticTarget

    if isinstance(target, StaticTarget):
        # its prefill runs inside the first timed propose of each request: kept eager, so no capture lands there
        return StaticTarget.from_pretrained(path, dtype=target.dtype, device=target.device, prefill_graphs=False)
    from specbench.checkpoints.resolve import load_target_model
    from specbench.engine.hf_target import HFTarget

    return HFTarget(load_target_model(path, dtype=target.dtype, device=target.device))
