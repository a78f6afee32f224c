"""The EAGLE-1/EAGLE-2 draft head: ``fc(cat(embed, feature))`` into one Llama decoder layer without input norm,
over a draft KV cache (one sequence's, or B slots' for the proposer) that tree expansion writes beyond the
committed length (docs/eagle.md#draft-forward)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch
from torch import nn

from specbench.engine.static_llama import MLP, Attention, LlamaShape, RMSNorm, rope_inv_freq
from specbench.engine.static_ops import EAGER_OPS, StepOps

# draft-cache slots allocated before any reserve(); it doubles when a request outgrows it
DEFAULT_CACHE_SLOTS = 256


@dataclass(frozen=True)
class EagleConfig:
    """The draft head's shape, as config.json gives it (a Llama config of one layer; docs/eagle.md#layout)."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # transformers 4.x form; None: plain rope
    max_position_embeddings: int = 2048
    bias: bool = True  # fc.bias present (LLaMA-3 drafts set "bias": false)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads  # as cnets1 computes it: no head_dim field

    def shape(self) -> LlamaShape:
        """The decoder layer's LlamaShape (validates the rope settings; raises UnsupportedModel)."""
        return LlamaShape.from_config(SimpleNamespace(
            model_type="llama", hidden_act="silu", vocab_size=self.vocab_size, hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size, num_hidden_layers=1, num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim, rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta, rope_scaling=self.rope_scaling, rope_parameters=None,
            max_position_embeddings=self.max_position_embeddings, attention_bias=False, mlp_bias=False,
            tie_word_embeddings=False,
        ))

    def to_json(self) -> dict:
        """config.json as the published drafts write it: a LlamaConfig with ``num_hidden_layers: 1`` and ``bias``."""
        return {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "num_hidden_layers": 1,
            "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
            "vocab_size": self.vocab_size, "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling, "max_position_embeddings": self.max_position_embeddings, "bias": self.bias,
        }


def _grown(kv: torch.Tensor, slots: int) -> torch.Tensor:
    """``kv`` ``(..., S, D)`` with room for ``slots`` entries (at least doubling S), every entry kept: a tree
    expansion's nodes sit past the committed lengths and are read by the next depth."""
    grown = kv.new_zeros(*kv.shape[:-2], max(slots, 2 * kv.shape[-2]), kv.shape[-1])  # (..., S', D)
    grown[..., : kv.shape[-2], :] = kv
    return grown


class DraftKVCache:
    """Keys and values ``(2, KVH, S, D)`` of the draft's one layer; slots ``[0, length)`` are written."""

    def __init__(self, num_kv_heads: int, head_dim: int, *, dtype: torch.dtype, device, capacity: int = DEFAULT_CACHE_SLOTS):
        # zeros: masked slots still enter attention as 0 * value
        self.kv = torch.zeros(2, num_kv_heads, capacity, head_dim, dtype=dtype, device=device)  # (2, KVH, S, D)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.kv.shape[2]

    def reserve(self, slots: int) -> None:
        """Room for ``slots`` entries; grows (at least doubling) and keeps the written ones."""
        if slots > self.capacity:
            self.kv = _grown(self.kv, slots)

    def truncate(self, length: int) -> None:
        """Forget the entries beyond ``length`` (a rejected draft's, or a tree expansion's)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"draft KV cache truncate to {length}: it holds {self.length} entries")
        self.length = length


class BatchedDraftKVCache:
    """The draft layer's keys and values for B slots ``(2, B, KVH, S, D)``; slot b's entries ``[0, lengths[b])``
    are written (host-known lengths: a batched proposer tracks them, nothing is read back)."""

    def __init__(self, batch_size: int, num_kv_heads: int, head_dim: int, *, dtype: torch.dtype, device,
                 capacity: int = DEFAULT_CACHE_SLOTS):
        self.kv = torch.zeros(2, batch_size, num_kv_heads, capacity, head_dim, dtype=dtype, device=device)  # (2, B, KVH, S, D)
        self.lengths = [0] * batch_size

    @property
    def capacity(self) -> int:
        return self.kv.shape[3]

    def reserve(self, slots: int) -> None:
        """Room for ``slots`` entries in every slot; grows (at least doubling) and keeps the written ones."""
        if slots > self.capacity:
            self.kv = _grown(self.kv, slots)


class EagleDecoderLayer(nn.Module):
    """A Llama decoder layer whose attention reads its input un-normed: EAGLE's layer 0 has no input_layernorm."""

    def __init__(self, shape: LlamaShape):
        super().__init__()
        self.self_attn = Attention(shape)
        self.mlp = MLP(shape)
        self.post_attention_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)

    def fuse(self) -> None:
        self.self_attn.fuse()
        self.mlp.fuse()

    def fused_current(self) -> bool:
        """Whether the fused q/k/v and gate/up weights still hold the named parameters (no .to() or reassignment since)."""
        pairs = ((self.self_attn.qkv, (self.self_attn.q_proj, self.self_attn.k_proj, self.self_attn.v_proj)),
                 (self.mlp.gate_up, (self.mlp.gate_proj, self.mlp.up_proj)))
        for fused, parts in pairs:
            if fused.weight is None:
                return False
            storage = fused.weight.untyped_storage().data_ptr()
            if any(p.weight.untyped_storage().data_ptr() != storage for p in parts):
                return False
        return True

    def forward(self, x, cos, sin, kv, slots, bias, ops: StepOps = EAGER_OPS) -> torch.Tensor:
        """``x`` (N, H) the fc output of B slots' W rows each; ``kv`` (2, B, KVH, S, D); ``bias`` (B, W, K) over each
        slot's first K entries; ``ops`` the pointwise stages (eager, or the target's compiled ones)."""
        attn = self.self_attn(x, cos, sin, kv, slots, bias, ops)  # (W, H)
        post = self.post_attention_layernorm
        h, normed = ops.add_rms_norm(x, attn, post.weight, post.eps)  # (W, H) each
        return h + self.mlp(normed, ops)  # (W, H): not normed; the target's lm_head reads it as it is


def draft_attention_mask(width: int, start: int, visible: int | None, block_mask: torch.Tensor | None,
                         device) -> torch.Tensor:
    """(W, start + W) bool: ``width`` new rows after ``start`` cached slots see slots ``[0, visible)`` (default all)
    and, through ``block_mask`` ``(W, start + W - visible)``, the slots from ``visible`` on (default, only when
    ``visible`` is ``start``: causal among the new rows)."""
    visible = start if visible is None else visible
    if block_mask is None:
        if visible != start:
            raise ValueError(f"a block_mask is needed when rows see only {visible} of the {start} written slots")
        block_mask = torch.ones(width, width, dtype=torch.bool, device=device).tril_()  # (W, W)
    if block_mask.shape != (width, start + width - visible):
        raise ValueError(f"block_mask has shape {tuple(block_mask.shape)}, expected ({width}, {start + width - visible})")
    prefix = torch.ones(width, visible, dtype=torch.bool, device=device)  # (W, visible)
    return torch.cat([prefix, block_mask.to(device)], dim=1)  # (W, start + W)


class EagleHead(nn.Module):
    """Parameter names are the published keys (``embed_tokens``, ``fc``, ``layers.0.*``); ``embed_tokens`` is None
    when the checkpoint omits it and the target's embedding serves (docs/eagle.md#layout)."""

    def __init__(self, config: EagleConfig, *, with_embed: bool = True):
        super().__init__()
        self.config = config
        self.shape = config.shape()
        hidden = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, hidden) if with_embed else None
        self.fc = nn.Linear(2 * hidden, hidden, bias=config.bias)
        self.layers = nn.ModuleList([EagleDecoderLayer(self.shape)])
        self.inv_freq = rope_inv_freq(self.shape)  # (D/2,) fp32; a plain attribute, so .to(dtype) never rounds it

    # -- preparation -----------------------------------------------------------------------------------

    def prepare(self) -> "EagleHead":
        """Ready for drafting on the parameters' device and dtype: no grad, q/k/v and gate/up fused into one
        matmul each (the named weights become views), fp32 rotary frequencies. Forward calls it when needed."""
        self.requires_grad_(False)
        with torch.no_grad():
            self.layer.fuse()
        self.inv_freq = rope_inv_freq(self.shape).to(self.fc.weight.device)  # (D/2,)
        return self.eval()

    def new_cache(self, capacity: int = DEFAULT_CACHE_SLOTS) -> DraftKVCache:
        weight = self.fc.weight
        return DraftKVCache(self.shape.num_kv_heads, self.shape.head_dim, dtype=weight.dtype, device=weight.device,
                            capacity=capacity)

    # -- forward ---------------------------------------------------------------------------------------

    @torch.inference_mode()
    def forward(self, embeds: torch.Tensor, features: torch.Tensor, positions: torch.Tensor, cache: DraftKVCache, *,
                visible: int | None = None, block_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Output hidden states ``(W, H)`` of ``W`` new draft positions, appended to ``cache``.

        ``embeds`` ``(W, H)``: token embeddings; ``features`` ``(W, H)``: the feature each position reads (the
        target's hidden state, or the draft's own output at the parent); ``positions`` ``(W,)`` rotary positions.
        Every new row attends to cache slots ``[0, visible)`` (default: all written so far) and, through
        ``block_mask`` ``(W, cache.length + W - visible)`` bool, to the slots from ``visible`` on, the new
        ones included (default, only when ``visible`` is the cache length: causal among the new rows).
        """
        width, start, device = embeds.shape[0], cache.length, embeds.device
        mask = draft_attention_mask(width, start, visible, block_mask, device)  # (W, start + W)
        cache.reserve(start + width)
        slots = torch.arange(start, start + width, device=device)  # (W,)
        # one slot of the B-slot form: the cache (2, KVH, S, D) viewed as (2, 1, KVH, S, D), written through
        hidden = self.step_batched(embeds[None], features[None], positions.to(device)[None], slots[None], mask[None],
                                   cache.kv[:, None])  # (1, W, H)
        cache.length = start + width
        return hidden[0]

    @property
    def layer(self) -> EagleDecoderLayer:
        return self.layers[0]

    def new_batched_cache(self, batch_size: int, capacity: int = DEFAULT_CACHE_SLOTS) -> BatchedDraftKVCache:
        weight = self.fc.weight
        return BatchedDraftKVCache(batch_size, self.shape.num_kv_heads, self.shape.head_dim, dtype=weight.dtype,
                                   device=weight.device, capacity=capacity)

    def step_batched(self, embeds, features, positions, slots, mask, kv, ops: StepOps = EAGER_OPS) -> torch.Tensor:
        """:meth:`step` over B slots of W rows each: ``embeds`` ``(B, W, H)``, ``features`` ``(B, W, F)``,
        ``positions`` and ``slots`` ``(B, W)`` (each slot's rows written in its own row of ``kv``
        ``(2, B, KVH, S, D)``), ``mask`` ``(B, W, K)`` bool over each slot's first K entries; returns ``(B, W, H)``.
        The same core over the flattened rows (the attention takes its batched branch); no host reads."""
        if not torch.compiler.is_compiling() and not self.layer.fused_current():  # a host check dynamo cannot trace
            self.prepare()
        batch, width = slots.shape
        hidden = self.step(embeds.flatten(0, 1), features.flatten(0, 1), positions.flatten(), slots, mask, kv,
                           ops)  # (B * W, H)
        return hidden.view(batch, width, -1)

    def step(self, embeds, features, positions, slots, mask, kv, ops: StepOps = EAGER_OPS) -> torch.Tensor:
        """The forward's shape-stable core: B slots' ``N = B * W`` rows ``(N, H)`` written at ``slots`` ``(B, W)`` of
        their rows of ``kv`` ``(2, B, KVH, S, D)``, attending through ``mask`` ``(B, W, K)`` bool over each slot's
        first K entries, at rotary ``positions`` ``(N,)``; only device tensors, no host reads (the region a CUDA graph
        captures, eagle/captured.py). ``ops``: the pointwise stages, eager or compiled (engine/static_ops.py)."""
        x = self.fc(torch.cat([embeds, features.to(embeds.dtype)], dim=-1))  # (W, H): embedding first, as cnets1
        cos, sin = ops.rotary_tables(self.inv_freq, positions, x.dtype)  # (W, D) each
        return self.layer(x, cos, sin, kv, slots, ops.attention_bias(mask, x.dtype), ops)  # (W, H)
