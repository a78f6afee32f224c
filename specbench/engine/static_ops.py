"""The pointwise stages between a static decoder step's matmuls, plain or fused by torch.compile (docs/engines.md).

A Llama layer launches four matmuls and, spelled out in eager PyTorch, some twenty small kernels around
them (norm casts, the weight multiply, rotary's halves, residual adds, the SwiGLU product). In a CUDA
graph each small kernel still costs a launch slot and a pass over memory, and on a 7B step they add up
to as much GPU time as a third of the weight reads. :class:`StepOps` names those stages as functions of
their inputs only (no module state, no cache writes), so ``torch.compile`` can turn each into one kernel
without touching the matmuls, the attention or the KV cache; :data:`EAGER_OPS` runs the same bodies
uncompiled, which is what the CPU and every prefill use (a batched group prefill built with ``fused_prefill``
compiles them apart: :func:`compiled_prefill_ops`).
"""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F


def rotary_tables(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin ``(W, D)`` for ``positions`` ``(W,)``, computed in fp32 on the fly (shape-stable, no table to outgrow)."""
    freqs = positions.float()[:, None] * inv_freq[None, :]  # (W, D/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (W, D)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x`` ``(W, H)`` normalised in fp32 whatever the model dtype, cast back, then scaled (transformers' order)."""
    h = F.rms_norm(x.float(), (x.shape[-1],), eps=eps)  # (W, H) fp32
    return weight * h.to(x.dtype)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual stream ``x + delta`` ``(W, H)`` and its norm: one pass when fused."""
    h = x + delta  # (W, H)
    return h, rms_norm(h, weight, eps)


def rotate_heads(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int,
                 num_kv_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split the fused projection ``qkv`` ``(W, (NH + 2 KVH) * D)`` into heads and rotate q and k by ``cos``, ``sin``
    ``(W, D)`` (rotate-half convention): q ``(NH, W, D)``, k and v ``(KVH, W, D)``, views with their last
    dimension contiguous (a group prefill hands them to attention and the cache as they are)."""
    width, d = qkv.shape[0], cos.shape[-1]
    heads = qkv.view(width, num_heads + 2 * num_kv_heads, d).transpose(0, 1)  # (NH + 2 KVH, W, D)
    qk = heads[: num_heads + num_kv_heads]  # (NH + KVH, W, D)
    half = d // 2
    rotated = torch.cat((-qk[..., half:], qk[..., :half]), dim=-1)  # (NH + KVH, W, D)
    qk = qk * cos + rotated * sin  # q and k rotated in one pass
    return qk[:num_heads], qk[num_heads:], heads[num_heads + num_kv_heads:]


def rope_into_cache(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int, num_kv_heads: int,
                    kv: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """:func:`rotate_heads` for a step of B slots of W nodes: q ``(1, NH, B * W, D)`` contiguous for attention, the new
    keys and values written into ``kv`` ``(2, B, KVH, S, D)`` at ``slots`` ``(B, W)`` by one indexed put: compiled, it
    writes in place (a ``scatter_`` would compile to a copy of the whole cache: tests/test_static_ops.py)."""
    q, k, v = rotate_heads(qkv, cos, sin, num_heads, num_kv_heads)  # (NH, B * W, D), (KVH, B * W, D) x 2
    batch, width = slots.shape
    new = torch.stack((k, v)).view(2, num_kv_heads, batch, width, -1)  # (2, KVH, B, W, D)
    kv[:, torch.arange(batch, device=slots.device)[:, None], :, slots] = new.permute(2, 3, 0, 1, 4)  # (B, W, 2, KVH, D)
    return q.unsqueeze(0).contiguous()


def attention_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The boolean attention mask ``(W, K)`` (True = attend) as the additive bias attention adds to its scores:
    0 where allowed, -inf elsewhere. Built once per forward; handed a boolean mask, attention would convert
    it in every layer."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))  # (W, K)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of the fused gate/up projection ``(W, 2 I)`` -> ``(W, I)``."""
    gate, up = gate_up.chunk(2, dim=-1)  # (W, I) each
    return F.silu(gate) * up


@dataclass(frozen=True)
class StepOps:
    """The stage functions one forward calls; the same signatures compiled or not."""

    rotary_tables: Callable
    attention_bias: Callable
    rms_norm: Callable
    add_rms_norm: Callable
    rope_into_cache: Callable
    swiglu: Callable
    rotate_heads: Callable  # a group prefill's rotation, unstacked
    linear: Callable  # (x, weight, bias) -> x @ weight.T + bias: every projection and the lm_head
    compiled: bool = False


STAGES = (rotary_tables, attention_bias, rms_norm, add_rms_norm, rope_into_cache, swiglu, rotate_heads)
EAGER_OPS = StepOps(*STAGES, linear=F.linear)


def compiled_ops(*, autotune_gemv: bool = False) -> StepOps:
    """Every stage through ``torch.compile`` (inductor, no CUDA graphs of its own: the caller captures the
    whole step). Each stage specialises on its first shape and recompiles once for each dimension that then
    varies (the verify width; in the batched engine also the attention span), with that dimension symbolic:
    a few compilations per stage, all while the step graphs are captured, before a run is timed.

    ``autotune_gemv`` also compiles the one-row matmuls of plain decoding in max-autotune mode, whose
    coordinate-descent tuning makes inductor rewrite each as a multiply-and-sum reduction with tuned block sizes
    (on an H200 they read a 7B step's weights at 0.88 of the copy bandwidth against cuBLAS's 0.82:
    docs/engines.md). Wider verify steps keep cuBLAS,
    which autotuning did not beat there; tuning costs ~25 s of capture time per model shape."""
    # sizes of 1 (B, W, heads) and each model shape specialise a stage again: past 8, fullgraph=True makes it an error
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    return StepOps(*(torch.compile(f, fullgraph=True, dynamic=None) for f in STAGES),
                   linear=_autotuned_gemv() if autotune_gemv else F.linear, compiled=True)


def own_code(fn: Callable, name: str) -> Callable:
    """``fn`` over a copy of its code object named ``name``: dynamo keeps a function's compiled versions on its code
    object, so the copy, compiled, has a cache of its own that no other caller of ``fn`` fills or recompiles."""
    code = fn.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


@functools.cache
def compiled_prefill_ops() -> StepOps:
    """The stages of a fused group prefill (``StaticTarget(fused_prefill=True)``), one set per process, each over
    its own code object (:func:`own_code`): a prefill's widths never recompile the steps' compiled stages.
    Shapes are automatic dynamic: the first group size compiles each stage, the second recompiles it with the
    token count symbolic, and every later size reuses that (``group_prefill.prepare_fused`` runs both before
    anything is timed, the second at a real admission's size; docs/batching.md#admission)."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)  # as compiled_ops: fullgraph
    return StepOps(*(torch.compile(own_code(f, f"prefill_{f.__name__}"), fullgraph=True, dynamic=None) for f in STAGES),
                   linear=F.linear, compiled=True)


def _autotuned_gemv() -> Callable:
    # one specialisation per weight shape: 5 for a Llama, more with several models (compiled_ops raised the limit)
    tuned = torch.compile(_linear, mode="max-autotune-no-cudagraphs", fullgraph=True, dynamic=False)

    def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return tuned(x, weight, bias) if x.shape[0] == 1 else F.linear(x, weight, bias)  # (W, out)

    return linear


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x, weight, bias)  # (W, out)
