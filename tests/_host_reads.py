"""Counting the host's reads of tensor values (each one a device-to-host stream sync on a GPU) on the CPU.

:class:`HostReads` is a ``TorchFunctionMode``: while active it sees every call of the tensor methods through which
Python reads a tensor's values (``.tolist()``, ``.item()``, ``bool(t)``, ``int(t)``, ``t`` used as an index, ...)
and counts them; ``where=True`` also records each read's method and the specbench source line that made it, for
a failing assertion to name. ``len(t)`` reads the shape only (no sync) and is not counted. Used by
test_batched_host_sync.py and test_eagle_host_syncs.py.
"""

from __future__ import annotations

import traceback

from torch.overrides import TorchFunctionMode

# the tensor methods through which the host reads a tensor's values (each one a stream sync on a GPU)
HOST_READS = {"tolist", "item", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu", "nonzero"}
# tensors built from host data (Python lists, numbers): on a GPU each is a host-to-device upload
UPLOADS = {"tensor", "as_tensor"}


class HostReads(TorchFunctionMode):
    """Counts the host reads of tensor values made while active (and, with ``where``, records them)."""

    def __init__(self, where: bool = False):
        super().__init__()
        self.count = 0
        self.uploads = 0
        self.where = where
        self.reads: list[tuple[str, str]] = []  # (method, "file:line" of the innermost specbench frame)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", None)
        if name in HOST_READS:
            self.count += 1
            if self.where:
                self.reads.append((name, _caller()))
        elif name in UPLOADS:
            self.uploads += 1
        return func(*args, **(kwargs or {}))


def _caller() -> str:
    for frame in reversed(traceback.extract_stack()[:-2]):
        if "/specbench/" in frame.filename:
            return f"{frame.filename.split('/specbench/', 1)[1]}:{frame.lineno}"
    return "?"
