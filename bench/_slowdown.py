"""Bench-only extra work after a call, for speed-gate trials (bench/speed_gate_trial.py): a GPU spin on the current
stream (``torch.cuda._sleep``, its cycles per second calibrated once) or a host busy-wait, wrapped around one method
of a target or a proposer."""

from __future__ import annotations

import time

import torch

CALIBRATION_CYCLES = 50_000_000  # tens of milliseconds of _sleep on any recent GPU


def calibrate_cuda_sleep(trials: int = 3) -> float:
    """GPU cycles per second of ``torch.cuda._sleep``: the fastest of ``trials`` timed sleeps."""
    torch.cuda._sleep(1000)  # first launch out of the timing
    torch.cuda.synchronize()
    times = []
    for _ in range(trials):
        start = time.perf_counter()
        torch.cuda._sleep(CALIBRATION_CYCLES)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return CALIBRATION_CYCLES / min(times)


class Spin:
    """``seconds`` of extra work per call: a GPU spin on the current stream (CUDA), else a host busy-wait."""

    def __init__(self, device: str, seconds: float, cycles_per_s: float | None):
        self.seconds = seconds
        self.cycles = int(seconds * cycles_per_s) if device.startswith("cuda") and cycles_per_s else None

    def __call__(self) -> None:
        if self.cycles is not None:
            torch.cuda._sleep(self.cycles)  # queued after the call's kernels; the next sync waits for it
            return
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            pass


class Slowed:
    """``inner`` with every attribute delegated, and ``spin`` after each call of its method ``method``
    (the target's ``verify`` or the proposer's ``propose``, and its form for steps queued ahead, ``propose_queued``)."""

    def __init__(self, inner, method: str, spin: Spin):
        self._inner, self._method, self._spin = inner, method, spin

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if name not in (self._method, f"{self._method}_queued"):
            return attr

        def slowed(*args, **kwargs):
            out = attr(*args, **kwargs)
            self._spin()
            return out

        return slowed
