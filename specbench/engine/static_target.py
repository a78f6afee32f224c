"""A shape-stable :class:`~specbench.engine.target.Target` for the Llama family (``--engine static``).

The KV cache is preallocated and its length kept on the device. Every verify step of one kind (plain:
1 node, chain: K + 1, tree: nodes + 1) is padded to one fixed width, writes that many cache slots and
attends over the whole cache through a boolean mask built on the device, so each kind has a single
shape and can later be captured once as a CUDA graph. Padded nodes land beyond the committed length
and are never attended to. A chain commits by advancing the length; a tree path by a fixed-size
in-place gather of the accepted nodes into contiguous slots. ``HFTarget`` stays the reference.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from specbench.engine.graph_capture import GraphBackend, StepGraphs
from specbench.engine.prefill_graphs import CapturedPrefill
from specbench.engine.static_cache import StaticKVCache
from specbench.engine.static_llama import EAGER_HINT, SUPPORTED_MODEL_TYPES, LlamaShape, StaticLlamaForCausalLM, UnsupportedModel
from specbench.engine.static_ops import EAGER_OPS, compiled_ops
from specbench.engine.target import TargetOutput
from specbench.engine.transfers import host_to_device, tensor_to_device

# cache slots allocated when nothing reserved more (a 128k-context config would otherwise take GBs)
DEFAULT_CACHE_SLOTS = 4096


@dataclass
class _StepBuffers:
    """The static inputs of one step kind; a captured graph would read exactly these."""

    ids: torch.Tensor  # (W,) int64 verify input, padded with token 0
    depths: torch.Tensor  # (W,) int64 position offsets from the cache end, padded with 0
    tree: torch.Tensor  # (W, W) bool; padded rows see only themselves, no real row sees a padded one
    gather: torch.Tensor  # (W,) int64 accepted nodes padded with the identity (tree commits)
    # the draft tensors last written into depths / tree: a static tree hands over the same immutable
    # tensors every step, so rewriting them would be launches for nothing on the hot path
    depths_source: torch.Tensor | None = None
    tree_source: torch.Tensor | None = None

    @classmethod
    def allocate(cls, width: int, device) -> "_StepBuffers":
        return cls(
            ids=torch.zeros(width, dtype=torch.long, device=device),
            depths=torch.zeros(width, dtype=torch.long, device=device),
            tree=torch.ones(width, width, dtype=torch.bool, device=device).tril_(),  # a chain's mask, never rewritten
            gather=torch.arange(width, device=device),
        )


class StaticTarget:
    """Llama / Mistral / Qwen2 on :mod:`specbench.engine.static_llama`, batch size 1, same protocol as HFTarget."""

    def __init__(
        self, module: StaticLlamaForCausalLM, config, *, max_context: int | None = None, source: str = "model",
        cuda_graphs: bool = True, compile: bool | None = None, graph_backend: GraphBackend | None = None,
        prefill_graphs: bool = True,
    ):
        shape = module.shape
        window = shape.sliding_window
        if window is not None and max_context is not None and max_context > window:
            raise UnsupportedModel(
                f"{source}: {shape.model_type} uses sliding-window attention ({window} tokens), which the static "
                f"engine does not implement; it is exact only while the context fits the window, but max_context "
                f"is {max_context}. Pass max_context <= {window}, or {EAGER_HINT}"
            )
        self.module = module
        self.config = config
        self.lm_head = module.lm_head
        self.vocab_size = shape.vocab_size
        default = shape.max_position_embeddings if window is None else min(shape.max_position_embeddings, window)
        self.max_context = int(max_context or default)
        param = next(module.parameters())
        self.device, self.dtype = param.device, param.dtype
        # kind -> Counter(width -> verify calls): one width per kind means one shape per kind
        self.verify_widths: dict[str, Counter] = {}
        self._widths: dict[str, int] = {"plain": 1}
        self._buffers: dict[str, _StepBuffers] = {}
        self._cache: StaticKVCache | None = None
        self._pending: tuple[str, int] | None = None  # (kind, nodes) of the verify awaiting commit
        # each step kind's fixed-width forward is captured once as a CUDA graph and replayed: one launch
        # instead of ~10 per layer, so a 7B step is bound by its weight reads, not by the host
        # (engine/graph_capture.py; ``graph_backend`` replaces CUDA's capture, e.g. a test's stand-in on the CPU)
        self._graphs = StepGraphs.for_device(self.device, cuda_graphs, graph_backend)
        self.cuda_graphs = self._graphs.enabled
        # the prompt's prefill replayed per padded width on CUDA (engine/prefill_graphs.py): eagerly a 7B prefill is
        # ~1,000 launches (16-25 ms on an H200 whatever the prompt length); its own graphs and pool
        self.prefill_graphs = CapturedPrefill(module, StepGraphs.for_device(self.device, self.cuda_graphs and prefill_graphs))
        # A graph replays every kernel the forward launches, and spelled out in eager PyTorch a Llama layer
        # runs ~25 small ones around its four matmuls: on a 7B step they cost ~40% of the weight reads
        # (H200, docs/engines.md). compile fuses each pointwise stage into one kernel (static_ops); the
        # matmuls, attention and cache writes stay as they are, and prefill keeps the eager stages.
        self.compiled = self.device.type == "cuda" if compile is None else bool(compile)
        self._ops = compiled_ops(autotune_gemv=self.device.type == "cuda") if self.compiled else EAGER_OPS
        self.aux_layers: tuple[int, ...] = ()  # set_aux_layers: residual streams to return beside the final ones

    @property
    def capture_seconds(self) -> float:
        """Warm-up + capture time of the step graphs and the prefill graphs, reported apart from decoding speed."""
        return self._graphs.capture_seconds + self.prefill_graphs.graphs.capture_seconds

    @property
    def _captured(self) -> dict:
        """step kind -> its captured graph (empty when the steps run eagerly)."""
        return self._graphs.captured

    @classmethod
    def from_hf_model(
        cls, model, max_context: int | None = None, *, cuda_graphs: bool = True, compile: bool | None = None,
        prefill_graphs: bool = True,
    ) -> "StaticTarget":
        """Over a transformers ``LlamaForCausalLM`` / ``MistralForCausalLM`` / ``Qwen2ForCausalLM``: its weights are
        shared, except q/k/v and gate/up, which are fused into new tensors."""
        shape = LlamaShape.from_config(model.config)
        param = next(model.parameters())
        module = StaticLlamaForCausalLM.from_state_dict(
            shape, model.state_dict(), dtype=param.dtype, device=param.device, source=type(model).__name__
        )
        return cls(module, model.config, max_context=max_context, source=type(model).__name__, cuda_graphs=cuda_graphs,
                   compile=compile, prefill_graphs=prefill_graphs)

    @classmethod
    def from_pretrained(
        cls, ref, *, dtype: torch.dtype = torch.float32, device="cpu", max_context: int | None = None,
        cuda_graphs: bool = True, compile: bool | None = None, prefill_graphs: bool = True,
    ) -> "StaticTarget":
        """Load a checkpoint directory (or any reference ``resolve_model_dir`` accepts) without transformers' model code."""
        from transformers import AutoConfig

        from specbench.checkpoints.resolve import resolve_model_dir
        from specbench.checkpoints.validate import check_finite, check_target_dir, read_json_object

        directory = resolve_model_dir(ref)
        check_target_dir(directory)  # config.json and every weights file whole, one line naming what is not
        raw = read_json_object(directory / "config.json")
        if raw.get("model_type") not in SUPPORTED_MODEL_TYPES:  # before transformers, which may not know it either
            raise UnsupportedModel(
                f"{directory}: the static engine cannot run model_type {raw.get('model_type')!r}; it supports "
                f"{', '.join(SUPPORTED_MODEL_TYPES)}; {EAGER_HINT}"
            )
        config = AutoConfig.from_pretrained(directory, local_files_only=True, trust_remote_code=False)
        shape = LlamaShape.from_config(config)
        module = StaticLlamaForCausalLM.from_state_dict(
            shape, _read_weights(directory), dtype=dtype, device=torch.device(device), source=str(directory)
        )
        check_finite(module.named_parameters(), str(directory), "parameter",
                     "the weights are corrupt or the model diverged: re-download or re-export it")
        return cls(module, config, max_context=max_context, source=str(directory), cuda_graphs=cuda_graphs, compile=compile,
                   prefill_graphs=prefill_graphs)

    def set_aux_layers(self, layers: tuple[int, ...]) -> None:
        """Also return the residual streams entering ``layers`` (``TargetOutput.aux_hidden_states``); the captured
        graphs are dropped, since their outputs change."""
        layers = tuple(int(i) for i in layers)
        bad = [i for i in layers if not 0 <= i < self.module.shape.num_layers]
        if bad:
            raise ValueError(f"aux layers {bad} out of range: the target has {self.module.shape.num_layers} layers")
        self.aux_layers = layers
        self._graphs.drop()
        self.prefill_graphs.drop()

    # -- cache ---------------------------------------------------------------------------------------

    @property
    def cache_length(self) -> int:
        if self._cache is None:
            return 0
        return self._cache.host_length + (self._pending[1] if self._pending else 0)

    @property
    def cache_capacity(self) -> int:
        """KV cache slots allocated (0 before the first request); each capacity is one attention shape."""
        return 0 if self._cache is None else self._cache.capacity

    def reserve(self, num_tokens: int, max_draft_tokens: int = 0) -> None:
        """Size the hot path for requests of ``num_tokens`` cache entries (prompt + max_new_tokens + draft
        room) whose steps verify up to ``max_draft_tokens`` draft nodes. The cache grows, never shrinks
        (each size is a new shape); chain and tree steps take width ``max_draft_tokens + 1`` from now on."""
        if num_tokens > self.max_context:
            raise ValueError(
                f"context length exceeded: {num_tokens} tokens requested > the target's max context {self.max_context}"
            )
        if self._cache is None or self._cache.capacity < num_tokens:
            self._allocate(num_tokens)
        if max_draft_tokens > 0:  # plain requests (room 0) leave the draft kinds' widths alone
            self._widths["chain"] = self._widths["tree"] = max_draft_tokens + 1

    def prepare_prefills(self, lengths) -> None:
        """Capture the prefill graphs prompts of these ``lengths`` will replay (CUDA graphs on), before anything is
        timed (the decode loop calls it after ``reserve``); a no-op without graphs or once captured."""
        if self._cache is None:
            raise ValueError("prepare_prefills before reserve(): size the KV cache first")
        self.prefill_graphs.prepare(lengths, self._cache.kv, self.aux_layers)

    @torch.inference_mode()
    def prepare_steps(self) -> None:
        """Capture the step graph of each kind that is sized (plain always; chain and tree once ``reserve`` gave
        draft room) before anything is timed (graphs on; a no-op without them or once captured): a kind a short
        warm-up never stepped would otherwise be captured inside a timed request. A capture's forward writes only
        beyond the committed entries, where every verify writes; kinds without room there are left to capture at
        their first step."""
        if self._cache is None:
            raise ValueError("prepare_steps before reserve(): size the KV cache first")
        if not self._graphs.enabled or self._pending is not None:
            return  # nothing to capture; or a verify awaits its commit (the next prefill resets it): steps capture lazily
        for kind in ("plain", "chain", "tree"):
            width = self._widths.get(kind, 0)
            if not width or self._cache.host_length + width > self._cache.capacity:
                continue  # not sized, or no room now (its first step captures it, as without preparing)
            self._width_for(kind, width)
            step = self._graphs.captured.get(kind)
            if step is None or step.inputs is not self._buffers[kind]:
                self._step(kind, self._buffers[kind])

    def _allocate(self, capacity: int) -> None:
        s = self.module.shape
        self._graphs.drop()  # graphs read the old cache's addresses
        self._cache = None  # free the old cache before allocating its successor
        self._cache = StaticKVCache(s.num_layers, s.num_kv_heads, capacity, s.head_dim, dtype=self.dtype, device=self.device)
        self._pending = None

    def reset(self) -> None:
        if self._cache is None:
            self._allocate(min(self.max_context, DEFAULT_CACHE_SLOTS))
        self._cache.reset()
        self._pending = None

    # -- forwards ------------------------------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, input_ids: torch.Tensor) -> TargetOutput:
        self.reset()
        ids = input_ids.to(self.device).flatten()  # (T,)
        length = ids.numel()
        if length == 0:
            raise ValueError("prefill needs at least one prompt token")
        if length > self._cache.capacity:
            raise ValueError(
                f"context length exceeded: the prompt has {length} tokens > the static KV cache's "
                f"{self._cache.capacity} slots (max context {self.max_context}); call reserve() or shorten the prompt"
            )
        out = self.prefill_graphs.prefill(ids, self._cache.kv, self.aux_layers)  # graph or eager
        self._cache.advance(length)
        return out

    @torch.inference_mode()
    def verify(self, input_ids: torch.Tensor, depths: torch.Tensor, tree_mask: torch.Tensor | None) -> TargetOutput:
        if self._cache is None or self._cache.host_length == 0:
            raise ValueError("verify needs a prefilled cache; call prefill(prompt) first")
        if self._pending is not None:
            raise ValueError("the previous verify was never committed; call commit() after each verify")
        n = input_ids.numel()
        kind = "tree" if tree_mask is not None else ("plain" if n == 1 else "chain")
        width = self._width_for(kind, n)
        cached = self._cache.host_length
        if cached + width > self._cache.capacity:
            raise ValueError(
                f"context length exceeded: {cached} cached tokens + a {kind} step of {n} nodes (padded to its "
                f"fixed width {width}) = {cached + width} > the static KV cache's {self._cache.capacity} slots "
                f"(max context {self.max_context}); lower max_new_tokens or reserve() more room"
            )
        buffers = self._buffers[kind]
        buffers.ids[n:].zero_()
        buffers.ids[:n].copy_(input_ids.flatten())
        if depths is not buffers.depths_source:  # a chain's are shared by every chain of its length (Draft.chain)
            buffers.depths[n:].zero_()
            buffers.depths[:n].copy_(tensor_to_device(depths.flatten(), self.device))  # a host-held draft's: no sync
            buffers.depths_source = depths
        if kind == "tree" and tree_mask is not buffers.tree_source:
            buffers.tree.zero_().diagonal().fill_(True)  # padded rows: themselves only
            buffers.tree[:n, :n].copy_(tensor_to_device(tree_mask, self.device))
            buffers.tree_source = tree_mask
        logits, hidden, aux = self._step(kind, buffers)  # (W, V), (W, H), (W, A * H) or None
        self._pending = (kind, n)
        self.verify_widths.setdefault(kind, Counter())[width] += 1
        copied = kind in self._graphs  # the next replay overwrites the graph's outputs: hand out copies
        out = [None if t is None else (t[:n].clone() if copied else t[:n]) for t in (logits, hidden, aux)]
        return TargetOutput(logits=out[0], hidden_states=out[1], aux_hidden_states=out[2])

    def _width_for(self, kind: str, n: int) -> int:
        """The kind's fixed width: reserved, or set by its first step; a wider step widens it (and
        ``verify_widths`` shows the second shape)."""
        width = self._widths.get(kind, 0)
        if n > width:
            width = self._widths[kind] = n
        if kind not in self._buffers or self._buffers[kind].ids.numel() != width:
            self._buffers[kind] = _StepBuffers.allocate(width, self.device)
        return width

    def _step(self, kind: str, buffers: _StepBuffers) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The kind's verify forward: a graph replay when graphs are on (captured at the kind's first step, and
        again when the kind's buffers were reallocated)."""
        return self._graphs.run(kind, buffers, self._forward)

    def _forward(self, buffers: _StepBuffers) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """One fixed-shape verify forward over the static buffers: the region a CUDA graph captures."""
        cache = self._cache
        width = buffers.ids.numel()
        positions = cache.length + buffers.depths  # (W,)
        mask = cache.attention_mask(buffers.tree)  # (W, S)
        hidden, aux = self.module(buffers.ids, positions, cache.new_slots(width), mask, cache.kv, self._ops,
                                  aux_layers=self.aux_layers)  # (W, H), (W, A * H) or None
        return self.module.logits(hidden, self._ops), hidden, aux  # (W, V), (W, H), (W, A * H)

    @torch.inference_mode()
    def commit(self, accepted_nodes: list[int], num_verified: int) -> None:
        if self._pending is None:
            raise ValueError("commit without a verify to commit")
        kind, n = self._pending
        if num_verified != n:
            raise ValueError(f"commit of {num_verified} verified nodes, but the last verify scored {n}")
        kept = len(accepted_nodes)
        if not 1 <= kept <= n or accepted_nodes != sorted(set(accepted_nodes)) or accepted_nodes[-1] >= n:
            raise ValueError(f"accepted_nodes must be ascending distinct indices below {n}, root first; got {accepted_nodes}")
        if accepted_nodes != list(range(kept)):  # a chain's path is already contiguous: only the length moves
            buffers = self._buffers[kind]
            width = buffers.gather.numel()
            padded = accepted_nodes + list(range(kept, width))  # the identity beyond the path: fixed size W
            buffers.gather.copy_(host_to_device(padded, buffers.gather.device))  # no stream sync
            self._cache.gather_new(buffers.gather)
        self._cache.advance(kept)
        self._pending = None

    @torch.inference_mode()
    def truncate(self, length: int) -> None:
        """Drop committed cache entries beyond ``length`` (benchmarks re-verify from one cache state)."""
        if self._pending is not None or not 0 < length <= self.cache_length:
            raise ValueError(f"truncate to {length}: needs a committed cache of at least that many tokens (holds {self.cache_length})")
        self._cache.length.fill_(length)
        self._cache.host_length = length


def _read_weights(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint directory: safetensors (single or sharded) or torch pickles (weights_only)."""
    from specbench.checkpoints.tensor_files import CheckpointError, open_tensor_file, shard_map, torch_load_state_dict

    for name in ("model.safetensors.index.json", "model.safetensors", "pytorch_model.bin"):
        if (directory / name).is_file():
            keys, read = open_tensor_file(directory / name)
            return read(keys)
    index = directory / "pytorch_model.bin.index.json"
    if index.is_file():
        state: dict[str, torch.Tensor] = {}
        for shard in sorted(set(shard_map(index, ".bin").values())):
            state.update(torch_load_state_dict(directory / shard))
        return state
    raise CheckpointError(
        f"{directory}: no weights found (model.safetensors, model.safetensors.index.json, pytorch_model.bin "
        "or pytorch_model.bin.index.json)"
    )
