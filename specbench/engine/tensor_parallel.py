"""Tensor parallelism for the static Llama: heads and MLP columns split over ranks (docs/tensor_parallel.md).

Megatron's layout over a ``torch.distributed`` process group of N ranks: each rank keeps ``num_heads / N``
attention heads and ``num_kv_heads / N`` key/value heads (its slice of every q, k and v row-block of the
fused qkv weight), ``intermediate_size / N`` MLP columns (its slice of the gate and the up row-blocks of
the fused gate/up weight), and the matching input columns of ``o_proj`` and ``down_proj``, whose outputs
are partial sums all-reduced once each (two all-reduces per decoder layer). Embeddings, norms and the
lm_head are replicated, so every rank ends a forward with the same hidden states and logits. The shards
are cut by ``torch.distributed.tensor.distribute_tensor`` with ``Shard`` placements from rank 0's weights;
the static engine then runs plain local matmuls on them (its projections go through ``ops.linear`` over
fused weights, never through ``nn.Linear.forward``, so ``parallelize_module``'s styles do not apply).
"""

from __future__ import annotations

import dataclasses
from functools import partial

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from specbench.engine.static_llama import Attention, LlamaShape, MLP, StaticLlamaForCausalLM
from specbench.engine.static_target import StaticTarget


class NotShardable(ValueError):
    """A model whose heads or MLP width do not divide over the requested tensor-parallel size."""


def check_shardable(shape: LlamaShape, world_size: int) -> None:
    """Refuse, naming the sizes, a tensor-parallel size that does not divide the heads, KV heads or MLP width."""
    if world_size < 1:
        raise NotShardable(f"tensor-parallel size must be >= 1, got {world_size}")
    sizes = {"attention heads": shape.num_heads, "key/value heads": shape.num_kv_heads,
             "intermediate_size": shape.intermediate_size}
    bad = [f"{value} {name}" for name, value in sizes.items() if value % world_size]
    if bad:
        divisors = [n for n in range(1, shape.num_kv_heads + 1) if all(v % n == 0 for v in sizes.values())]
        raise NotShardable(
            f"cannot shard a model with {shape.num_heads} attention heads, {shape.num_kv_heads} key/value heads and "
            f"intermediate_size {shape.intermediate_size} over tensor-parallel size {world_size}: {', '.join(bad)} "
            f"do not divide by {world_size}; use a tensor-parallel size that divides all three "
            f"({', '.join(map(str, divisors))})"
        )


def local_shape(shape: LlamaShape, world_size: int) -> LlamaShape:
    """The shape one rank holds: its share of the heads and MLP columns (sizes the per-rank KV cache)."""
    check_shardable(shape, world_size)
    return dataclasses.replace(shape, num_heads=shape.num_heads // world_size,
                               num_kv_heads=shape.num_kv_heads // world_size,
                               intermediate_size=shape.intermediate_size // world_size)


def default_mesh() -> DeviceMesh:
    """A 1-D mesh over the default process group (``specbench.distributed.init_from_env`` sets it up)."""
    if not dist.is_initialized():
        raise RuntimeError("tensor parallelism needs a process group: run under torchrun or "
                           "specbench.distributed.launch, which call specbench.distributed.init_from_env()")
    device_type = "cuda" if dist.get_backend() == "nccl" else "cpu"
    return init_device_mesh(device_type, (dist.get_world_size(),), mesh_dim_names=("tp",))


def _placed(tensor: torch.Tensor, mesh: DeviceMesh, placement: Shard | Replicate) -> nn.Parameter:
    """This rank's part of ``tensor`` cut from rank 0's copy: a contiguous 1/N along a ``Shard``'s dim, or the whole
    tensor (``Replicate``: the same bits on every rank), as a frozen parameter."""
    source = tensor.detach().to(mesh.device_type).contiguous()
    local = distribute_tensor(source, mesh, [placement], src_data_rank=0).to_local()
    return nn.Parameter(local.to(tensor.device).contiguous(), requires_grad=False)


def _column_parallel(linear: nn.Linear, mesh: DeviceMesh) -> None:
    """Keep this rank's output rows (weight ``(out / N, in)``, bias ``(out / N,)``)."""
    linear.weight = _placed(linear.weight, mesh, Shard(0))
    if linear.bias is not None:
        linear.bias = _placed(linear.bias, mesh, Shard(0))
    linear.out_features = linear.weight.shape[0]


def _row_parallel(linear: nn.Linear, mesh: DeviceMesh) -> None:
    """Keep this rank's input columns (weight ``(out, in / N)``); the bias is added once, by rank 0, so the
    all-reduced sum carries it exactly once."""
    linear.weight = _placed(linear.weight, mesh, Shard(1))
    if linear.bias is not None and mesh.get_local_rank() != 0:
        linear.bias = None
    linear.in_features = linear.weight.shape[1]


def _all_reduce(partial_sum: torch.Tensor, group) -> torch.Tensor:
    dist.all_reduce(partial_sum, group=group)  # (W, H) the full sum on every rank, in place
    return partial_sum


def _shard_attention(attention: Attention, mesh: DeviceMesh, world_size: int) -> None:
    for projection in (attention.q_proj, attention.k_proj, attention.v_proj):  # each row-block, not the fused matrix
        _column_parallel(projection, mesh)
    _row_parallel(attention.o_proj, mesh)
    attention.num_heads //= world_size
    attention.num_kv_heads //= world_size
    attention.fuse()  # qkv ((NH + 2 KVH) / N * D, H): this rank's q, k and v heads
    attention.reduce_output = partial(_all_reduce, group=mesh.get_group())


def _shard_mlp(mlp: MLP, mesh: DeviceMesh) -> None:
    for projection in (mlp.gate_proj, mlp.up_proj):
        _column_parallel(projection, mesh)
    _row_parallel(mlp.down_proj, mesh)
    mlp.fuse()  # gate_up (2 I / N, H): this rank's gate columns, then the same up columns
    mlp.reduce_output = partial(_all_reduce, group=mesh.get_group())


def _replicate_rest(module: StaticLlamaForCausalLM, mesh: DeviceMesh) -> None:
    """Embeddings, norms and lm_head: rank 0's values on every rank (one tensor when tied)."""
    embed = module.model.embed_tokens
    embed.weight = _placed(embed.weight, mesh, Replicate())
    if module.shape.tie_word_embeddings:
        module.lm_head.weight = embed.weight
    else:
        module.lm_head.weight = _placed(module.lm_head.weight, mesh, Replicate())
    norms = [module.model.norm] + [n for layer in module.model.layers
                                   for n in (layer.input_layernorm, layer.post_attention_layernorm)]
    for norm in norms:
        norm.weight = _placed(norm.weight, mesh, Replicate())


def shard_static_llama(module: StaticLlamaForCausalLM, mesh: DeviceMesh | None = None) -> StaticLlamaForCausalLM:
    """Shard ``module`` in place over ``mesh`` (1-D; default: the whole default process group) and return it.
    Every rank must call this with the same (loaded) module; afterwards ``module.shape`` is the local shape."""
    mesh = default_mesh() if mesh is None else mesh
    if getattr(module, "tensor_parallel", None) is not None:
        raise ValueError(f"the module is already sharded over {module.tensor_parallel} ranks")
    world_size = mesh.size()
    local = local_shape(module.shape, world_size)  # refuses sizes that do not divide
    for layer in module.model.layers:
        _shard_attention(layer.self_attn, mesh, world_size)
        _shard_mlp(layer.mlp, mesh)
    _replicate_rest(module, mesh)
    module.shape = local
    module.tensor_parallel = world_size  # ranks it is sharded over
    return module


class TensorParallelStaticTarget(StaticTarget):
    """A :class:`StaticTarget` over a sharded module: the same prefill / verify / commit on every rank, its KV
    cache holding only this rank's KV heads ``(layers, 2, kv_heads / N, S, head_dim)``, its logits the same
    on every rank."""

    @classmethod
    def from_pretrained(cls, ref, *, mesh: DeviceMesh | None = None, **options) -> "TensorParallelStaticTarget":
        target = super().from_pretrained(ref, **options)
        shard_static_llama(target.module, mesh)
        return target

    @classmethod
    def from_hf_model(cls, model, max_context: int | None = None, *, mesh: DeviceMesh | None = None,
                      **options) -> "TensorParallelStaticTarget":
        target = super().from_hf_model(model, max_context, **options)
        shard_static_llama(target.module, mesh)
        return target
