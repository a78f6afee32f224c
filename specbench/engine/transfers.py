"""Host-to-device copies that do not synchronise the CUDA stream (pinned staging, asynchronous copy)."""

from __future__ import annotations

import torch


def host_to_device(values: list, device: torch.device) -> torch.Tensor:
    """An int64 tensor of ``values`` (nested lists) on ``device`` without a stream sync: on CUDA staged in pinned
    memory and copied asynchronously (the caching host allocator keeps the staging block until the copy ran); a
    copy from pageable memory would wait for the stream first."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=torch.long, device=device)
    return torch.tensor(values, dtype=torch.long, pin_memory=True).to(device, non_blocking=True)


def tensor_to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device`` without a stream sync: a CPU tensor bound for CUDA is staged in pinned memory and
    copied asynchronously (a host-held tree draft's depths, mask and parents, every step); anything else as ``.to``."""
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)
