"""A CUDA graph's replay on the CPU: the aten ops a captured region ran, recorded once and run again as recorded.

A CUDA graph replays the kernels its capture launched, with the arguments they had then: whatever Python decided
during the capture (a width, a branch on host state, a lazily created buffer) is frozen, and a host read cannot
happen at all. Re-running the region's Python (as a plain stand-in does) would hide a region that depends on host
state changing between replays. :class:`OpTape` records every aten op of the region with its arguments; a replay
runs the same ops in order, each reading the replay's own values of the tensors the region made and the current
contents of the tensors it did not (inputs, weights, caches), and finally copies the region's outputs into the
tensors the capture returned, as a graph's static outputs. A host read inside the region is refused, as CUDA's
capture refuses it, and so is every op that reads the device on CUDA although it does not on the CPU: an output
sized by the data (nonzero, a boolean mask's indexing, masked_select, unique, bincount, repeat_interleave without
output_size, a value comparison returning a Python bool), a tensor made from Python data (an upload from pageable memory) and a copy
to another device.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
HOST_READS = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default, aten._unique2.default,
              aten.unique_dim.default, aten.unique_consecutive.default, aten.bincount.default, aten.equal.default,
              aten.is_nonzero.default, aten.lift_fresh.default,
              aten.item.default}  # int(), float(), .item() of a CPU tensor under inference mode dispatch this
# reads of a tensor's data that dispatch no aten op on the CPU (tolist, numpy; item in grad mode): seen one level up
HOST_READ_METHODS = {torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.item, torch.Tensor.__int__,
                     torch.Tensor.__float__, torch.Tensor.__index__}


BOOL_INDEXED = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default}  # a bool mask becomes nonzero


def reads_the_device(func, args: tuple, kwargs: dict) -> bool:
    """Whether ``func`` reads the device (or uploads from pageable memory) on CUDA: refused while capturing."""
    if func is aten.repeat_interleave.Tensor:
        return kwargs.get("output_size") is None  # its output's size comes from the data
    if func in BOOL_INDEXED:
        return any(index is not None and index.dtype == torch.bool for index in args[1])
    return func in HOST_READS or (func is aten._to_copy.default and "device" in kwargs)


class OpTape(TorchDispatchMode):
    """Records ``(op, args, kwargs, output)`` for every aten op run under it; keeps them alive (ids stay unique)."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if reads_the_device(func, args, kwargs):
            raise RuntimeError(f"{func} reads the device inside a captured region (CUDA's capture would refuse it)")
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, out))
        return out


class HostReadGuard(TorchFunctionMode):
    """Refuses the reads of a tensor's data that :class:`OpTape` cannot see, as CUDA's capture refuses them."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in HOST_READ_METHODS:
            raise RuntimeError(f"{func.__name__} reads the device inside a captured region (CUDA's capture would "
                               "refuse it)")
        return func(*args, **(kwargs or {}))


class TapeGraph:
    """``replay()`` runs the recorded ops again and writes the region's outputs into ``outputs``."""

    def __init__(self, tape: OpTape, outputs: tuple):
        self.tape, self.outputs = tape, outputs

    def replay(self) -> None:
        values: dict[int, torch.Tensor] = {}  # id of a recorded tensor -> its value in this replay

        def now(x):
            if isinstance(x, torch.Tensor):
                return values.get(id(x), x)  # a tensor the region did not make: as it is now
            if isinstance(x, (list, tuple)):
                return type(x)(now(v) for v in x)
            return x

        def bind(recorded, value) -> None:
            if isinstance(recorded, torch.Tensor):
                values[id(recorded)] = value
            elif isinstance(recorded, (list, tuple)):
                for r, v in zip(recorded, value):
                    bind(r, v)

        for func, args, kwargs, out in self.tape.ops:
            bind(out, func(*now(args), **{key: now(value) for key, value in kwargs.items()}))
        for static in self.outputs:
            if static is not None and id(static) in values:
                static.copy_(values[id(static)])


def record(forward, inputs) -> tuple[TapeGraph, tuple]:
    """Capture ``forward(inputs)`` as CUDA's backend does: two warm-up runs (lazily made buffers are made there),
    then one recorded run, whose outputs are the graph's static outputs."""
    for _ in range(2):
        forward(inputs)
    with OpTape() as tape, HostReadGuard():
        outputs = tuple(forward(inputs))
    return TapeGraph(tape, outputs), outputs
