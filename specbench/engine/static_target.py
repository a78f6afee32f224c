"""The static engine's target: a Llama-family model on B slots (B = 1 for one sequence), group or per-slot prefill,
one fixed-width verify forward, per-slot ragged commit (docs/engines.md, docs/batching.md).

Each slot holds one request in its own row of a :class:`~specbench.engine.static_cache.StaticKVCache`.
A verify step scores ``(B, W)`` nodes at the step kind's fixed width W (plain 1, chain K + 1, tree
nodes + 1): slot b's nodes go right after its own committed entries and attend to them plus its own
draft (causal for a chain, its tree mask for a tree); padding and idle slots are written beyond the
committed lengths and never attended to by a real node. ``commit`` (host paths) or ``commit_accepted``
(device tensors, nothing read back) keeps a ragged number of accepted nodes per slot. Shapes are fixed
per step kind; attention reads the first K entries of every slot, K the longest slot's span (engine/static_cache.py),
so each (kind, width, span) forward is captured once as a CUDA graph and replayed (engine/graph_capture.py): one
launch instead of ~10 per layer, so a 7B step is bound by its weight reads, not by the host. On CUDA the pointwise
stages are compiled and the one-row matmuls tuned (engine/static_ops.py); ``HFTarget`` stays the reference.
"""

from __future__ import annotations

from collections import Counter
from functools import partial

import torch

from specbench.engine.static_cache import StaticKVCache, attention_span, attention_spans, check_cache_fits
from specbench.engine.step_inputs import SlotInput, VerifiedStep, BatchBuffers, fill_buffers, step_kind
from specbench.engine.group_prefill import DEFAULT_TOKEN_BUDGET, prefill_group, prepare_fused, split_group
from specbench.engine.transfers import host_to_device
from specbench.engine.graph_capture import GraphBackend, StepGraphs
from specbench.engine.prefill_graphs import CapturedPrefill
from specbench.engine.static_llama import EAGER_HINT, StaticLlamaForCausalLM, UnsupportedModel
from specbench.engine.static_loading import module_from_hf_model, module_from_pretrained
from specbench.engine.static_ops import EAGER_OPS, StepOps, compiled_ops, compiled_prefill_ops
from specbench.engine.target import TargetOutput


class StaticTarget:
    """B slots over one :class:`StaticLlamaForCausalLM` (Llama, Mistral, Qwen2); ``batch_size`` 1 serves one sequence."""

    def __init__(self, module: StaticLlamaForCausalLM, config, batch_size: int = 1, *, max_context: int | None = None,
                 source: str = "model", compile: bool | None = None, ops: StepOps | None = None,
                 cuda_graphs: bool = True, graph_backend: GraphBackend | None = None, prefill_graphs: bool = True,
                 fused_prefill: bool = False):
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1 (slots decoded together), got {batch_size!r}")
        shape = module.shape
        window = shape.sliding_window
        if window is not None and max_context is not None and max_context > window:
            raise UnsupportedModel(
                f"{source}: {shape.model_type} uses sliding-window attention ({window} tokens), which the static "
                f"engine does not implement; it is exact only while the context fits the window, but max_context "
                f"is {max_context}. Pass max_context <= {window}, or {EAGER_HINT}"
            )
        self.module, self.config, self.batch_size = module, config, batch_size
        self.lm_head, self.embed_tokens = module.lm_head, module.model.embed_tokens
        self.vocab_size, self.hidden_size, self.num_layers = shape.vocab_size, shape.hidden_size, shape.num_layers
        default = shape.max_position_embeddings if window is None else min(shape.max_position_embeddings, window)
        self.max_context = int(max_context or default)
        param = next(module.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.verify_widths: dict[str, Counter] = {}  # kind -> Counter(width -> batched verify calls)
        self._widths: dict[str, int] = {"plain": 1}
        self._buffers: dict[tuple[str, int], BatchBuffers] = {}  # (kind, width) -> its static inputs
        self._cache: StaticKVCache | None = None
        self._step: tuple[str, int, list[int]] | None = None  # the last verify's (kind, width, nodes per slot: 0 idle)
        self._pending = False  # that verify is not committed yet
        self._device_counts: tuple | None = None  # (nodes per slot, the same (B,) on the device) last copied
        # compiled stages and tuned one-row matmuls by default on CUDA (an EAGLE head's too); ``ops``: another's
        compile = self.device.type == "cuda" if compile is None else bool(compile)
        self.ops = ops if ops is not None else (
            compiled_ops(autotune_gemv=self.device.type == "cuda") if compile else EAGER_OPS)
        self.compiled = self.ops.compiled
        # the step graphs: one per (kind, width, span) at this B (``captured``, ``captures``, ``replays`` by key), all
        # in one memory pool; eager on the CPU, with cuda_graphs=False, or through ``graph_backend`` (a test's stand-in)
        self.graphs = StepGraphs.for_device(self.device, cuda_graphs, graph_backend)
        self.cuda_graphs = self.graphs.enabled
        self.aux_layers: tuple[int, ...] = ()
        self.prefill_token_budget = DEFAULT_TOKEN_BUDGET  # padded tokens per group-prefill forward (prefill_many)
        # a group prefill's stages: eager, or fused in compile caches of their own (engine/group_prefill.py)
        self.fused_prefill = fused_prefill
        self._prefill_ops = compiled_prefill_ops() if fused_prefill else EAGER_OPS
        self._fused_prepared = False  # compiled once: later runs' admissions reuse the symbolic stages
        # one prompt's prefill replayed per padded width on CUDA (engine/prefill_graphs.py); its own graphs and pool
        self.prefill_graphs = CapturedPrefill(module, StepGraphs.for_device(self.device, self.cuda_graphs and prefill_graphs))

    @property
    def capture_seconds(self) -> float:
        """Warm-up + capture time of the step graphs and the prefill graphs, reported apart from decoding speed."""
        return self.graphs.capture_seconds + self.prefill_graphs.graphs.capture_seconds

    @classmethod
    def from_hf_model(cls, model, max_context: int | None = None, **options) -> "StaticTarget":
        """Over a transformers Llama / Mistral / Qwen2 causal LM (engine/static_loading.py); ``options`` as __init__."""
        return cls(module_from_hf_model(model), model.config, max_context=max_context, source=type(model).__name__,
                   **options)

    @classmethod
    def from_pretrained(cls, ref, *, dtype: torch.dtype = torch.float32, device="cpu", **options) -> "StaticTarget":
        """Load a checkpoint directory (or any reference ``resolve_model_dir`` accepts) without transformers' model code."""
        module, config, source = module_from_pretrained(ref, dtype=dtype, device=device)
        return cls(module, config, source=source, **options)

    def with_batch_size(self, batch_size: int, **options) -> "StaticTarget":
        """Another target over this one's module (weights shared, nothing copied) with ``batch_size`` slots, its max
        context, its compiled stages, aux layers and graph setting unless ``options`` (as __init__) say otherwise."""
        options = {"cuda_graphs": self.cuda_graphs, "ops": self.ops, **options}
        other = type(self)(self.module, self.config, batch_size, max_context=self.max_context, **options)
        if self.aux_layers:  # an EAGLE-3 proposer already asked this target for its features
            other.set_aux_layers(self.aux_layers)
        return other

    def set_aux_layers(self, layers: tuple[int, ...]) -> None:
        """Also return the residual streams entering ``layers`` (EAGLE-3's features, ``TargetOutput.aux_hidden_states``)."""
        layers = tuple(int(i) for i in layers)
        bad = [i for i in layers if not 0 <= i < self.num_layers]
        if bad:
            raise ValueError(f"aux layers {bad} out of range: the target has {self.num_layers} layers")
        self.aux_layers = layers
        self.graphs.drop()  # their outputs change
        self.prefill_graphs.drop()
        for buffers in self._buffers.values():
            buffers.outputs = None  # the aux output's width changed

    # -- cache ---------------------------------------------------------------------------------------

    @property
    def cache_capacity(self) -> int:
        return 0 if self._cache is None else self._cache.capacity

    def cache_length(self, slot: int) -> int:
        return 0 if self._cache is None else self._cache.host_lengths[slot]

    def reserve(self, num_tokens: int, max_draft_tokens: int = 0) -> None:
        """Size every slot for ``num_tokens`` cache entries and steps of up to ``max_draft_tokens`` draft nodes.
        Checks the memory first (an error naming bytes needed and free); a larger size drops every slot's cache."""
        if num_tokens > self.max_context:
            raise ValueError(
                f"context length exceeded: {num_tokens} tokens requested > the target's max context {self.max_context}"
            )
        if self._cache is None or self._cache.capacity < num_tokens:
            s = self.module.shape
            check_cache_fits(self.batch_size, s.num_layers, s.num_kv_heads, num_tokens, s.head_dim, self.dtype, self.device)
            self.graphs.drop()  # graphs read the old cache's addresses
            self._cache = None  # free the old cache before allocating its successor
            self._cache = StaticKVCache(self.batch_size, s.num_layers, s.num_kv_heads, num_tokens, s.head_dim,
                                         dtype=self.dtype, device=self.device)
            self._pending = False
        if max_draft_tokens > 0:
            self._widths["chain"] = self._widths["tree"] = max_draft_tokens + 1

    def prepare_prefills(self, lengths) -> None:
        """Capture the one-prompt prefill graphs prompts of these ``lengths`` will replay (CUDA graphs on) and compile
        a fused group prefill (the first time), before anything is timed; a no-op without either, or once done."""
        self._check_ready("prepare_prefills")
        self.prefill_graphs.prepare(lengths, self._cache.kv, self.aux_layers)
        if not self._fused_prepared:
            self._fused_prepared = prepare_fused(self.module, self._cache, self._prefill_ops, lengths,
                                                 self.prefill_token_budget, self.aux_layers)

    @torch.inference_mode()
    def release(self, slot: int) -> None:
        """Free a finished slot: its length returns to 0, so its idle padding stays inside the cache."""
        self._cache.reset_slot(slot)

    @torch.inference_mode()
    def truncate(self, lengths: dict[int, int]) -> None:
        """Drop committed entries beyond ``lengths[slot]`` in each given slot (a draft model's rejected tokens), in
        one host-to-device copy of every slot's length; the other slots keep theirs."""
        self._check_ready("truncate")
        new = list(self._cache.host_lengths)
        for slot, length in lengths.items():
            if not 0 < length <= new[slot]:
                raise ValueError(f"truncate slot {slot} to {length}: needs a committed cache of at least that many "
                                 f"tokens (holds {new[slot]})")
            new[slot] = length
        self._cache.lengths.copy_(host_to_device(new, self.device))  # (B,)
        self._cache.host_lengths = new

    # -- forwards ------------------------------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, slot: int, input_ids: torch.Tensor) -> TargetOutput:
        """Run a prompt ``(T,)`` into slot ``slot`` alone (the others are untouched): its bucket's prefill graph where
        it fits (CUDA: a replay, not ~1,000 launches), else eagerly as a group of one."""
        ids = self._prefill_ids(input_ids)  # (T,)
        if not self.prefill_graphs.fits(ids.numel(), self._cache.capacity):
            return prefill_group(self.module, self._cache, [slot], [ids], self.aux_layers)[0]
        self._cache.reset_slot(slot)
        out = self.prefill_graphs.run(ids, self._cache.kv, slot, self.aux_layers)
        self._cache.advance_slot(slot, ids.numel())
        return out

    @torch.inference_mode()
    def prefill_many(self, slots: list[int], prompts: list[torch.Tensor]) -> list[TargetOutput]:
        """Prefill ``prompts[i]`` ``(T_i,)`` into ``slots[i]`` (distinct), the others untouched: one forward per group
        of at most ``prefill_token_budget`` padded tokens (engine/group_prefill.py); one prompt goes through
        :meth:`prefill`. Outputs in the order given, as :meth:`prefill` returns them."""
        if len(slots) != len(prompts) or len(set(slots)) != len(slots):
            raise ValueError(f"prefill_many takes distinct slots, one per prompt; got slots {slots} for "
                             f"{len(prompts)} prompts")
        ids = [self._prefill_ids(p) for p in prompts]
        outputs: list[TargetOutput] = []
        for group in split_group([x.numel() for x in ids], self.prefill_token_budget):
            if len(group) == 1:  # alone (the whole admission, or what a split left): its prefill graph
                outputs.append(self.prefill(slots[group[0]], ids[group[0]]))
            else:
                outputs += prefill_group(self.module, self._cache, [slots[i] for i in group], [ids[i] for i in group],
                                         self.aux_layers, self._prefill_ops)
        return outputs

    def _prefill_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """A prompt ``(T,)`` on the device, checked against the cache (reserved, no verify pending, room for T)."""
        self._check_ready("prefill")
        ids = input_ids.to(self.device).flatten()  # (T,)
        if not 0 < ids.numel() <= self._cache.capacity:
            raise ValueError(f"a prompt of {ids.numel()} tokens does not fit a slot of {self._cache.capacity} cache "
                             "entries (at least one token is needed); reserve() more room or shorten the prompt")
        return ids

    @torch.inference_mode()
    def verify(self, inputs: list[SlotInput | None]) -> TargetOutput:
        """Score every slot's verify input in one forward; ``inputs[b]`` None marks an idle slot. Returns logits
        ``(B, W, V)``, hidden states ``(B, W, H)`` (and aux ``(B, W, A * H)``); row b's first N_b nodes are real."""
        self._check_ready("verify")
        if len(inputs) != self.batch_size:
            raise ValueError(f"verify takes one entry per slot ({self.batch_size}), got {len(inputs)}")
        kind = step_kind(inputs)
        counts = [0 if x is None else len(x) for x in inputs]
        width = self._width_for(kind, max(counts))
        self._check_room(kind, counts, width)
        buffers = fill_buffers(self._buffers[(kind, width)], kind, inputs, self.device)
        # attend over the longest slot's entries, rounded up to its span, not the whole cache (docs/batching.md)
        span = attention_span(max(self._cache.host_lengths) + width, self._cache.capacity)
        logits, hidden, aux = self._run(kind, width, span, buffers)  # (B * W, V), (B * W, H), (B * W, A * H) or None
        self._step, self._pending = (kind, width, counts), True
        self.verify_widths.setdefault(kind, Counter())[width] += 1
        copied = self.graphs.enabled  # the next replay overwrites the graph's outputs: hand out copies
        batch = self.batch_size
        out = [None if t is None else (t.clone() if copied else t).view(batch, width, -1) for t in (logits, hidden, aux)]
        return TargetOutput(logits=out[0], hidden_states=out[1], aux_hidden_states=out[2])

    def _run(self, kind: str, width: int, span: int, buffers: BatchBuffers) -> tuple:
        """The (kind, width) step over the first ``span`` cache entries: its graph of key (kind, width, span) replayed
        (captured first when new), or the forward eagerly without graphs. Every span's graph writes the same outputs."""
        if self.graphs.enabled and buffers.outputs is None:
            rows, hidden = self.batch_size * width, self.hidden_size
            buffers.outputs = (torch.empty(rows, self.vocab_size, dtype=torch.float32, device=self.device),
                               torch.empty(rows, hidden, dtype=self.dtype, device=self.device),
                               torch.empty(rows, len(self.aux_layers) * hidden, dtype=self.dtype, device=self.device)
                               if self.aux_layers else None)
        return self.graphs.run((kind, width, span), buffers, partial(self._forward, span=span))

    def _forward(self, buffers: BatchBuffers, span: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """One fixed-shape batched verify forward over the static buffers and the first ``span`` entries of the cache:
        the region a CUDA graph captures (device ops only: no host reads, no host-to-device copies, no branching on
        tensor values). With graphs its outputs are copied into the (kind, width)'s shared output buffers."""
        cache = self._cache
        width = buffers.ids.shape[1]
        positions = cache.lengths[:, None] + buffers.depths  # (B, W)
        mask = cache.attention_mask(buffers.tree, span)  # (B, W, K) K = span
        hidden, aux = self.module(buffers.ids.flatten(), positions.flatten(), cache.new_slots(width), mask, cache.kv,
                                  self.ops, aux_layers=self.aux_layers)  # (B * W, H), (B * W, A * H) or None
        out = (self.module.logits(hidden, self.ops), hidden, aux)  # (B * W, V), (B * W, H), (B * W, A * H) or None
        if buffers.outputs is None:
            return out
        for shared, value in zip(buffers.outputs, out):
            if shared is not None:
                shared.copy_(value)
        return buffers.outputs

    @torch.inference_mode()
    def prepare_steps(self, shortest: int = 1, kinds: tuple[str, ...] = ("plain", "chain", "tree")) -> None:
        """Capture every step graph a run can replay, before anything is timed (CUDA graphs on; a no-op without them
        or for keys already captured): each of ``kinds``' width (plain, and chain and tree once reserved) at every
        attention span from a slot of ``shortest`` entries (the shortest prompt) up to the whole cache. A capture's
        forward writes only beyond each slot's committed entries, where every verify writes."""
        self._check_ready("prepare_steps")
        if not self.graphs.enabled:
            return
        capacity = self._cache.capacity
        for kind, width in sorted((k, w) for k, w in self._widths.items() if k in kinds):
            if max(self._cache.host_lengths) + width > capacity:
                raise ValueError(f"prepare_steps needs {width} free entries beyond every slot's committed ones "
                                 f"({max(self._cache.host_lengths)} of {capacity} used); call it between runs")
            self._width_for(kind, width)  # its buffers
            buffers = self._buffers[(kind, width)]
            for span in attention_spans(shortest + width, capacity):
                if (kind, width, span) not in self.graphs:
                    self._run(kind, width, span, buffers)

    def verified_step(self) -> VerifiedStep:
        """The last verify's ids, ancestor masks, node counts and depths on the device (the counts in one async copy)."""
        if self._step is None:
            raise ValueError("verified_step before any verify")
        kind, width, counts = self._step
        buffers = self._buffers[(kind, width)]
        if self._device_counts is None or self._device_counts[0] != counts:  # steady steps: the same counts
            self._device_counts = (counts, host_to_device(counts, self.device))  # (B,)
        return VerifiedStep(buffers.ids, buffers.tree, self._device_counts[1], buffers.depths, chain=kind != "tree")

    def _check_ready(self, call: str) -> None:
        """Refuse ``call`` before reserve() sized the cache, or between a verify and its commit."""
        if self._cache is None:
            raise ValueError(f"{call} before reserve(): size the batched cache first")
        if self._pending:
            raise ValueError(f"{call} between a verify and its commit; call commit() first")

    def _width_for(self, kind: str, n: int) -> int:
        """The kind's fixed width: reserved, or set by its first step; a wider step widens it (a second shape)."""
        width = self._widths.get(kind, 0)
        if n > width:
            width = self._widths[kind] = n
        if (kind, width) not in self._buffers:
            self._buffers[(kind, width)] = BatchBuffers.allocate(self.batch_size, width, self.device)
        return width

    def _check_room(self, kind: str, counts: list[int], width: int) -> None:
        capacity = self._cache.capacity
        for slot, (n, cached) in enumerate(zip(counts, self._cache.host_lengths)):
            if cached + width > capacity:
                raise ValueError(
                    f"context length exceeded in slot {slot}: {cached} cached tokens + a {kind} step of {n} nodes "
                    f"(padded to its fixed width {width}) = {cached + width} > the slot's {capacity} cache entries; "
                    "lower max_new_tokens or reserve() more room"
                )

    @torch.inference_mode()
    def commit(self, accepted: list[list[int] | None]) -> None:
        """Keep each slot's ``accepted[b]`` nodes (ascending, root first; None for an idle slot) contiguously after
        its committed entries: a chain path advances the slot's length, any other path is gathered first."""
        if not self._pending:
            raise ValueError("commit without a verify to commit")
        kind, width, counts = self._step
        if len(accepted) != self.batch_size:
            raise ValueError(f"commit takes one entry per slot ({self.batch_size}), got {len(accepted)}")
        kept = []
        for slot, (path, n) in enumerate(zip(accepted, counts)):
            if (path is None) != (n == 0):
                raise ValueError(f"slot {slot}: commit {path} after a verify of {n} nodes (None is for idle slots)")
            if path is not None and (path != sorted(set(path)) or not path or path[0] != 0 or path[-1] >= n):
                raise ValueError(f"slot {slot}: accepted nodes must be ascending distinct indices below {n}, root first; "
                                 f"got {path}")
            kept.append(0 if path is None else len(path))
        moved = any(path is not None and path != list(range(len(path))) for path in accepted)
        source = None
        if moved:
            rows = [list(range(width)) if p is None else p + list(range(len(p), width)) for p in accepted]
            source = host_to_device(rows, self.device)  # (B, W) the identity beyond each path
        self.commit_accepted(host_to_device(kept, self.device), source, lambda: kept)

    @torch.inference_mode()
    def truncate_to(self, keep: torch.Tensor, bounds: dict[int, int]) -> None:
        """``truncate`` from the device, for a step queued ahead of the host's reads: slot b keeps at most ``keep[b]``
        ``(B,)`` entries, and the host mirror of each slot in ``bounds`` becomes ``bounds[b]``, an upper bound."""
        self._cache.lengths.clamp_(max=keep)  # (B,)
        for slot, bound in bounds.items():
            self._cache.host_lengths[slot] = bound

    def settle(self, surplus: dict[int, int]) -> None:
        """Lower slot b's host length by ``surplus[b]``: a commit queued ahead of its readback advanced it by an upper
        bound of the nodes kept, which the readback now knows (docs/engines.md#steps-queued-ahead)."""
        for slot, extra in surplus.items():
            self._cache.host_lengths[slot] -= extra

    @torch.inference_mode()
    def commit_accepted(self, kept: torch.Tensor, source: torch.Tensor | None, host_kept) -> None:
        """Commit from device tensors, nothing read back: ``kept`` ``(B,)`` nodes per slot (0 idle), ``source``
        ``(B, P)`` each slot's accepted nodes ascending then the identity (None: every path is a prefix, nothing
        moves; P >= the longest path). The device work is queued first, then ``host_kept()`` (the host's list of
        ``kept``, e.g. the step's readback, or upper bounds that :meth:`settle` lowers later) advances the host
        mirror of the lengths."""
        if not self._pending:
            raise ValueError("commit without a verify to commit")
        if source is not None:
            self._cache.gather_new(source)  # (B, P)
        self._cache.advance(kept, host_kept)
        self._pending = False
