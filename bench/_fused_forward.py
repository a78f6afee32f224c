"""The static model's forward at one row, rewritten around matmuls that compute their own input: each layer's
``norm_gemv(x, delta, norm weight, eps, W)`` adds the residual, norms it and projects it (q/k/v, gate/up), and
``swiglu_gemv(gate_up, W)`` projects SwiGLU's product (down), so the step has no norm or SwiGLU stage of its own.
Bench-only (bench/plain_headroom.py --fused-gemv, --fused-inductor). Two kernel sets: Triton's
(bench/_fused_gemv.TRITON, a norm or SwiGLU computed inside the GEMV) and :func:`inductor_kernels` (each the engine's
stage and its matmul compiled as one max-autotuned function: what inductor fuses across that boundary by itself).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specbench.engine.static_ops import rms_norm, swiglu


def _norm_linear(x, delta, norm_weight, eps, weight):
    h = x if delta is None else x + delta  # (1, K) the residual stream
    return h, F.linear(rms_norm(h, norm_weight, eps), weight)  # (1, K), (1, N)


def _swiglu_linear(gate_up, weight):
    return F.linear(swiglu(gate_up), weight)  # (1, N)


def inductor_kernels():
    """(norm_gemv, swiglu_gemv, gemv) as compositions of the engine's stages and a matmul, each compiled whole in
    max-autotune mode (at one row the matmul becomes a tuned reduction into which inductor may pull the stage)."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    compiled = [torch.compile(f, mode="max-autotune-no-cudagraphs", dynamic=False)
                for f in (_norm_linear, _swiglu_linear, F.linear)]
    return tuple(compiled)


def fused_plain_forward(module, kernels, attention=None):
    """``module.forward`` (a StaticLlamaForCausalLM's) that runs a one-row verify step through ``kernels`` =
    (norm_gemv, swiglu_gemv, gemv) for every projection but the lm_head, ``attention`` (default SDPA) over the cache
    written by the step's rotary stage; prefills, wider steps, biases and aux layers take the original."""
    norm_gemv, swiglu_gemv, gemv = kernels
    original = module.forward
    attend = attention or (lambda q, k, v, bias: F.scaled_dot_product_attention(
        q, k, v, attn_mask=bias[:, None], enable_gqa=q.shape[1] != k.shape[1]))
    layers, final = module.model.layers, module.model.norm
    biased = any(p is not None for layer in layers for p in (layer.self_attn.qkv.bias, layer.self_attn.o_proj.bias,
                                                              layer.mlp.gate_up.bias, layer.mlp.down_proj.bias))

    def forward(ids, positions, slots, mask, cache, ops=None, aux_layers=()):
        if mask is None or ids.numel() != 1 or aux_layers or biased:
            return original(ids, positions, slots, mask, cache, ops, aux_layers=aux_layers)
        x = module.model.embed_tokens(ids)  # (1, H)
        cos, sin = ops.rotary_tables(module.inv_freq, positions, x.dtype)  # (1, D) each
        bias = ops.attention_bias(mask, x.dtype)  # (1, 1, K)
        delta = None
        for layer, kv in zip(layers, cache):  # kv: (2, 1, KVH, S, D)
            attn, mlp = layer.self_attn, layer.mlp
            norm = layer.input_layernorm
            x, qkv = norm_gemv(x, delta, norm.weight, norm.eps, attn.qkv.weight)  # (1, H), (1, (NH + 2 KVH) * D)
            nh, d = attn.num_heads, attn.head_dim
            q = ops.rope_into_cache(qkv, cos, sin, nh, attn.num_kv_heads, kv, slots)[0]  # (NH, 1, D), K/V written
            q = q.view(nh, 1, 1, d).transpose(0, 1)  # (1, NH, 1, D)
            span = bias.shape[-1]
            out = attend(q, kv[0, :, :, :span], kv[1, :, :, :span], bias)  # (1, NH, 1, D)
            post = layer.post_attention_layernorm
            x, gate_up = norm_gemv(x, gemv(out.reshape(1, nh * d), attn.o_proj.weight), post.weight, post.eps,
                                   mlp.gate_up.weight)  # (1, H), (1, 2 I)
            delta = swiglu_gemv(gate_up, mlp.down_proj.weight)  # (1, H)
        return ops.add_rms_norm(x, delta, final.weight, final.eps)[1], None  # (1, H)

    return forward
