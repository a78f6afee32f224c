"""A Triton attention kernel for the static engine's verify shapes (a few query rows per sequence over a short cache
span with an additive bias), to measure against SDPA's backends (bench/attention_backends.py). Bench-only."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _attend(q_ptr, k_ptr, v_ptr, bias_ptr, out_ptr, scale,
            sq_b, sq_h, sq_w, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, sb_b, sb_w, so_b, so_h, so_w,
            heads, group, width, keys,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    # one program: BLOCK_M query rows of one (sequence, head), online softmax over the span in BLOCK_N blocks
    row_block, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // heads, bh % heads
    kvh = h // group
    rows = row_block * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    dims = tl.arange(0, HEAD_DIM)  # (D,)
    row_ok = rows < width
    q = tl.load(q_ptr + b * sq_b + h * sq_h + rows[:, None] * sq_w + dims[None, :], mask=row_ok[:, None],
                other=0.0)  # (BLOCK_M, D)
    best = tl.full([BLOCK_M], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start in range(0, keys, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
        col_ok = cols < keys
        k = tl.load(k_ptr + b * sk_b + kvh * sk_h + cols[:, None] * sk_n + dims[None, :], mask=col_ok[:, None],
                    other=0.0)  # (BLOCK_N, D)
        v = tl.load(v_ptr + b * sv_b + kvh * sv_h + cols[:, None] * sv_n + dims[None, :], mask=col_ok[:, None],
                    other=0.0)  # (BLOCK_N, D)
        bias = tl.load(bias_ptr + b * sb_b + rows[:, None] * sb_w + cols[None, :],
                       mask=row_ok[:, None] & col_ok[None, :], other=float("-inf")).to(tl.float32)  # (BLOCK_M, BLOCK_N)
        scores = tl.dot(q, tl.trans(k)).to(tl.float32) * scale + bias  # (BLOCK_M, BLOCK_N)
        new_best = tl.maximum(best, tl.max(scores, 1))
        safe = tl.where(new_best == float("-inf"), 0.0, new_best)  # a row with nothing to attend yet
        p = tl.exp(scores - safe[:, None])
        shrink = tl.exp(best - safe)
        total = total * shrink + tl.sum(p, 1)
        acc = acc * shrink[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
        best = new_best
    out = acc / tl.where(total == 0.0, 1.0, total)[:, None]
    tl.store(out_ptr + b * so_b + h * so_h + rows[:, None] * so_w + dims[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None])


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor,
           block_n: int = 64) -> torch.Tensor:
    """``q`` (B, NH, W, D), ``keys``/``values`` (B, KVH, K, D) with unit stride on D, ``bias`` (B, W, K) additive:
    (B, NH, W, D), as ``F.scaled_dot_product_attention(q, keys, values, attn_mask=bias[:, None])``."""
    batch, heads, width, dim = q.shape
    kv_heads, span = keys.shape[1], keys.shape[2]
    out = torch.empty_like(q)
    block_m = 16 if width <= 16 else 64
    grid = (triton.cdiv(width, block_m), batch * heads)
    _attend[grid](q, keys, values, bias, out, dim ** -0.5,
                  q.stride(0), q.stride(1), q.stride(2), keys.stride(0), keys.stride(1), keys.stride(2),
                  values.stride(0), values.stride(1), values.stride(2), bias.stride(0), bias.stride(1),
                  out.stride(0), out.stride(1), out.stride(2), heads, heads // kv_heads, width, span,
                  BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=dim)
    return out
