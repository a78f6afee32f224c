"""A Triton one-row matmul (GEMV) for plain decoding's weight reads, to measure against cuBLAS and inductor's tuned
reduction (bench/gemv_backends.py). Bench-only.

``out = x @ weight.T`` for ``x`` (1, K) and ``weight`` (N, K) row-major: each program reads BLOCK_N whole rows of the
weight in BLOCK_K chunks, multiplies into a (BLOCK_N, BLOCK_K) fp32 accumulator (one reduction at the end, so the
loop is loads and fused multiply-adds only) and writes BLOCK_N outputs. With ``swiglu`` the input row is SwiGLU's
product of a fused gate/up row, computed as it is read. No split over K: every output is one program's, so there is
no second reduction kernel and no atomic. The weight streams through once, marked evict-first so it does not push the
activations out of L2. Block sizes, warps and pipeline stages are autotuned per (N, K) on the first call (Triton's
benchmark clears L2 between runs, so a weight that would fit L2 is timed as it is read in a step).
"""

from __future__ import annotations

import itertools
import os

import torch
import triton
import triton.language as tl

# 12 configs, each compiled and timed for every (N, K) at its first call (a 7B step has five shapes, and plain_headroom
# runs inside one device call); a thread's accumulator stays at most 128 fp32 registers (at 4 warps)
CONFIGS = [triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=2)
           for n, k, w in itertools.product((4, 8, 16), (512, 1024), (4, 8))]


INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # a CPU check of the kernels' indexing (fp32 only)


def tuned(key: list[str]):
    """``triton.autotune`` over CONFIGS keyed on ``key``; interpreted (nothing to time on a CPU), one fixed config."""
    if INTERPRETED:
        return triton.heuristics({"BLOCK_N": lambda _: 16, "BLOCK_K": lambda _: 64})
    return triton.autotune(configs=CONFIGS, key=key)


@triton.jit
def weight_tile(w_ptr, rows, row_ok, cols, col_ok, stride_wn):
    """The weight's (BLOCK_N, BLOCK_K) tile at ``rows`` x ``cols`` in fp32, streamed past L2 (evict-first)."""
    return tl.load(w_ptr + rows[:, None] * stride_wn + cols[None, :], mask=row_ok[:, None] & col_ok[None, :],
                   other=0.0, eviction_policy="evict_first").to(tl.float32)


@tuned(["N", "K", "SWIGLU"])
@triton.jit
def _gemv(x_ptr, w_ptr, out_ptr, N, K, stride_wn, SWIGLU: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    row_ok = rows < N
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)  # (BLOCK_K,)
        col_ok = cols < K
        if SWIGLU:  # x is gate_up (1, 2 K): SiLU of the gate in fp32 cast back, times up (static_ops.swiglu's rounding)
            gate = tl.load(x_ptr + cols, mask=col_ok, other=0.0)  # (BLOCK_K,)
            g = gate.to(tl.float32)
            x = ((g * tl.sigmoid(g)).to(gate.dtype) * tl.load(x_ptr + K + cols, mask=col_ok, other=0.0)).to(tl.float32)
        else:
            x = tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)  # (BLOCK_K,)
        acc += weight_tile(w_ptr, rows, row_ok, cols, col_ok, stride_wn) * x[None, :]  # (BLOCK_N, BLOCK_K)
    tl.store(out_ptr + rows, tl.sum(acc, axis=1).to(out_ptr.dtype.element_ty), mask=row_ok)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
         swiglu: bool = False) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for one row ``x`` (1, K), ``weight`` (N, K) with unit stride on K: (1, N). With
    ``swiglu``, ``x`` is a fused gate/up row (1, 2 K) and the input is ``silu(gate) * up``, computed in the kernel."""
    if x.shape[0] != 1 or weight.stride(1) != 1:
        raise ValueError(f"gemv takes one row and a weight with unit stride on K; got x {tuple(x.shape)}, weight "
                         f"strides {weight.stride()}")
    n, k = weight.shape
    out = torch.empty(1, n, dtype=x.dtype, device=x.device)  # (1, N)
    _gemv[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)](x.contiguous(), weight, out, n, k, weight.stride(0),
                                                            SWIGLU=swiglu)
    return out if bias is None else out + bias
