"""Weights read into L2 ahead of their matmul, on a second stream, while a decode step's small kernels run: #29's
candidate for the time a one-row step spends between its matmuls (bench/plain_headroom.py --l2-prefetch). Bench-only.

A plain 7B step's matmuls read HBM at close to its bandwidth, but between them (rotary and the cache write,
attention, the residual norms, SwiGLU) about 210 latency-bound kernels leave HBM nearly idle: 0.58 ms of a 5.3 ms
step on an H100 (bench/results/h100-2026-12-07/README.md), a larger share of the H200's shorter step. Those kernels
cannot get much shorter, but the bandwidth they leave can be spent. :class:`PrefetchingLinear` wraps the step's
``ops.linear``: after each projection's matmul it forks a side stream that reads the first bytes of the next
projection's weight (loads cached in L2 only, summed into a scratch value so that they are kept), and the next
matmul joins it first, so the prefix it reads comes from L2, which serves it several times faster than HBM. Inside
a CUDA graph the fork and the join are edges of the graph, so replays keep them.

How many bytes each window can take is what the bench measures: the window after the fused q/k/v projection
(rotary, the cache write, attention: the longest) prefetches up to ``cap_o`` bytes of the output projection, every
other window (a norm, SwiGLU) ``cap_rest`` bytes of the next matmul's weight. A prefetch longer than its window makes
the matmul wait; ``join=False`` instead lets the prefetches run on (each still after the matmul before it) and joins
them only at the last projection, the lm_head. Nothing is read or written but the weights and the scratch row, so the
step's tokens are the engine's exactly.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU without triton: the tests' stand-in touch, or none
    triton = None

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # a CPU check of the kernel's indexing
# elements per program per iteration: 16 KB of bf16, so two programs per SM keep ~4 MB in flight, what an H200's
# bandwidth times its memory latency (~4.8 TB/s x ~0.8 us) asks for; 64 interpreted (a CPU check of the indexing)
BLOCK = 8192 if not INTERPRETED else 64

if triton is not None:
    @triton.jit
    def _touch(w_ptr, n, out_ptr, BLOCK: tl.constexpr):
        """Read ``n`` elements at ``w_ptr``, program p taking blocks p, p + P, ...; each program stores its sum."""
        pid = tl.program_id(0)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(pid * BLOCK, n, tl.num_programs(0) * BLOCK):
            offs = start + tl.arange(0, BLOCK)  # (BLOCK,)
            # .cg: cached in L2 only (Triton's eviction_policy is L1's, and ptxas refuses it beside .cg)
            acc += tl.load(w_ptr + offs, mask=offs < n, other=0.0, cache_modifier=".cg").to(tl.float32)
        tl.store(out_ptr + pid, tl.sum(acc, axis=0))


def touch_prefix(flat: torch.Tensor, scratch: torch.Tensor) -> None:
    """Read every element of ``flat`` (1-D) into L2 with ``scratch.numel()`` programs, each storing its partial sum
    in ``scratch`` (P,) fp32: the loads' results are used, so the compiler keeps them."""
    if triton is None:
        raise RuntimeError("bench/_l2_prefetch.py needs triton (pip install triton; TRITON_INTERPRET=1 on a CPU)")
    _touch[(scratch.numel(),)](flat, flat.numel(), scratch, BLOCK=BLOCK, num_warps=8)


def projection_order(module) -> list[tuple[str, torch.Tensor]]:
    """A static Llama step's projection weights in the order its forward reads them: per layer the fused q/k/v,
    the output projection, the fused gate/up and the down projection, then the lm_head; each with its name."""
    weights = []
    for layer in module.model.layers:
        attention, mlp = layer.self_attn, layer.mlp
        weights += [("qkv", attention.qkv.weight), ("o", attention.o_proj.weight), ("gate_up", mlp.gate_up.weight),
                    ("down", mlp.down_proj.weight)]
    return weights + [("lm_head", module.lm_head.weight)]


class PrefetchingLinear:
    """``linear(x, weight, bias)`` that prefetches the next projection's weight prefix on a side stream after each
    matmul (``cap_o`` bytes of the output projection, ``cap_rest`` of any other), joined before that weight's matmul
    (``join``) or only before the last projection's; each prefetch runs ``programs`` programs (default two per SM).
    ``touch`` reads a prefix (default :func:`touch_prefix`). On a CPU the prefetch runs inline (interpreted, or a
    stand-in): the order and the sizes can be checked there, not the overlap."""

    def __init__(self, linear: Callable, order: list[tuple[str, torch.Tensor]], *, cap_o: int, cap_rest: int,
                 programs: int | None = None, join: bool = True, touch: Callable | None = None):
        self.linear, self.join, self.touch = linear, join, touch or touch_prefix
        device = order[0][1].device
        self.next: dict[int, torch.Tensor] = {}  # a weight's address -> the prefix of the next weight to prefetch
        for (_, weight), (name, following) in zip(order, order[1:]):
            elements = (cap_o if name == "o" else cap_rest) // following.element_size()
            if elements > 0 and following.is_contiguous():
                self.next[weight.data_ptr()] = following.reshape(-1)[:elements]  # (n,) a view: no copy
        self.known = {weight.data_ptr() for _, weight in order}
        self.last = order[-1][1].data_ptr()
        if programs is None:  # two per SM (see BLOCK)
            cuda = device.type == "cuda"
            programs = 2 * torch.cuda.get_device_properties(device).multi_processor_count if cuda else 4
        self.scratch = torch.zeros(programs, dtype=torch.float32, device=device)  # (P,) the touches' sums
        self.side = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.pending = False  # a prefetch forked and not yet joined

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        key = weight.data_ptr()
        if self.pending and (self.join or key == self.last or key not in self.known):  # an unknown weight: join
            torch.cuda.current_stream(x.device).wait_stream(self.side)  # the join: the prefix is in L2
            self.pending = False
        out = self.linear(x, weight, bias)  # (W, out)
        prefix = self.next.get(key)
        if prefix is not None:
            self._fork(prefix)
        return out

    def _fork(self, prefix: torch.Tensor) -> None:
        if self.side is None:
            self.touch(prefix, self.scratch)
            return
        self.side.wait_stream(torch.cuda.current_stream(prefix.device))  # after the matmul just queued
        with torch.cuda.stream(self.side):
            self.touch(prefix, self.scratch)
        self.pending = True


def parse_spec(spec: str) -> tuple[int, int, bool]:
    """``O:R`` or ``O:R:nojoin`` (megabytes prefetched in the attention window and in every other one) ->
    (cap_o bytes, cap_rest bytes, join)."""
    parts = spec.split(":")
    try:
        if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != "nojoin"):
            raise ValueError
        cap_o, cap_rest = (int(float(p) * 2**20) for p in parts[:2])
    except ValueError:
        raise ValueError(f"--l2-prefetch: {spec!r} is not O:R or O:R:nojoin (megabytes, e.g. 32:4)") from None
    if cap_o < 0 or cap_rest < 0:
        raise ValueError(f"--l2-prefetch: {spec!r} has a negative size")
    return cap_o, cap_rest, len(parts) == 2


def prefetching_target(target, spec: str, programs: int | None = None):
    """Another static target of one slot over ``target``'s module and stages (weights shared) whose projections
    prefetch into L2 as ``spec`` (:func:`parse_spec`) says; ValueError for a bad spec."""
    cap_o, cap_rest, join = parse_spec(spec)
    linear = PrefetchingLinear(target.ops.linear, projection_order(target.module), cap_o=cap_o, cap_rest=cap_rest,
                               programs=programs, join=join)
    return target.with_batch_size(1, ops=dataclasses.replace(target.ops, linear=linear))
