"""Prefill several slots of a batched cache in one forward: prompts padded to one length, written straight into their slots.

An admission of n prompts (the start of a run, or n slots freed in the same step) costs one forward
of ``(n, T_max)`` tokens instead of n forwards of one prompt each: a batch-1 prefill on a 7B model is
launch-bound and the same ~1,000 kernels whatever T, so n sequential prefills cost n times that
(docs/batching.md#admission). Row i attends causally to its own prompt only, through the fused causal
attention kernel with no mask; each layer writes the group's keys and values into the first T_max
entries of their slots (one ``index_copy_`` each), so the other slots' entries are never touched. The rows past T_i
are padding whose outputs are dropped and whose entries lie beyond the slot's length. Groups larger
than ``token_budget`` padded tokens are split, which bounds the activations.
"""

from __future__ import annotations

import torch
from torch.nn.utils.rnn import pad_sequence

from specbench.engine.static_cache import StaticKVCache
from specbench.engine.static_ops import EAGER_OPS, StepOps
from specbench.engine.target import TargetOutput
from specbench.engine.transfers import host_to_device

DEFAULT_TOKEN_BUDGET = 8192  # padded prompt tokens per prefill forward: a 7B's gate/up product is then 0.36 GB in bf16


def split_group(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Indices of ``lengths`` in order, cut into runs whose count x longest stays within ``token_budget``
    (a prompt longer than the budget goes alone)."""
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1 padded tokens per prefill forward, got {token_budget}")
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for index, length in enumerate(lengths):
        wider = max(longest, length)
        if current and wider * (len(current) + 1) > token_budget:
            groups.append(current)
            current, wider = [], length
        current.append(index)
        longest = wider
    if current:
        groups.append(current)
    return groups


@torch.inference_mode()
def prefill_group(module, cache: StaticKVCache, slots: list[int], prompts: list[torch.Tensor],
                  aux_layers: tuple[int, ...] = (), ops: StepOps = EAGER_OPS) -> list[TargetOutput]:
    """Run ``prompts[i]`` ``(T_i,)`` (on the cache's device) into ``slots[i]`` of ``cache`` in one forward; the other
    slots are untouched. Returns per prompt its last row's logits ``(1, V)``, hidden states ``(T_i, H)`` and aux
    streams ``(T_i, A * H)`` (None without aux layers), as a one-slot prefill would. ``ops`` runs the pointwise
    stages: eager, or fused (``static_ops.compiled_prefill_ops``, prepared by :func:`prepare_fused`)."""
    lengths = [p.numel() for p in prompts]
    n, width = len(prompts), max(lengths)
    device = cache.kv.device
    ids = pad_sequence(prompts, batch_first=True).long()  # (n, T) padded with token 0
    positions = torch.arange(width, device=device).repeat(n)  # (n * T,) every prompt starts at position 0
    rows = host_to_device(slots, device)  # (n,)
    for slot in slots:
        cache.reset_slot(slot)
    # mask None: each prompt attends causally to itself and its entries go straight to its row
    hidden, aux = module(ids.flatten(), positions, rows, None, cache.kv, ops, aux_layers=aux_layers)  # (n * T, H), (n * T, A * H)
    hidden = hidden.view(n, width, -1)  # (n, T, H)
    aux = None if aux is None else aux.view(n, width, -1)  # (n, T, A * H)
    last = host_to_device([t - 1 for t in lengths], device)  # (n,)
    logits = module.logits(hidden[torch.arange(n, device=device), last], ops)  # (n, V)
    outputs = []
    for row, (slot, length) in enumerate(zip(slots, lengths)):
        cache.advance_slot(slot, length)
        outputs.append(TargetOutput(logits=logits[row: row + 1], hidden_states=hidden[row, :length],
                                    aux_hidden_states=None if aux is None else aux[row, :length]))
    return outputs


def prepare_fused(module, cache: StaticKVCache, ops: StepOps, lengths, token_budget: int,
                  aux_layers: tuple[int, ...] = ()) -> bool:
    """Compile a fused group prefill's stages before anything is timed, with two groups of zero prompts: two short
    ones (each stage's first compile), then the largest group prompts of these ``lengths`` make (the recompile with
    the token count symbolic, tuned at a real admission's size). They go into slots 0, 1, ..., which are emptied
    after. Returns whether it ran: not for eager stages, nor with fewer than two slots (every admission is then a
    single prompt's). Slots in use are refused: prepare before a run, with every slot idle."""
    if not ops.compiled or cache.batch_size < 2:
        return False
    longest = min(max(lengths), cache.capacity)
    count = max(2, min(cache.batch_size, len(lengths), token_budget // longest))
    used = [slot for slot in range(count) if cache.host_lengths[slot]]
    if used:
        raise ValueError(f"preparing the fused group prefill writes slots 0..{count - 1}, but slots {used} hold "
                         "requests; prepare before a run, with every slot idle")
    for n, width in ((2, max(1, min(8, longest // 2))), (count, longest)):  # one-token prompts: one shape only
        prompt = torch.zeros(width, dtype=torch.long, device=cache.kv.device)  # (T,)
        prefill_group(module, cache, list(range(n)), [prompt] * n, aux_layers, ops)
    for slot in range(count):
        cache.reset_slot(slot)
    return True
