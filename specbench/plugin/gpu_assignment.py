"""Which GPUs each pytest-xdist worker sees: its own first (worker k gets GPU k mod G), then the rest in rotation."""

from __future__ import annotations

import re

WORKER_VAR = "PYTEST_XDIST_WORKER"  # "gw0", "gw1", ... set by pytest-xdist in each worker process
WORKER_COUNT_VAR = "PYTEST_XDIST_WORKER_COUNT"
VISIBLE_DEVICES_VAR = "CUDA_VISIBLE_DEVICES"
OPT_OUT_VAR = "SPECBENCH_NO_GPU_SHARDING"  # set (to anything but "" or "0") = leave CUDA_VISIBLE_DEVICES alone

_WORKER_ID = re.compile(r"gw(\d+)")


class GpuAssignmentError(ValueError):
    """A malformed worker id, worker count or CUDA_VISIBLE_DEVICES; the message names the variable and value."""


def worker_index(worker_id: str) -> int:
    """k of an xdist worker id "gwk"."""
    match = _WORKER_ID.fullmatch(str(worker_id).strip())
    if match is None:
        raise GpuAssignmentError(f"{WORKER_VAR}={worker_id!r} is not an xdist worker id of the form gwN (gw0, gw1...)")
    return int(match.group(1))


def worker_count(count: int | str) -> int:
    """The number of xdist workers, a positive integer (given as PYTEST_XDIST_WORKER_COUNT's text or an int)."""
    try:
        value = int(str(count).strip())
    except ValueError:
        value = 0
    if value < 1:
        raise GpuAssignmentError(f"{WORKER_COUNT_VAR}={count!r} is not a positive number of xdist workers")
    return value


def parse_visible_devices(value: str) -> list[str]:
    """The entries of a CUDA_VISIBLE_DEVICES value, in order: indices ("3,5"), GPU-/MIG- UUIDs, kept verbatim.
    "" hides every GPU (CUDA's meaning): []. An empty entry ("0,,1") or a repeated one is an error."""
    if not value.strip():
        return []
    entries = [entry.strip() for entry in value.split(",")]
    if any(not entry for entry in entries):
        raise GpuAssignmentError(f"{VISIBLE_DEVICES_VAR}={value!r} has an empty entry")
    repeated = sorted({entry for entry in entries if entries.count(entry) > 1})
    if repeated:
        raise GpuAssignmentError(f"{VISIBLE_DEVICES_VAR}={value!r} names {', '.join(repeated)} more than once")
    return entries


def visible_gpus(cuda_visible_devices: str | None, inventory_count: int = 0) -> list[str]:
    """The GPUs the workers share: CUDA_VISIBLE_DEVICES's entries when it is set, else indices 0..count-1
    of the inventory (env.gpu_inventory(), which numbers the devices the same way)."""
    if cuda_visible_devices is not None:
        return parse_visible_devices(cuda_visible_devices)
    return [str(index) for index in range(inventory_count)]


def device_order(worker_id: str, count: int | str, gpus: list[str]) -> list[str]:
    """The CUDA_VISIBLE_DEVICES order for worker ``worker_id`` of ``count`` workers sharing ``gpus``: its own GPU
    (worker k gets gpus[k mod G]) first, then the next ones in rotation, so a ``multi_gpu(n)`` case on that worker
    uses its own GPU and the n-1 after it. [] when no GPU is visible. k may reach ``count`` or beyond: xdist gives
    the replacement of a crashed worker the next free id (gw4 of 4 workers)."""
    index = worker_index(worker_id)
    worker_count(count)  # a malformed count is still refused, naming the variable
    if not gpus:
        return []
    start = index % len(gpus)
    return list(gpus[start:]) + list(gpus[:start])


def sharing_note(workers: int, gpu_count: int) -> str | None:
    """A sentence when more workers than GPUs share them round-robin (their speed figures then interfere), else None."""
    if gpu_count < 1 or workers <= gpu_count:
        return None
    return (f"{workers} xdist workers share {gpu_count} GPU{'s' if gpu_count > 1 else ''} round-robin (worker k on "
            f"GPU k mod {gpu_count}): cases on one GPU run at once, so their speed figures are not comparable with "
            "a run of one worker per GPU")


def opted_out(value: str | None) -> bool:
    """Whether SPECBENCH_NO_GPU_SHARDING's value turns sharding off: set, and neither "" nor "0"."""
    return value is not None and value.strip() not in ("", "0")
