"""N-gram / prompt-lookup proposer: match the context's last n tokens earlier in the context and
propose the K tokens that followed the most recent match, trying the longest n first."""

from __future__ import annotations


from specbench.engine.draft import Draft
from specbench.engine.proposer import Proposer, ProposerState
from specbench.proposers.registry import register_proposer


@register_proposer
class NgramProposer(Proposer):
    name = "ngram"

    def __init__(self, num_speculative_tokens: int = 3, min_n: int = 1, max_n: int = 3):
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens (K) must be >= 1, got {num_speculative_tokens}")
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.k = num_speculative_tokens
        self.min_n = min_n
        self.max_n = max_n

    @classmethod
    def from_options(cls, target, num_speculative_tokens: int = 3, min_n: int = 1, max_n: int = 3) -> "NgramProposer":
        return cls(num_speculative_tokens=num_speculative_tokens, min_n=min_n, max_n=max_n)

    @property
    def max_draft_tokens(self) -> int:
        return self.k

    def describe(self) -> dict:
        return {"name": self.name, "num_speculative_tokens": self.k, "min_n": self.min_n, "max_n": self.max_n}

    def propose(self, state: ProposerState) -> Draft | None:
        context = state.token_ids.cpu()  # (T,)
        length = context.numel()
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            suffix = context[length - n :]  # (n,)
            windows = context[: length - 1].unfold(0, n, 1)  # (T - n, n): every earlier n-gram
            starts = (windows == suffix).all(dim=1).nonzero().flatten()  # match start positions
            if starts.numel():
                begin = int(starts[-1]) + n
                continuation = context[begin : begin + self.k]  # (<= K,)
                return Draft.chain(continuation.to(state.token_ids.device))
        return None
