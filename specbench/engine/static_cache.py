"""A preallocated KV cache of B slots, each with its own length on the device; the check that it fits; a step's attention span."""

from __future__ import annotations

import os

import torch


def free_device_bytes(device: torch.device) -> int | None:
    """Free memory of ``device``: CUDA's free bytes, the host's available RAM for the CPU (None where unknown)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not a POSIX host: nothing to check against
        return None


def check_cache_fits(batch_size: int, num_layers: int, num_kv_heads: int, capacity: int, head_dim: int,
                     dtype: torch.dtype, device: torch.device) -> None:
    """Raise before allocating when a batched cache exceeds free memory."""
    per_slot = num_layers * 2 * num_kv_heads * head_dim * capacity * torch.empty((), dtype=dtype).element_size()
    needed = batch_size * per_slot
    available = free_device_bytes(device)
    if available is not None and needed > available:
        fits = available // per_slot
        raise MemoryError(
            f"batch_size {batch_size} needs a static KV cache of {needed} bytes ({batch_size} slots x {num_layers} "
            f"layers x 2 x {num_kv_heads} kv heads x {head_dim} head_dim x {capacity} positions x "
            f"{torch.empty((), dtype=dtype).element_size()} bytes) but {device} has {available} bytes free; lower "
            f"batch_size (at most {fits} fit at this length) or the max length (prompt + max_new_tokens + draft tokens)"
        )


SPAN_QUANTUM = 32  # the finest step between attention spans (cache entries)


def attention_span(needed: int, capacity: int) -> int:
    """The cache entries a batched step attends over when its longest slot needs ``needed`` (committed entries plus
    the step's width): ``needed`` rounded up to a quarter of the power of two at or below it (at least
    SPAN_QUANTUM), at most ``capacity``. Four spans per octave: each a captured graph, none reading more than
    a quarter of dead entries beyond the live ones (docs/batching.md#attention-span)."""
    if needed >= capacity:
        return capacity
    quantum = max(SPAN_QUANTUM, (1 << (max(needed, 1).bit_length() - 1)) // 4)
    return min(capacity, -(-needed // quantum) * quantum)


def attention_spans(shortest: int, capacity: int) -> list[int]:
    """Every span :func:`attention_span` gives for steps needing ``shortest`` .. ``capacity`` entries, ascending."""
    spans, needed = [], max(1, shortest)
    while needed <= capacity:
        span = attention_span(needed, capacity)
        spans.append(span)
        needed = span + 1
    return spans


class StaticKVCache:
    """Keys and values ``(layers, 2, B, kv_heads, capacity, head_dim)``; slot b's live entries are ``[0, lengths[b])``.

    ``lengths`` ``(B,)`` lives on the device (the hot path reads it); ``host_lengths`` mirrors it, advanced
    by the same host-known amounts, so nothing reads it back.
    """

    def __init__(self, batch_size: int, num_layers: int, num_kv_heads: int, capacity: int, head_dim: int, *, dtype, device):
        # zeros, not empty: masked slots still enter attention as 0 * value, and stale NaN would poison it
        self.kv = torch.zeros(num_layers, 2, batch_size, num_kv_heads, capacity, head_dim, dtype=dtype, device=device)
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)  # (B,)
        self.host_lengths = [0] * batch_size
        self.slot_index = torch.arange(capacity, device=device)  # (S,)
        self.rows = torch.arange(batch_size, device=device)  # (B,)

    @property
    def batch_size(self) -> int:
        return self.kv.shape[2]

    @property
    def capacity(self) -> int:
        return self.kv.shape[4]

    def reset_slot(self, slot: int) -> None:
        self.lengths[slot] = 0
        self.host_lengths[slot] = 0

    def advance_slot(self, slot: int, count: int) -> None:
        self.lengths[slot] += count
        self.host_lengths[slot] += count

    def advance(self, counts: torch.Tensor, host_counts) -> None:
        """Advance every slot's length by its own ``counts[b]`` (``(B,)`` on the device, 0 for idle slots) in one
        device op, queued first; then the host mirror by ``host_counts()``, the same counts as a host list (which
        may wait for the step's readback)."""
        self.lengths.add_(counts)  # (B,)
        self.host_lengths = [n + c for n, c in zip(self.host_lengths, host_counts())]

    def new_slots(self, width: int) -> torch.Tensor:
        """(B, W) the cache positions each slot's verify input of ``width`` nodes goes to: right after its live ones."""
        return self.lengths[:, None] + self.slot_index[None, :width]

    def attention_mask(self, tree: torch.Tensor, span: int) -> torch.Tensor:
        """(B, W, K) bool over the first K = ``span`` entries: each slot's live entries, plus the new entries its
        ``tree`` rows ``(B, W, W)`` allow; every entry a real node attends to must lie below K."""
        batch, width = tree.shape[:2]
        slots = self.slot_index[:span]  # (K,)
        offset = slots[None, :] - self.lengths[:, None]  # (B, K) position relative to the slot's first new entry
        is_new = (offset >= 0) & (offset < width)  # (B, K)
        spread = offset.clamp(0, width - 1)[:, None, :].expand(batch, width, -1)  # (B, W, K)
        tree_cols = tree.gather(2, spread)  # (B, W, K) each tree row, spread over the cache
        return (offset < 0)[:, None, :] | (is_new[:, None, :] & tree_cols)  # (B, W, K)

    def gather_new(self, source: torch.Tensor) -> None:
        """Move slot b's new entries ``lengths[b] + source[b, i]`` to ``lengths[b] + i``, in place, for every slot;
        ``source`` ``(B, W)`` is each slot's accepted nodes padded with the identity (idle slots: the identity)."""
        width = source.shape[1]
        rows = self.rows[:, None].expand(-1, width)  # (B, W)
        picked = self.kv[:, :, rows, :, self.lengths[:, None] + source]  # (B, W, L, 2, KVH, D) a copy
        self.kv[:, :, rows, :, self.new_slots(width)] = picked
