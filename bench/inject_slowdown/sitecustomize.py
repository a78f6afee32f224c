"""Bench-only slowdown switch for A/B trials (docs/ab.md#trials): with this directory on PYTHONPATH and
SPECBENCH_INJECT_VERIFY_SLOWDOWN=F set (e.g. 0.05), every target's ``verify`` takes F times longer, so the A/B
gate can be shown to catch a slowdown of known size without touching the engine's code.

    specbench compare HEAD speed/synth-7b-plain --head-env PYTHONPATH=$PWD/bench/inject_slowdown \
        --head-env SPECBENCH_INJECT_VERIFY_SLOWDOWN=0.05

How the delay is added after the real verify: on the CPU, a busy wait of F x the call's own duration; on CUDA,
a GPU spin kernel (torch.cuda._sleep) of F x the median of the first few calls of that step shape (slots, step
kind, widest slot's nodes), timed with the device synchronised (those first calls are warm-up and graph-capture
steps, before any clock), so later calls add no host sync. Python imports this module at start-up (site's sitecustomize hook); it patches the
target modules lazily, when they are first imported, so the tree the process runs from is the one patched.
"""

from __future__ import annotations

import importlib.abc
import os
import statistics
import sys
import time

SLOWDOWN = float(os.environ.get("SPECBENCH_INJECT_VERIFY_SLOWDOWN", "0") or 0)
TARGET_CLASSES = {"specbench.engine.hf_target": "HFTarget", "specbench.engine.static_target": "StaticTarget"}
CALIBRATION_CALLS = 5
_durations: dict[tuple, list[float]] = {}
_cycles_per_s: list[float] = []


def _shape_key(owner, inputs) -> tuple:
    """A verify's step shape: (target class, slots, step kind, the widest slot's nodes) of ``inputs`` (one
    SlotInput or None per slot), the protocol every target's ``verify(self, inputs)`` speaks."""
    from specbench.engine.step_inputs import step_kind  # loaded by now: the target module imports it

    live = [x for x in inputs if x is not None]
    return type(owner).__name__, len(inputs), step_kind(inputs), max((len(x) for x in live), default=0)


def _gpu_cycles_per_s(torch) -> float:
    if not _cycles_per_s:
        cycles = 50_000_000
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(cycles)  # first launch loads the kernel
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        _cycles_per_s.append(cycles / (start.elapsed_time(end) / 1000))
    return _cycles_per_s[0]


def _slowed(verify):
    def slowed_verify(self, inputs):
        import torch

        device = getattr(self, "device", None)
        on_cuda = torch.device(device).type == "cuda" if device is not None else False
        seen = _durations.setdefault(_shape_key(self, inputs), [])
        if not on_cuda or len(seen) < CALIBRATION_CALLS:
            if on_cuda:
                torch.cuda.synchronize()
            started = time.perf_counter()
            out = verify(self, inputs)
            if on_cuda:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - started
            seen.append(seconds)
        else:
            out = verify(self, inputs)
            seconds = statistics.median(seen)
        delay = SLOWDOWN * seconds
        if on_cuda:
            torch.cuda._sleep(int(delay * _gpu_cycles_per_s(torch)))
        else:
            until = time.perf_counter() + delay
            while time.perf_counter() < until:  # busy, as the work it stands for would be
                pass
        return out

    slowed_verify.__wrapped__ = verify
    return slowed_verify


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: lets the other finders load a target module, then wraps its class's verify."""

    def find_spec(self, name, path, target=None):
        if name not in TARGET_CLASSES:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = getattr(finder, "find_spec", lambda *a: None)(name, path, target)
            if spec is not None:
                break
        else:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            cls = getattr(module, TARGET_CLASSES[name])
            cls.verify = _slowed(cls.verify)
            print(f"inject_slowdown: {name}.{cls.__name__}.verify slowed by {SLOWDOWN:.1%}", file=sys.stderr)

        spec.loader.exec_module = exec_and_patch
        return spec


if SLOWDOWN > 0:
    sys.meta_path.insert(0, _PatchOnImport())
