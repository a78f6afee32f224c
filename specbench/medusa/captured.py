"""Medusa's heads as one captured graph per batch size on the static engine (docs/engines.md#captured-medusa-heads)."""

from __future__ import annotations

from typing import Callable

import torch

from specbench.engine.graph_capture import GraphBackend, StepGraphs

# the static engine's Medusa proposers capture their heads: off until an A/B on a GPU shows it pays
# (bench/candidate_archive.sh flips it in a candidate tree)
CAPTURE_HEADS = False


class CapturedHeads:
    """Every active slot's draft tokens from one graph replay instead of some twenty launches of the heads' ops.

    ``forward`` maps ``(B, H)`` hidden states to ``((B, N) draft tokens,)``. :meth:`prepare` captures it for B rows
    over a buffer of zeros, before any clock starts. :meth:`tokens` copies n <= B hidden states into the first rows of
    the smallest prepared buffer and replays its graph. The other rows keep an earlier step's values, and nobody reads
    their tokens. With graphs off, or no buffer of n rows prepared, :meth:`tokens` runs ``forward`` eagerly."""

    def __init__(self, forward: Callable, hidden_size: int, dtype: torch.dtype, device: torch.device, *,
                 enabled: bool, backend: GraphBackend | None = None):
        self.forward, self.hidden_size, self.dtype, self.device = forward, hidden_size, dtype, device
        self.graphs = StepGraphs.for_device(device, enabled, backend)
        self.inputs: dict[int, torch.Tensor] = {}  # B -> the (B, H) buffer its graph reads

    @property
    def enabled(self) -> bool:
        return self.graphs.enabled

    @torch.inference_mode()
    def prepare(self, batch_size: int) -> None:
        """Capture the graph of ``batch_size`` rows (nothing when graphs are off or it exists)."""
        if self.graphs.enabled and batch_size not in self.inputs:
            buffer = torch.zeros(batch_size, self.hidden_size, dtype=self.dtype, device=self.device)  # (B, H)
            self.inputs[batch_size] = buffer
            self.graphs.run(batch_size, buffer, self.forward)

    def tokens(self, hidden: torch.Tensor) -> torch.Tensor:
        """``(n, H)`` hidden states -> ``(n, N)`` draft tokens through a prepared graph, or eagerly without one."""
        rows = hidden.shape[0]
        fitting = [batch for batch in self.inputs if batch >= rows]
        if not fitting:
            return self.forward(hidden)[0]
        batch = min(fitting)
        buffer = self.inputs[batch]
        buffer[:rows].copy_(hidden)
        (tokens,) = self.graphs.run(batch, buffer, self.forward)  # (B, N) the graph's static output
        return tokens[:rows].clone()  # the next replay overwrites the graph's output while this draft is verified
