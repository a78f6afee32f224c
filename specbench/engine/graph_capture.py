"""CUDA-graph capture of fixed-shape verify steps, shared by the static target's steps and its prefills (docs/engines.md)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Protocol

import torch

Forward = Callable[[Any], tuple]  # inputs -> the step's output tensors (None entries allowed)


class GraphBackend(Protocol):
    def capture(self, forward: Forward, inputs: Any) -> tuple[Any, tuple]:
        """(a graph with ``replay()``, the static outputs its replays overwrite) of ``forward(inputs)``."""

    def release_pool(self) -> None:
        """Forget the shared memory pool (every graph captured in it is gone)."""


class CudaGraphCapture:
    """``torch.cuda.CUDAGraph`` capture on one device; every graph it captures shares one memory pool."""

    def __init__(self, device: torch.device):
        self.device = device
        self._pool = None

    def capture(self, forward: Forward, inputs: Any) -> tuple["torch.cuda.CUDAGraph", tuple]:
        """Record ``forward(inputs)``. The warm-up runs first on a side stream (cuBLAS workspaces, compilation
        and allocator growth must happen outside capture); a step writes only not-yet-committed cache entries,
        which the replay writes again, so running it twice more changes nothing."""
        torch.cuda.synchronize(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):  # (with compile, the first call also compiles: counted as capture time)
                forward(inputs)
        torch.cuda.current_stream(self.device).wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()  # one memory pool shared by every step's graph
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            outputs = forward(inputs)
        torch.cuda.synchronize(self.device)
        return graph, tuple(outputs)

    def release_pool(self) -> None:
        self._pool = None  # a pool whose graphs are all gone cannot take a new capture


@dataclass
class CapturedStep:
    """One step key's graph, the inputs it reads (other inputs need a new capture) and the outputs it overwrites."""

    graph: Any
    inputs: Any
    outputs: tuple


class StepGraphs:
    """One captured graph per step key (e.g. a kind, or (kind, width, span)), replayed at every later step of that key.

    A step is ``forward(inputs)``: a function of static input buffers (and of device state the target owns, such
    as its KV cache) returning a tuple of output tensors; a replay reads whatever the caller copied into the same
    buffers and overwrites the same outputs. Everything host-side (building inputs, choosing the kind, reading
    results back) stays outside ``forward``. The capture is a backend: :class:`CudaGraphCapture` on CUDA; tests
    inject a stand-in with the same two methods to check this bookkeeping on the CPU.

    ``enabled`` False (or no backend) runs every step eagerly. ``captures`` and ``replays`` count per key;
    ``capture_seconds`` is the warm-up + capture time, which callers report apart from decoding speed.
    """

    def __init__(self, backend: GraphBackend | None, *, enabled: bool = True):
        self.backend = backend
        self.enabled = bool(enabled) and backend is not None
        self.captured: dict[Hashable, CapturedStep] = {}
        self.captures: Counter = Counter()
        self.replays: Counter = Counter()
        self.capture_seconds = 0.0

    @classmethod
    def for_device(cls, device: torch.device, enabled: bool, backend: GraphBackend | None = None) -> "StepGraphs":
        """CUDA graphs on a CUDA device when ``enabled``; an explicit ``backend`` (a test's stand-in) on any device."""
        if backend is None and enabled and device.type == "cuda":
            backend = CudaGraphCapture(device)
        return cls(backend, enabled=enabled)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.captured

    def run(self, key: Hashable, inputs: Any, forward: Forward) -> tuple:
        """``forward(inputs)``'s outputs: eagerly when disabled, else the key's graph replayed (captured first when
        the key is new or its graph reads other inputs). Replayed outputs are the graph's static tensors."""
        if not self.enabled:
            return tuple(forward(inputs))
        step = self.captured.get(key)
        if step is None or step.inputs is not inputs:
            start = time.perf_counter()
            graph, outputs = self.backend.capture(forward, inputs)
            self.capture_seconds += time.perf_counter() - start
            step = self.captured[key] = CapturedStep(graph, inputs, tuple(outputs))
            self.captures[key] += 1
        step.graph.replay()
        self.replays[key] += 1
        return step.outputs

    def drop(self) -> None:
        """Forget every graph (they read buffers or a cache about to change) and with them the memory pool."""
        self.captured.clear()
        if self.backend is not None:
            self.backend.release_pool()
