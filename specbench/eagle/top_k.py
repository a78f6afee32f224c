"""The drafting rules' top-k over the vocabulary: ``torch.topk``, or the same values through chunks of the row
(docs/eagle.md#a-compiled-draft-step)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

# chunks of this many scores per row (0: one torch.topk). On CUDA, torch.topk over a few rows of a 32,000-token
# vocabulary runs a multi-block radix select, four kernels and a scan per call, 12% of EAGLE-2's compiled 7B draft
# on an H100; many short rows take the single-block kernel. Off until an A/B on a GPU shows it pays
# (bench/candidate_archive.sh flips it in a candidate tree; bench/plan_calls.sh OUT draft profiles both)
CHUNK = 0


def vocab_top_k(scores: torch.Tensor, k: int) -> torch.return_types.topk:
    """The k best of every row of ``scores`` ``(..., V)``, best first, as ``torch.topk(scores, k, dim=-1)``: through
    :func:`chunked_top_k` while :data:`CHUNK` is set and a row spans more than one chunk of at least k scores."""
    chunk = CHUNK
    if chunk and k <= chunk < scores.shape[-1]:
        return chunked_top_k(scores, k, chunk=chunk)
    return torch.topk(scores, k, dim=-1)


def chunked_top_k(scores: torch.Tensor, k: int, *, chunk: int) -> torch.return_types.topk:
    """``torch.topk(scores, k, dim=-1)``'s values for ``scores`` ``(..., V)``, best first, in two launches of the
    single-block top-k: every chunk's k best at once (the last chunk padded with -inf), then the k best of those C x k
    candidates. Among equal scores it may pick other indices than ``torch.topk`` (which leaves that order open too):
    a draft may differ on a tie, never the output."""
    if not 0 < k <= chunk:
        raise ValueError(f"chunked_top_k: k must be in 1..chunk ({chunk}), got {k}")
    vocab = scores.shape[-1]
    padded = F.pad(scores, (0, -vocab % chunk), value=float("-inf"))  # (..., C * chunk)
    parts = padded.unflatten(-1, (-1, chunk)).topk(k, dim=-1, sorted=False)  # (..., C, k) each
    starts = torch.arange(0, padded.shape[-1], chunk, device=scores.device)[:, None]  # (C, 1) each chunk's offset
    values, indices = parts.values.flatten(-2), (parts.indices + starts).flatten(-2)  # (..., C * k)
    best = values.topk(k, dim=-1)  # (..., k) sorted, best first
    return torch.return_types.topk((best.values, indices.gather(-1, best.indices)))
