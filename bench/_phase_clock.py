"""Wall time per named phase of a decode loop for the bench/profile_*.py scripts, and the device sync, timed calls
and timed graph replays the bench scripts share."""

from __future__ import annotations

import statistics
import time
from collections import defaultdict

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_calls(device: torch.device, fn, reps: int) -> list[float]:
    """Wall seconds of ``reps`` calls of ``fn()``, the device synchronised before and after each."""
    times = []
    for _ in range(reps):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return times


def graph_replay_seconds(fn, reps: int) -> float:
    """Median wall seconds of one replay of ``fn()`` captured as a CUDA graph (two warm-up calls on a side stream
    first, as capture requires; the first two replays untimed)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    graph.replay()
    return statistics.median(timed_calls(torch.device("cuda"), graph.replay, reps))


class PhaseClock:
    """Wraps callables so each call's wall time (the device synchronised before and after, so queued GPU work is
    charged to the phase that launched it) adds to a named phase; ``seconds`` and ``calls`` per phase."""

    def __init__(self, device: torch.device):
        self.device, self.seconds, self.calls = device, defaultdict(float), defaultdict(int)

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            sync(self.device)
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            sync(self.device)
            self.seconds[name] += time.perf_counter() - start
            self.calls[name] += 1
            return out
        return timed
