"""One prompt's prefill replayed as a CUDA graph per padded width: an eager prefill of a 7B is ~1,000 kernel launches.

A batched run admits a lone prompt whenever one request ends before the others (its slot is refilled at
once, docs/batching.md#admission), and every slot waits for that prefill. Eagerly it costs the host's
launches, 16-25 ms on the 7B shape whatever the prompt length; replayed from a graph it costs the GPU's
work. The prompt ``(T,)`` is padded to its bucket W (a power of two, at least ``MIN_WIDTH``), run
causally on a scratch cache of its own ``(layers, 2, 1, kv_heads, W, head_dim)``, and its first T entries
are copied into the slot's cache row: the padded rows only attend to earlier rows and are dropped, so each
real row's keys, values and hidden state are those of the eager prefill (up to the rounding of a wider
matmul). One graph per bucket, captured at its first prompt (engine/graph_capture.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from specbench.engine.graph_capture import StepGraphs
from specbench.engine.target import TargetOutput

MIN_WIDTH = 16  # the smallest bucket: short prompts share one graph


def bucket(length: int) -> int:
    """The padded width of a prompt of ``length`` tokens: the next power of two, at least MIN_WIDTH."""
    return max(MIN_WIDTH, 1 << max(length - 1, 0).bit_length())


@dataclass
class _PrefillBuffers:
    """The static inputs of one bucket's graph."""

    ids: torch.Tensor  # (W,) int64 the prompt, padded with token 0
    last: torch.Tensor  # (1,) int64 the prompt's last row: its logits are the step's output
    positions: torch.Tensor  # (W,) 0..W-1: every prompt starts at position 0
    row: torch.Tensor  # (1,) int64 0: the scratch cache's one row
    scratch: torch.Tensor  # (L, 2, 1, KVH, W, D) the prompt's keys and values before they go to the slot

    @classmethod
    def allocate(cls, width: int, kv: torch.Tensor) -> "_PrefillBuffers":
        layers, _, _, kv_heads, _, head_dim = kv.shape
        device = kv.device
        return cls(ids=torch.zeros(width, dtype=torch.long, device=device),
                   last=torch.zeros(1, dtype=torch.long, device=device),
                   positions=torch.arange(width, device=device),
                   row=torch.zeros(1, dtype=torch.long, device=device),
                   scratch=torch.zeros(layers, 2, 1, kv_heads, width, head_dim, dtype=kv.dtype, device=device))


class CapturedPrefill:
    """Prefills of one prompt through ``graphs`` (keys ``("prefill", W)``), for prompts whose bucket fits the cache."""

    def __init__(self, module, graphs: StepGraphs):
        self.module, self.graphs = module, graphs
        self._buffers: dict[int, _PrefillBuffers] = {}

    def fits(self, length: int, capacity: int) -> bool:
        """Graphs are on and the prompt's bucket fits a slot (else the caller prefills eagerly)."""
        return self.graphs.enabled and bucket(length) <= capacity

    def drop(self) -> None:
        """Forget the graphs and their buffers (the aux layers changed: their outputs do)."""
        self.graphs.drop()
        self._buffers.clear()

    def prepare(self, lengths, kv: torch.Tensor, aux_layers: tuple[int, ...]) -> None:
        """Capture the graph of every bucket ``lengths`` need that fits ``kv`` ``(L, 2, B, KVH, S, D)`` and is not
        captured yet, on the scratch caches only (no slot is written), so that no capture lands in a timed run."""
        capacity = kv.shape[4]
        for width in sorted({bucket(n) for n in lengths if self.fits(n, capacity)}):
            if ("prefill", width) in self.graphs and width in self._buffers:
                continue
            buffers = self._buffers_for(width, kv)
            buffers.ids.zero_()
            buffers.last.zero_()
            self.graphs.run(("prefill", width), buffers, partial(_forward, self.module, aux_layers))

    def run(self, ids: torch.Tensor, kv: torch.Tensor, slot: int, aux_layers: tuple[int, ...]) -> TargetOutput:
        """Prefill ``ids`` ``(T,)`` into row ``slot`` of ``kv`` ``(L, 2, B, KVH, S, D)``, entries ``[0, T)``; returns the last row's
        logits ``(1, V)``, hidden states ``(T, H)`` and aux streams ``(T, A * H)`` (copies: the next replay
        overwrites the graph's outputs). The caller resets the slot first and advances its length by T after."""
        length = ids.numel()
        width = bucket(length)
        buffers = self._buffers_for(width, kv)
        buffers.ids.zero_()
        buffers.ids[:length].copy_(ids)
        buffers.last.fill_(length - 1)
        forward = partial(_forward, self.module, aux_layers)  # no __self__: a stand-in graph replays it as is
        logits, hidden, aux = self.graphs.run(("prefill", width), buffers, forward)
        kv[:, :, slot, :, :length].copy_(buffers.scratch[:, :, 0, :, :length])  # (L, 2, KVH, T, D)
        return TargetOutput(logits=logits.clone(), hidden_states=hidden[:length].clone(),
                            aux_hidden_states=None if aux is None else aux[:length].clone())

    def _buffers_for(self, width: int, kv: torch.Tensor) -> _PrefillBuffers:
        """The bucket's static inputs and scratch cache, allocated at its first prompt."""
        if width not in self._buffers:
            self._buffers[width] = _PrefillBuffers.allocate(width, kv)
        return self._buffers[width]


def _forward(module, aux_layers: tuple[int, ...], buffers: _PrefillBuffers) -> tuple:
    """The captured region: the padded prompt on the scratch cache, then the last real row's logits."""
    hidden, aux = module(buffers.ids, buffers.positions, buffers.row, None, buffers.scratch,
                         aux_layers=aux_layers)  # (W, H), (W, A * H) or None: causal among the prompt's rows
    return module.logits(hidden.index_select(0, buffers.last)), hidden, aux  # (1, V), (W, H), (W, A * H)
