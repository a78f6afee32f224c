"""One-row matmuls that compute their own input: the RMSNorm of a residual add (``norm_gemv``) or SwiGLU's product
(``swiglu_gemv``) inside the GEMV that reads it, so a plain decode step launches no norm and no SwiGLU kernel (with
bench/_fused_forward.py's forward). Bench-only (bench/plain_headroom.py --fused-gemv): the figure that says whether
the engine should adopt them (docs/engines.md).

Every program of a GEMV reads the whole input row, so each recomputes the norm of a 4,096-wide row (two passes over
8 KB that L2 serves) or SwiGLU over the gate and up rows, and none needs another kernel's output. Rounding follows the
engine's stages: the residual add in the model dtype, the norm in fp32 cast back, then times its weight in the model
dtype (``static_ops.rms_norm``); SiLU in fp32 cast back, then times up (``static_ops.swiglu``). The GEMV layout, blocks
and autotuning are bench/_gemv.py's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bench._gemv import gemv, tuned, weight_tile


@tuned(["N", "K", "HAS_DELTA"])
@triton.jit
def _norm_gemv(x_ptr, d_ptr, nw_ptr, w_ptr, out_ptr, h_ptr, N, K, stride_wn, eps,
               HAS_DELTA: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    squares = tl.zeros([BLOCK_K], dtype=tl.float32)
    for start in range(0, K, BLOCK_K):  # pass 1: h = x + delta (program 0 stores it), its sum of squares
        cols = start + tl.arange(0, BLOCK_K)  # (BLOCK_K,)
        col_ok = cols < K
        h = tl.load(x_ptr + cols, mask=col_ok, other=0.0)
        if HAS_DELTA:
            h = h + tl.load(d_ptr + cols, mask=col_ok, other=0.0)  # rounded to the model dtype, as the stage adds
            if pid == 0:
                tl.store(h_ptr + cols, h, mask=col_ok)
        hf = h.to(tl.float32)
        squares += hf * hf
    rstd = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / K + eps)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    row_ok = rows < N
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for start in range(0, K, BLOCK_K):  # pass 2: the normed row, times the weight rows
        cols = start + tl.arange(0, BLOCK_K)
        col_ok = cols < K
        h = tl.load(x_ptr + cols, mask=col_ok, other=0.0)
        if HAS_DELTA:
            h = h + tl.load(d_ptr + cols, mask=col_ok, other=0.0)
        normed = (h.to(tl.float32) * rstd).to(h.dtype)  # (BLOCK_K,) fp32 norm cast back
        a = (tl.load(nw_ptr + cols, mask=col_ok, other=0.0) * normed).to(tl.float32)  # times the norm weight
        acc += weight_tile(w_ptr, rows, row_ok, cols, col_ok, stride_wn) * a[None, :]  # (BLOCK_N, BLOCK_K)
    tl.store(out_ptr + rows, tl.sum(acc, axis=1).to(out_ptr.dtype.element_ty), mask=row_ok)


def norm_gemv(x: torch.Tensor, delta: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
              weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, rms_norm(h) @ weight.T) for h = ``x`` + ``delta`` (1, K) (``x`` itself when ``delta`` is None):
    (1, K), (1, N)."""
    n, k = weight.shape
    out = torch.empty(1, n, dtype=x.dtype, device=x.device)  # (1, N)
    h = x if delta is None else torch.empty_like(x)  # (1, K)
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)  # noqa: E731
    _norm_gemv[grid](x, x if delta is None else delta, norm_weight, weight, out, h, n, k, weight.stride(0), eps,
                     HAS_DELTA=delta is not None)
    return h, out


def swiglu_gemv(gate_up: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``(silu(gate) * up) @ weight.T`` of the fused gate/up row ``gate_up`` (1, 2 I), ``weight`` (N, I): (1, N)."""
    return gemv(gate_up, weight, swiglu=True)


TRITON = (norm_gemv, swiglu_gemv, gemv)  # the kernels bench/_fused_forward.py's forward takes
