"""The eager reference target over any transformers causal LM (the universal path): one slot of the static target's
protocol (engine/static_target.py), so the one decode loop drives both (docs/engines.md#the-reference).

Verification calls the model's decoder directly so the final hidden states (after the final
norm) and the logits come from one forward; trees use a 4D additive attention mask and per-node
position ids over the cached prefix.

On CUDA, forwards run with PyTorch's cuDNN attention backend switched off (flash, memory-efficient
and math stay): cuDNN SDPA builds an execution plan for every new (query length, key length) pair,
55-70 ms each, and speculative decoding presents a new pair nearly every step (the cache grows by a
varying number of accepted tokens). Measured on the H200 (torch 2.11, 7B shape, bf16): a K=3 oracle
chain at full acceptance took 100 ms a step cold against 23 ms once every shape had been seen.
"""

from __future__ import annotations

import contextlib
import inspect

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import DynamicCache, PreTrainedModel

from specbench.engine.step_inputs import SlotInput, VerifiedStep
from specbench.engine.target import TargetOutput
from specbench.engine.transfers import host_to_device


def cache_argument(forward) -> str:
    """The keyword a transformers ``forward`` takes its KV cache by: transformers 5.x renamed
    ``past_key_values`` to ``cache``; ask the signature instead of pinning a minor version."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


# every backend but cuDNN attention (see the module docstring)
VARIABLE_SHAPE_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class HFTarget:
    """Wrap a transformers ``*ForCausalLM`` (Llama family and any model with a plain decoder + lm_head)."""

    def __init__(self, model: PreTrainedModel, max_context: int | None = None):
        self.model = model.eval()
        self.config = model.config
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        if self.lm_head is None:
            raise ValueError(f"{type(model).__name__} has no output embeddings (lm_head); a causal LM is required")
        self.vocab_size, self.hidden_size = map(int, self.lm_head.weight.shape)  # (V, H)
        self.embed_tokens = model.get_input_embeddings()
        self.max_context = int(max_context or getattr(self.config, "max_position_embeddings", 2048))
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self._softcap = getattr(self.config, "final_logit_softcapping", None)
        self.cache: DynamicCache | None = None
        self._cache_kwarg = cache_argument(self.decoder.forward)
        # transformers 5.x also dropped `cache_position`
        self._takes_cache_position = "cache_position" in inspect.signature(self.decoder.forward).parameters
        self.aux_layers: tuple[int, ...] = ()  # set_aux_layers: residual streams to return beside the final ones

    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    def set_aux_layers(self, layers: tuple[int, ...]) -> None:
        """Also return the residual streams entering ``layers`` (``TargetOutput.aux_hidden_states``)."""
        layers = tuple(int(i) for i in layers)
        bad = [i for i in layers if not 0 <= i < self.num_layers]
        if bad:
            raise ValueError(f"aux layers {bad} out of range: the target has {self.num_layers} layers")
        self.aux_layers = layers

    def _aux(self, out) -> torch.Tensor | None:
        """(N, A * H) from a forward run with output_hidden_states: hidden_states[i] is what enters layer i."""
        if not self.aux_layers:
            return None
        return torch.cat([out.hidden_states[i][0] for i in self.aux_layers], dim=-1)

    def _attention_backends(self):
        """Context for a forward: no cuDNN attention on CUDA (a plan build per new shape)."""
        return sdpa_kernel(VARIABLE_SHAPE_SDPA_BACKENDS) if self.device.type == "cuda" else contextlib.nullcontext()

    batch_size = 1  # one sequence: the loop's slot 0
    cuda_graphs = False  # transformers' own forwards, eager
    capture_seconds = 0.0

    @property
    def cache_length(self) -> int:
        return 0 if self.cache is None else self.cache.get_seq_length()

    def reserve(self, num_tokens: int, max_draft_tokens: int = 0) -> None:
        """Nothing to size: the dynamic cache grows with the request."""

    def prepare_prefills(self, lengths) -> None:
        """Nothing to capture: transformers' own forward runs each prefill."""

    def prepare_steps(self, shortest: int = 1, kinds: tuple[str, ...] = ()) -> None:
        """Nothing to capture: transformers' own forward runs each step."""

    def release(self, slot: int) -> None:
        """The request in the slot ended: its cache goes with the next prefill."""

    def truncate(self, lengths: dict[int, int]) -> None:
        """Drop committed cache entries beyond ``lengths[0]`` (benchmarks re-verify from one cache state)."""
        excess = self.cache_length - lengths.get(0, self.cache_length)
        if excess > 0:  # a negative count removes that many in every transformers 5 release
            self.cache.crop(-excess)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden).float()  # (N, V)
        if self._softcap:
            logits = torch.tanh(logits / self._softcap) * self._softcap
        return logits

    @torch.inference_mode()
    def prefill(self, slot: int, input_ids: torch.Tensor) -> TargetOutput:
        """Run the prompt ``(T,)`` into a new cache: the last position's logits ``(1, V)`` and every position's
        hidden states ``(T, H)`` (feature-reading proposers such as EAGLE need them)."""
        if slot != 0:
            raise ValueError(f"HFTarget holds one sequence (slot 0), got slot {slot}; batch on the static engine")
        self.cache = DynamicCache(config=self.config)
        ids = input_ids.to(self.device).view(1, -1)  # (1, T)
        with self._attention_backends():
            out = self.decoder(input_ids=ids, use_cache=True, output_hidden_states=bool(self.aux_layers),
                               **{self._cache_kwarg: self.cache})
        hidden = out.last_hidden_state[0]  # (T, H)
        return TargetOutput(logits=self._logits(hidden[-1:]), hidden_states=hidden,  # only the last predicts
                            aux_hidden_states=self._aux(out))

    def prefill_many(self, slots: list[int], prompts: list[torch.Tensor]) -> list[TargetOutput]:
        return [self.prefill(slot, prompt) for slot, prompt in zip(slots, prompts)]

    @torch.inference_mode()
    def verify(self, inputs: list[SlotInput | None]) -> TargetOutput:
        """Score slot 0's ``[root, *draft]`` ``(N,)`` placed after the cache in one forward: logits ``(1, N, V)``,
        hidden states ``(1, N, H)`` (aux ``(1, N, A * H)``), as the static target returns them at B = 1."""
        if len(inputs) != 1 or inputs[0] is None:
            raise ValueError(f"HFTarget verifies one live slot, got {len(inputs)} inputs")
        x = inputs[0]
        on_device = lambda t: (t if torch.is_tensor(t) else host_to_device(t, self.device)).to(self.device)  # noqa: E731
        ids = on_device(x.ids).flatten() if x.tail is None else torch.cat([on_device(x.ids), on_device(x.tail)])  # (N,)
        depths = on_device(x.depths).flatten()  # (N,)
        n, past = ids.numel(), self.cache_length
        tree = x.tree_mask.to(self.device) if x.tree_mask is not None else torch.ones(
            n, n, dtype=torch.bool, device=self.device).tril_()  # (N, N) a chain: causal among the new tokens
        self._step = (ids, tree, depths, x.tree_mask is None)
        # an explicit 4D mask is used as given by every transformers 5 attention path, so chains and
        # trees take the same route whatever the library's own causal-mask logic does
        allowed = torch.ones(n, past + n, dtype=torch.bool, device=self.device)  # (N, past + N)
        allowed[:, past:] = tree
        attention_mask = torch.zeros(1, 1, n, past + n, dtype=self.dtype, device=self.device)
        attention_mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)  # additive (1, 1, N, past + N)
        extra = {self._cache_kwarg: self.cache}
        if self._takes_cache_position:
            extra["cache_position"] = torch.arange(past, past + n, device=self.device)  # (N,) slots written
        with self._attention_backends():
            out = self.decoder(
                input_ids=ids.view(1, n), position_ids=(past + depths).view(1, n),
                attention_mask=attention_mask, use_cache=True, output_hidden_states=bool(self.aux_layers), **extra
            )
        hidden = out.last_hidden_state[0]  # (N, H)
        aux = self._aux(out)
        return TargetOutput(logits=self._logits(hidden)[None], hidden_states=hidden[None],
                            aux_hidden_states=None if aux is None else aux[None])

    def verified_step(self) -> VerifiedStep:
        """The last verify's ids ``(1, N)``, ancestor mask ``(1, N, N)``, count and depths, as greedy verification
        reads them on the device."""
        ids, tree, depths, chain = self._step
        return VerifiedStep(ids[None], tree[None], torch.tensor([ids.numel()], device=self.device), depths[None],
                            chain=chain)

    def commit_accepted(self, kept: torch.Tensor, source: torch.Tensor | None, host_kept) -> None:
        """The device verdict's commit, read on the host: ``host_kept()[0]`` nodes, ``source[0]`` their indices."""
        count = host_kept()[0]
        self.commit([list(range(count)) if source is None else source[0, :count].tolist()])

    @torch.inference_mode()
    def commit(self, accepted: list[list[int] | None]) -> None:
        """Keep the accepted nodes (verify-input indices, ascending, root first) of the last verify, contiguously."""
        nodes, num_verified = accepted[0], self._step[0].numel()
        past = self.cache_length - num_verified
        kept = len(nodes)
        if nodes == list(range(kept)):
            if kept < num_verified:
                self.cache.crop(-(num_verified - kept))
            return
        for layer in self.cache.layers:
            if type(layer).__name__ != "DynamicLayer":
                raise NotImplementedError(
                    f"tree verification needs plain dynamic KV layers; {type(self.model).__name__} uses "
                    f"{type(layer).__name__} (sliding-window or other); use a chain proposer with this target"
                )
            index = past + torch.tensor(nodes, device=layer.keys.device)  # (A,)
            # keys/values: (1, heads, T, head_dim); the accepted entries move to [past, past + A)
            layer.keys = torch.cat([layer.keys[..., :past, :], layer.keys[..., index, :]], dim=-2)
            layer.values = torch.cat([layer.values[..., :past, :], layer.values[..., index, :]], dim=-2)
