"""A full-vocabulary top-k in two launches of PyTorch's single-block top-k instead of its multi-block radix select:
the candidate for EAGLE's draft step, whose top-k over 8 rows of 32,000 log-probabilities launches four radix-select
kernels per call on CUDA (docs/eagle.md#a-compiled-draft-step). Bench-only (bench/replay_profile.py --chunked-topk).

Each row is cut into chunks of ``chunk`` scores (the last padded with -inf); every chunk's k best are taken at once
over all the chunks (many short rows: the single-block path), then the k best of those C x k candidates. The values
are exactly ``torch.topk``'s; among equal scores either may pick another index.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def chunked_top_k(scores: torch.Tensor, k: int, *, chunk: int = 128) -> torch.return_types.topk:
    """``torch.topk(scores, k, dim=-1)`` for ``scores`` ``(..., V)``, best first, through chunks of ``chunk``."""
    if not 0 < k <= chunk:
        raise ValueError(f"chunked_top_k: k must be in 1..chunk ({chunk}), got {k}")
    vocab = scores.shape[-1]
    padded = F.pad(scores, (0, -vocab % chunk), value=float("-inf"))  # (..., C * chunk)
    parts = padded.unflatten(-1, (-1, chunk)).topk(k, dim=-1, sorted=False)  # (..., C, k) each
    starts = torch.arange(0, padded.shape[-1], chunk, device=scores.device)[:, None]  # (C, 1) each chunk's offset
    values, indices = parts.values.flatten(-2), (parts.indices + starts).flatten(-2)  # (..., C * k)
    best = values.topk(k, dim=-1)  # (..., k) sorted, best first
    return torch.return_types.topk((best.values, indices.gather(-1, best.indices)))
