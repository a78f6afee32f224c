"""A compact Llama-family decoder (Llama, Mistral, Qwen2) over a preallocated KV cache, gpt-fast style.

Module and parameter names are those of transformers' ``LlamaForCausalLM`` (``model.layers.{i}.self_attn.q_proj``
...), so a checkpoint's state dict loads as it stands; loading is strict. After loading, q/k/v and gate/up run as
one matmul each (the named weights become views into the fused ones). The numerics follow transformers'
(RMSNorm in fp32, rotary tables in fp32 cast to the model dtype) so fp32 logits agree to summation order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from specbench.engine.static_ops import EAGER_OPS, StepOps

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
EAGER_HINT = "run it with `--engine eager` (the transformers target, any causal LM)"
# buffers older transformers versions saved with Llama weights; recomputed from the config here
IGNORED_CHECKPOINT_SUFFIXES = ("rotary_emb.inv_freq",)


class UnsupportedModel(ValueError):
    """A checkpoint the static engine cannot run: another architecture or an unsupported option."""


def _refuse(config, what: str) -> UnsupportedModel:
    model_type = getattr(config, "model_type", None)
    return UnsupportedModel(
        f"the static engine cannot run model_type {model_type!r}: {what}; it supports "
        f"{', '.join(SUPPORTED_MODEL_TYPES)} (standard rope or llama3 rope scaling); {EAGER_HINT}"
    )


def _rope_settings(config) -> dict:
    """The rope parameters in transformers 5's ``rope_parameters`` form, also from 4.x ``rope_theta``/``rope_scaling``."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    if "rope_theta" not in params:
        params.update(getattr(config, "rope_scaling", None) or {})
        params["rope_theta"] = getattr(config, "rope_theta", 10000.0)
    params["rope_type"] = params.get("rope_type", params.get("type")) or "default"
    return params


@dataclass(frozen=True)
class LlamaShape:
    """Everything the static model needs from a transformers config, validated once."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    llama3_scaling: tuple[float, float, float, int] | None  # factor, low_freq_factor, high_freq_factor, original max
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    tie_word_embeddings: bool
    max_position_embeddings: int
    sliding_window: int | None  # None: full attention in every layer

    @classmethod
    def from_config(cls, config) -> "LlamaShape":
        model_type = getattr(config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            archs = getattr(config, "architectures", None)
            raise _refuse(config, f"not a Llama-family architecture{f' ({archs[0]})' if archs else ''}")
        if getattr(config, "hidden_act", "silu") != "silu":
            raise _refuse(config, f"hidden_act {config.hidden_act!r} (SwiGLU with silu only)")
        for option in ("final_logit_softcapping", "attn_logit_softcapping"):
            if getattr(config, option, None):
                raise _refuse(config, f"{option} is set")
        rope = _rope_settings(config)
        if rope["rope_type"] not in ("default", "llama3"):
            raise _refuse(config, f"rope_type {rope['rope_type']!r}")
        if rope.get("partial_rotary_factor", 1.0) != 1.0:
            raise _refuse(config, f"partial_rotary_factor {rope['partial_rotary_factor']}")
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        if heads % kv_heads:
            raise _refuse(config, f"{heads} attention heads are not a multiple of {kv_heads} key/value heads")
        scaling = None
        if rope["rope_type"] == "llama3":
            original = rope.get("original_max_position_embeddings", config.max_position_embeddings)
            scaling = (float(rope["factor"]), float(rope["low_freq_factor"]), float(rope["high_freq_factor"]), int(original))
        window = getattr(config, "sliding_window", None)
        layer_types = getattr(config, "layer_types", None)
        if window is not None and layer_types is not None and "sliding_attention" not in layer_types:
            window = None  # Qwen2 keeps a window size even where no layer uses it
        attention_bias = bool(getattr(config, "attention_bias", False))
        return cls(
            model_type=model_type,
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            rms_norm_eps=config.rms_norm_eps,
            rope_theta=float(rope["rope_theta"]),
            llama3_scaling=scaling,
            qkv_bias=model_type == "qwen2" or attention_bias,  # Qwen2 always has q/k/v biases, no o bias
            o_bias=model_type != "qwen2" and attention_bias,
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            max_position_embeddings=config.max_position_embeddings,
            sliding_window=window,
        )


def rope_inv_freq(shape: LlamaShape) -> torch.Tensor:
    """(head_dim / 2,) float32 inverse frequencies, with llama3 scaling when configured (as transformers computes them)."""
    dim = shape.head_dim
    inv_freq = 1.0 / (shape.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))  # (D/2,)
    if shape.llama3_scaling is None:
        return inv_freq
    factor, low, high, original = shape.llama3_scaling
    low_wavelen, high_wavelen = original / low, original / high
    wavelen = 2 * math.pi / inv_freq  # (D/2,)
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)  # long wavelengths: divided by factor
    smooth = (original / wavelen - low) / (high - low)  # (D/2,) between the two bands: interpolated
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class RMSNorm(nn.Module):
    """A norm's weight and eps; the forward pass calls :func:`~specbench.engine.static_ops.rms_norm` through the step's ops."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps


class PartialSumOutput:
    """The hook a row-parallel output projection needs (``engine/tensor_parallel.py``): ``reduce_output``, when
    set, turns this module's partial sum into the full one (an all-reduce over the tensor-parallel group).
    None, the single-process default, returns the projection unchanged."""

    reduce_output: Callable[[torch.Tensor], torch.Tensor] | None = None

    def reduced(self, partial: torch.Tensor) -> torch.Tensor:
        return partial if self.reduce_output is None else self.reduce_output(partial)  # (W, H)


class Attention(PartialSumOutput, nn.Module):
    def __init__(self, s: LlamaShape):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = s.num_heads, s.num_kv_heads, s.head_dim
        self.q_proj = nn.Linear(s.hidden_size, s.num_heads * s.head_dim, bias=s.qkv_bias)
        self.k_proj = nn.Linear(s.hidden_size, s.num_kv_heads * s.head_dim, bias=s.qkv_bias)
        self.v_proj = nn.Linear(s.hidden_size, s.num_kv_heads * s.head_dim, bias=s.qkv_bias)
        self.o_proj = nn.Linear(s.num_heads * s.head_dim, s.hidden_size, bias=s.o_bias)
        self.qkv = FusedLinear()  # q, k and v in one matmul (filled by fuse())

    def fuse(self) -> None:
        self.qkv.fuse(self.q_proj, self.k_proj, self.v_proj)

    def forward(self, x, cos, sin, kv: torch.Tensor, slots: torch.Tensor, bias: torch.Tensor | None, ops: StepOps) -> torch.Tensor:
        """B sequences of W nodes each, flattened: ``x`` (B * W, H) normed input; ``kv`` (2, B, KVH, S, D) this layer's
        cache; ``slots`` (B, W) where each sequence's new keys go in its own cache row; ``bias`` (B, W, K) each
        sequence's additive attention bias over its first K entries (0 = attend, -inf = not; docs/batching.md).
        ``bias`` None is a prefill of whole prompts into their rows (:meth:`prefill_rows`, ``slots`` (n,) the rows)."""
        if bias is None:
            return self.prefill_rows(x, cos, sin, kv, slots, ops)
        batch, width = slots.shape
        nh, kvh, d = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = ops.linear(x, self.qkv.weight, self.qkv.bias)  # (B * W, (NH + 2 KVH) * D)
        q = ops.rope_into_cache(qkv, cos, sin, nh, kvh, kv, slots)[0].view(nh, batch, width, d).transpose(0, 1)  # (B, NH, W, D), K/V written
        keys_len = bias.shape[-1]
        keys, values = kv[0, :, :, :keys_len], kv[1, :, :, :keys_len]  # (B, KVH, K, D) each
        # enable_gqa only when the head counts differ: it rules out the fused memory-efficient kernel, and
        # the math fallback is half a dozen kernels per layer
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=bias[:, None], enable_gqa=kvh != nh)  # (B, NH, W, D)
        o = self.o_proj
        return self.reduced(ops.linear(out.transpose(1, 2).reshape(batch * width, nh * d), o.weight, o.bias))  # (B * W, H)

    def prefill_rows(self, x, cos, sin, kv: torch.Tensor, rows: torch.Tensor, ops: StepOps) -> torch.Tensor:
        """n prompts padded at their ends to W tokens each, every one from position 0, flattened: ``x`` (n * W, H);
        ``kv`` (2, B, KVH, S, D) this layer's batched cache; ``rows`` (n,) the cache rows they fill. Each prompt
        attends causally to its own new keys, not the cache, so no mask is built and the fused causal kernel
        runs; the keys and values then go to the first W entries of its row, one copy each. Past a prompt's length
        those entries are its padding's, beyond the row's length, where nothing attends until a step overwrites
        them (docs/batching.md#admission)."""
        n = rows.numel()
        width = x.shape[0] // n
        nh, kvh, d = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = ops.linear(x, self.qkv.weight, self.qkv.bias)  # (n * W, (NH + 2 KVH) * D)
        # unstacked: q, k and v go to attention and the cache as views, no copies
        q, k, v = (t.view(-1, n, width, d).transpose(0, 1)
                   for t in ops.rotate_heads(qkv, cos, sin, nh, kvh))  # (n, NH, W, D), (n, KVH, W, D) x 2
        kv[0, :, :, :width].index_copy_(0, rows, k)
        kv[1, :, :, :width].index_copy_(0, rows, v)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kvh != nh)  # (n, NH, W, D)
        o = self.o_proj
        return self.reduced(ops.linear(out.transpose(1, 2).reshape(n * width, nh * d), o.weight, o.bias))  # (n * W, H)


class FusedLinear(nn.Module):
    """Several Linears over one input as one matmul (the step's ``ops.linear`` over ``weight``, ``bias``): their
    weights concatenated by rows; the originals become views into the fused weight, so the state dict keeps
    its names and no weight is held twice."""

    def __init__(self):
        super().__init__()
        self.weight: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None

    def fuse(self, *parts: nn.Linear) -> None:
        weight = torch.cat([p.weight for p in parts])  # (sum of out features, in)
        bias = torch.cat([p.bias for p in parts]) if parts[0].bias is not None else None
        offset = 0
        for part in parts:
            rows = part.weight.shape[0]
            part.weight = nn.Parameter(weight[offset: offset + rows], requires_grad=False)
            if bias is not None:
                part.bias = nn.Parameter(bias[offset: offset + rows], requires_grad=False)
            offset += rows
        self.weight, self.bias = weight, bias  # plain attributes: the parts' parameters are the state dict


class MLP(PartialSumOutput, nn.Module):
    def __init__(self, s: LlamaShape):
        super().__init__()
        self.gate_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=s.mlp_bias)
        self.up_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=s.mlp_bias)
        self.down_proj = nn.Linear(s.intermediate_size, s.hidden_size, bias=s.mlp_bias)
        self.gate_up = FusedLinear()  # gate and up in one matmul (filled by fuse())

    def fuse(self) -> None:
        self.gate_up.fuse(self.gate_proj, self.up_proj)

    def forward(self, x: torch.Tensor, ops: StepOps) -> torch.Tensor:
        gate_up, down = self.gate_up, self.down_proj
        return self.reduced(ops.linear(ops.swiglu(ops.linear(x, gate_up.weight, gate_up.bias)), down.weight, down.bias))  # (W, H)


class DecoderLayer(nn.Module):
    def __init__(self, s: LlamaShape):
        super().__init__()
        self.self_attn = Attention(s)
        self.mlp = MLP(s)
        self.input_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)

    def forward(self, x, normed, next_norm: RMSNorm, cos, sin, kv, slots, bias, ops: StepOps) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream ``x`` (W, H) and its input norm ``normed`` in; out, the stream after this layer
        and its ``next_norm`` (the next layer's input norm, or the final norm): each residual add is fused
        with the norm that follows it."""
        attn = self.self_attn(normed, cos, sin, kv, slots, bias, ops)  # (W, H)
        post = self.post_attention_layernorm
        h, normed = ops.add_rms_norm(x, attn, post.weight, post.eps)  # (W, H) each
        return ops.add_rms_norm(h, self.mlp(normed, ops), next_norm.weight, next_norm.eps)


class LlamaBody(nn.Module):
    def __init__(self, s: LlamaShape):
        super().__init__()
        self.embed_tokens = nn.Embedding(s.vocab_size, s.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(s) for _ in range(s.num_layers))
        self.norm = RMSNorm(s.hidden_size, s.rms_norm_eps)


class StaticLlamaForCausalLM(nn.Module):
    """The decoder and lm_head; the caller owns the KV cache ``(layers, 2, B, kv_heads, S, head_dim)``."""

    def __init__(self, shape: LlamaShape):
        super().__init__()
        self.shape = shape
        self.model = LlamaBody(shape)
        self.lm_head = nn.Linear(shape.hidden_size, shape.vocab_size, bias=False)
        if shape.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(shape), persistent=False)  # (D/2,)

    def forward(self, ids, positions, slots, mask, cache: torch.Tensor, ops: StepOps = EAGER_OPS,
                aux_layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Final-normed hidden states ``(N, H)`` of ``ids`` ``(N,)`` at ``positions`` ``(N,)``, N = B * W: B sequences of
        W nodes flattened; their K/V go to ``cache`` ``(layers, 2, B, kv_heads, S, head_dim)`` at ``slots`` ``(B, W)``;
        ``mask`` ``(B, W, K)`` bool says which of its row's first K entries each node attends to. ``mask`` None is a
        prefill of n whole prompts padded to W into the cache rows ``slots`` ``(n,)``, causally among themselves
        (:meth:`Attention.prefill_rows`). ``ops`` runs the pointwise stages (:mod:`specbench.engine.static_ops`),
        fused or not. Also returns the residual streams entering ``aux_layers``, concatenated ``(N, A * H)``."""
        if cache.dim() != 6:
            raise ValueError(f"the static model's cache is (layers, 2, B, kv_heads, S, head_dim); got shape {tuple(cache.shape)}")
        x = self.model.embed_tokens(ids)  # (N, H)
        cos, sin = ops.rotary_tables(self.inv_freq, positions, x.dtype)  # (N, D) each
        bias = None if mask is None else ops.attention_bias(mask, x.dtype)  # (B, W, K)
        layers = self.model.layers
        first = layers[0].input_layernorm
        normed = ops.rms_norm(x, first.weight, first.eps)  # (N, H)
        next_norms = [layer.input_layernorm for layer in layers[1:]] + [self.model.norm]
        aux = {}
        for index, (layer, next_norm, kv) in enumerate(zip(layers, next_norms, cache)):  # kv: (2, B, KVH, S, D)
            if index in aux_layers:
                aux[index] = x  # (N, H) what enters layer `index`
            x, normed = layer(x, normed, next_norm, cos, sin, kv, slots, bias, ops)
        return normed, (torch.cat([aux[i] for i in aux_layers], dim=-1) if aux_layers else None)  # (N, H), (N, A * H)

    def logits(self, hidden: torch.Tensor, ops: StepOps = EAGER_OPS) -> torch.Tensor:
        return ops.linear(hidden, self.lm_head.weight, None).float()  # (W, V)

    @classmethod
    def from_state_dict(cls, shape: LlamaShape, state: dict, *, dtype: torch.dtype, device, source: str) -> "StaticLlamaForCausalLM":
        """Build with ``state``'s tensors (no copy when dtype and device already match, except q/k/v and gate/up,
        which are concatenated into one weight each); strict about keys and shapes."""
        with torch.device("meta"):
            model = cls(shape)
        expected = {name: p.shape for name, p in model.state_dict().items()}
        state = {k: v for k, v in state.items() if not k.endswith(IGNORED_CHECKPOINT_SUFFIXES)}
        optional = {"lm_head.weight"} if shape.tie_word_embeddings else set()
        missing = sorted(set(expected) - set(state) - optional)
        unexpected = sorted(set(state) - set(expected))
        if missing or unexpected:
            parts = [f"missing keys {_listed(missing)}"] if missing else []
            parts += [f"unexpected keys {_listed(unexpected)}"] if unexpected else []
            raise ValueError(
                f"{source}: the weights do not match a {shape.model_type} model of this config: "
                + "; ".join(parts) + "; is config.json the checkpoint's own?"
            )
        for name, tensor in state.items():
            if tuple(tensor.shape) != tuple(expected[name]):
                raise ValueError(f"{source}: {name} has shape {tuple(tensor.shape)}, the config implies {tuple(expected[name])}")
        if shape.tie_word_embeddings and "lm_head.weight" in state:
            head, embed = state["lm_head.weight"], state["model.embed_tokens.weight"]
            if head is not embed and not torch.equal(head, embed):
                raise ValueError(f"{source}: tie_word_embeddings is set but lm_head.weight differs from model.embed_tokens.weight")
        tensors = {k: v.to(device=device, dtype=dtype) for k, v in state.items() if k not in optional}
        model.load_state_dict(tensors, strict=False, assign=True)
        if shape.tie_word_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight  # assign=True replaced the shared parameter
        model.inv_freq = rope_inv_freq(shape).to(device)
        model.requires_grad_(False)
        for layer in model.model.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()
        return model.eval()


def _listed(keys: list[str], limit: int = 8) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")
