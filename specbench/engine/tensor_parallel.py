"""Tensor parallelism for the static Llama: heads and MLP columns split over ranks, one draft for all (docs/tensor_parallel.md).

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
from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from specbench.compile_watch import capture_seconds
from specbench.engine.draft import Draft
from specbench.engine.proposer import Proposer, ProposerState
from specbench.engine.slot_proposer import PerSlotProposer, SlotProposer
from specbench.engine.static_llama import Attention, LlamaShape, MLP, StaticLlamaForCausalLM
from specbench.engine.static_target import StaticTarget


class NotShardable(ValueError):
    """A model whose heads or MLP width do not divide over the requested tensor-parallel size."""


@dataclass(frozen=True)
class TensorParallelInfo:
    """What a sharded module records about its sharding: the group's size, this rank, the unsharded shape."""

    world_size: int
    rank: int
    full_shape: LlamaShape


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


def _shard(tensor: torch.Tensor, mesh: DeviceMesh, dim: int) -> torch.Tensor:
    """This rank's contiguous 1/N of ``tensor`` along ``dim``, cut from rank 0's copy."""
    source = tensor.detach().to(mesh.device_type).contiguous()
    local = distribute_tensor(source, mesh, [Shard(dim)], src_data_rank=0).to_local()
    return local.to(tensor.device).contiguous()


def _replicate(tensor: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    """Rank 0's copy of a replicated tensor on every rank (the weights are then the same bits everywhere)."""
    source = tensor.detach().to(mesh.device_type).contiguous()
    return distribute_tensor(source, mesh, [Replicate()], src_data_rank=0).to_local().to(tensor.device)


def _column_parallel(linear: nn.Linear, mesh: DeviceMesh) -> None:
    """Keep this rank's output rows (weight ``(out / N, in)``, bias ``(out / N,)``)."""
    linear.weight = nn.Parameter(_shard(linear.weight, mesh, 0), requires_grad=False)
    if linear.bias is not None:
        linear.bias = nn.Parameter(_shard(linear.bias, mesh, 0), requires_grad=False)
    linear.out_features = linear.weight.shape[0]


def _row_parallel(linear: nn.Linear, mesh: DeviceMesh) -> None:
    """Keep this rank's input columns (weight ``(out, in / N)``); the bias is added once, by rank 0, so the
    all-reduced sum carries it exactly once."""
    linear.weight = nn.Parameter(_shard(linear.weight, mesh, 1), requires_grad=False)
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
    embed.weight = nn.Parameter(_replicate(embed.weight, mesh), requires_grad=False)
    if module.shape.tie_word_embeddings:
        module.lm_head.weight = embed.weight
    else:
        module.lm_head.weight = nn.Parameter(_replicate(module.lm_head.weight, mesh), requires_grad=False)
    norms = [module.model.norm] + [n for layer in module.model.layers
                                   for n in (layer.input_layernorm, layer.post_attention_layernorm)]
    for norm in norms:
        norm.weight = nn.Parameter(_replicate(norm.weight, mesh), requires_grad=False)


def shard_static_llama(module: StaticLlamaForCausalLM, mesh: DeviceMesh | None = None) -> StaticLlamaForCausalLM:
    """Shard ``module`` in place over ``mesh`` (1-D; default: the whole default process group) and return it.
    Every rank must call this with the same (loaded) module; afterwards ``module.shape`` is the local shape."""
    mesh = default_mesh() if mesh is None else mesh
    world_size, full = mesh.size(), module.shape
    check_shardable(full, world_size)
    if getattr(module, "tensor_parallel", None) is not None:
        raise ValueError(f"the module is already sharded over {module.tensor_parallel.world_size} ranks")
    for layer in module.model.layers:
        _shard_attention(layer.self_attn, mesh, world_size)
        _shard_mlp(layer.mlp, mesh)
    _replicate_rest(module, mesh)
    module.shape = local_shape(full, world_size)
    module.tensor_parallel = TensorParallelInfo(world_size, mesh.get_local_rank(), full)
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

    @property
    def world_size(self) -> int:
        return self.module.tensor_parallel.world_size

    @property
    def rank(self) -> int:
        return self.module.tensor_parallel.rank


def _draft_payload(draft: Draft | None) -> dict | None:
    """A draft as host tensors and flags (what rank 0 broadcasts); None for a plain step."""
    if draft is None:
        return None
    host = lambda t: None if t is None else t.detach().cpu()  # noqa: E731
    return {"tokens": host(draft.tokens), "parents": host(draft.parents), "draft_probs": host(draft.draft_probs),
            "precomputed_depths": host(draft.precomputed_depths),
            "precomputed_tree_mask": host(draft.precomputed_tree_mask),
            "precomputed_is_chain": draft.precomputed_is_chain, "precomputed_depth": draft.precomputed_depth}


def _draft_from_payload(payload: dict | None, device: torch.device) -> Draft | None:
    if payload is None:
        return None
    moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in payload.items()}
    for key in ("precomputed_depths", "precomputed_tree_mask"):  # host-side shape buffers, as Draft builds them
        moved[key] = payload[key]
    return Draft(**moved)


class RankZeroProposer(Proposer):
    """``inner`` (a per-sequence proposer, or a slot proposer of one slot) proposes on rank 0 only; its draft is
    broadcast so every rank verifies the same one. Every other call (reserve, begin_request, max_draft_tokens) runs
    on every rank, so the decode loops agree."""

    def __init__(self, inner: Proposer | SlotProposer, group=None, device: torch.device | str = "cpu"):
        self.inner = inner
        self.slot = inner if isinstance(inner, SlotProposer) else PerSlotProposer([inner])  # drafts for slot 0
        self.group = group
        self.device = torch.device(device)
        self.name = inner.name
        self.needs_hidden_states = inner.needs_hidden_states
        self.rank = dist.get_rank(group)
        self.drafts_received = 0  # drafts this rank verified that rank 0 proposed (tests read it)

    @classmethod
    def from_options(cls, target, **options) -> "RankZeroProposer":
        raise TypeError("wrap a built proposer: RankZeroProposer(proposer, group, device)")

    @property
    def max_draft_tokens(self) -> int:
        return self.inner.max_draft_tokens

    @property
    def capture_seconds(self) -> float:
        """The wrapped proposer's graph capture so far (rank 0's; a run checks that none happened while timed)."""
        return capture_seconds(self.inner)

    def reserve(self, num_tokens: int) -> None:
        if self.rank == 0:  # the other ranks never draft: no cache to size, no drafting graphs to capture
            self.inner.reserve(num_tokens)

    def begin_request(self, prompt_ids: torch.Tensor) -> None:
        self.slot.begin_request(0, prompt_ids)

    def propose(self, state: ProposerState) -> Draft | None:
        length = state.token_ids.numel()  # host-known: checks the ranks are in step without a device sync
        draft = self.slot.propose({0: state})[0] if self.rank == 0 else None
        message = [(length, _draft_payload(draft)) if self.rank == 0 else None]
        dist.broadcast_object_list(message, group_src=0, group=self.group, device=_object_device(self.device))
        if self.rank == 0:
            return draft  # its own tensors: a static tree keeps its identity (the target skips rewriting buffers)
        source_length, payload = message[0]
        if source_length != length:
            raise RuntimeError(
                f"tensor-parallel ranks diverged: rank 0 drafts after {source_length} tokens, rank {self.rank} is at "
                f"{length}; their logits differ (a missing all-reduce, or ranks fed different prompts)"
            )
        self.drafts_received += payload is not None
        return _draft_from_payload(payload, self.device)

    def describe(self) -> dict:
        return self.inner.describe()


def _object_device(device: torch.device) -> torch.device | None:
    """Where broadcast_object_list stages its bytes: the rank's GPU under NCCL, the host under gloo."""
    return device if device.type == "cuda" else None
