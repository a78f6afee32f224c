"""N-gram / prompt-lookup proposer: match the context's last n tokens earlier in the context and
propose the K tokens that followed the most recent match (``match = "latest"``, the default) or the
earliest one (``match = "earliest"``, vLLM's rule), trying the longest n first (docs/conformance.md#n-gram).

The proposer keeps a host mirror of the request's history: ``begin_request`` copies the prompt to
the host once, and each ``propose`` copies only the tokens emitted since the previous call
(``state.token_ids[len(mirror):]``, a few tokens), never the whole device history. For every n it
also keeps, per n-gram, the most recent (or the first) start among the n-grams that end before the last token, so
a lookup costs O(1) and the index grows by the new tokens only. The draft is a device view of the
history, so drafting moves no tokens back to the device either.
"""

from __future__ import annotations

import torch

from specbench.engine.draft import Draft
from specbench.engine.proposer import Proposer, ProposerState
from specbench.proposers.registry import register_proposer

MATCH_RULES = ("latest", "earliest")  # which earlier occurrence of the matched n-gram a draft follows


@register_proposer
class NgramProposer(Proposer):
    name = "ngram"

    def __init__(self, num_speculative_tokens: int = 3, min_n: int = 1, max_n: int = 3, match: str = "latest"):
        if match not in MATCH_RULES:
            raise ValueError(f"n-gram match = {match!r}, expected one of {', '.join(map(repr, MATCH_RULES))} "
                             "(which earlier occurrence of the matched n-gram the draft follows)")
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens (K) must be >= 1, got {num_speculative_tokens}")
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.k = num_speculative_tokens
        self.min_n = min_n
        self.max_n = max_n
        self.match = match
        self._reset(None)  # no request begun: the first propose copies its whole context once

    def fresh(self) -> "NgramProposer":
        return NgramProposer(self.k, self.min_n, self.max_n, self.match)

    @classmethod
    def from_options(cls, target, num_speculative_tokens: int = 3, min_n: int = 1, max_n: int = 3,
                     match: str = "latest") -> "NgramProposer":
        return cls(num_speculative_tokens=num_speculative_tokens, min_n=min_n, max_n=max_n, match=match)

    @property
    def max_draft_tokens(self) -> int:
        return self.k

    def describe(self) -> dict:
        return {"name": self.name, "num_speculative_tokens": self.k, "min_n": self.min_n, "max_n": self.max_n,
                "match": self.match}

    def _reset(self, history: list[int] | None) -> None:
        self._history = history  # host mirror of the request's token history
        sizes = range(self.min_n, self.max_n + 1)
        # n-gram -> its latest start ("latest") or its first ("earliest")
        self._last_start: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in sizes}
        self._next_start = {n: 0 for n in sizes}  # first start not yet indexed, per n

    def begin_request(self, prompt_ids: torch.Tensor) -> None:
        """Start a request: the prompt is copied to the host once; the mirror and index are reset."""
        self._reset(torch.as_tensor(prompt_ids).flatten().tolist())

    def _sync(self, token_ids: torch.Tensor) -> list[int]:
        """Bring the mirror up to ``token_ids`` (the device history), copying only the new tokens."""
        history = self._history
        length = token_ids.numel()
        if history is None or length < len(history):  # no request begun, or a shorter (new) context
            self._reset(token_ids.tolist())
        elif length > len(history):
            history.extend(token_ids[len(history) :].tolist())  # (new,) the tokens emitted since the last call
        history = self._history
        earliest = self.match == "earliest"
        for n, last_start in self._last_start.items():
            # index the n-grams that end before the last token: starts up to length - 1 - n
            for start in range(self._next_start[n], length - n):
                if earliest:
                    last_start.setdefault(tuple(history[start : start + n]), start)
                else:
                    last_start[tuple(history[start : start + n])] = start
            self._next_start[n] = max(self._next_start[n], length - n)
        return history

    def propose(self, state: ProposerState) -> Draft | None:
        context = self._sync(state.token_ids)
        length = len(context)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            start = self._last_start[n].get(tuple(context[length - n :]))  # the latest (or first) earlier match
            if start is not None:
                begin = start + n
                end = min(begin + self.k, length)
                return Draft.chain(state.token_ids[begin:end].clone())  # (<= K,) on the history's device
        return None
