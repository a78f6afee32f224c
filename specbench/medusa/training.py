"""Medusa-1 head training by self-distillation: a frozen target's own greedy continuations and
final hidden states are the data; head i at position t learns token t + i + 2 (docs/checkpoints.md).

Data layout (one row per prompt, ``T = max_new_tokens + 1``): ``hidden[b, j]`` is the target's
post-norm hidden state at the last prompt position plus j, ``tokens[b, j]`` the token there
(``tokens[b, 0]`` = last prompt token; later ones generated). Positions after a generated EOS
(``model.generation_config.eos_token_id``) hold ``IGNORE_INDEX``. Heads only ever read hidden states from the last prompt position on, so
earlier prompt positions are not kept.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from specbench.medusa.heads import MedusaHeads

IGNORE_INDEX = -100


@torch.no_grad()
def collect_self_distillation(
    model: nn.Module,
    prompts: Sequence[torch.Tensor | Sequence[int]],
    max_new_tokens: int,
    *,
    batch_size: int = 8,
    pad_token_id: int = 0,
    progress: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy-generate from each prompt with a transformers causal LM; return ``(hidden, tokens)``
    on the CPU: ``(B, max_new_tokens + 1, H)`` in the model's dtype and ``(B, max_new_tokens + 1)`` int64."""
    device = next(model.parameters()).device
    eos = model.generation_config.eos_token_id
    eos_ids = torch.tensor([] if eos is None else [eos] if isinstance(eos, int) else list(eos), dtype=torch.long)
    hidden_rows, token_rows = [], []
    starts = range(0, len(prompts), batch_size)
    for start in tqdm(starts, desc="self-distillation", disable=not progress):
        batch = [torch.as_tensor(p, dtype=torch.long).flatten() for p in prompts[start : start + batch_size]]
        width = max(p.numel() for p in batch)
        # left padding keeps every prompt's last token in the same column, so rows align after it
        ids = torch.full((len(batch), width), pad_token_id, dtype=torch.long)  # (b, P)
        mask = torch.zeros(len(batch), width, dtype=torch.long)  # (b, P)
        for row, prompt in enumerate(batch):
            ids[row, width - prompt.numel() :] = prompt
            mask[row, width - prompt.numel() :] = 1
        ids, mask = ids.to(device), mask.to(device)
        # no min_new_tokens: it would ban EOS and record the target's second choice where it ends
        sequences = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad_token_id
        )  # (b, <= P + G): rows that ended early are padded, all rows ending stops generation
        sequences = F.pad(sequences, (0, width + max_new_tokens - sequences.shape[1]), value=pad_token_id)  # (b, P + G)
        full_mask = torch.cat([mask, torch.ones_like(sequences[:, width:])], dim=1)  # (b, P + G)
        position_ids = (full_mask.cumsum(dim=1) - 1).clamp_min(0)  # (b, P + G): as generate placed them
        out = model.get_decoder()(input_ids=sequences, attention_mask=full_mask, position_ids=position_ids)
        hidden_rows.append(out.last_hidden_state[:, width - 1 :].cpu())  # (b, G + 1, H) post-norm
        token_rows.append(_ignore_after_eos(sequences[:, width - 1 :].cpu(), eos_ids))  # (b, G + 1)
    return torch.cat(hidden_rows), torch.cat(token_rows)


def _ignore_after_eos(tokens: torch.Tensor, eos_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) -> (B, T) with every token after a generated EOS set to IGNORE_INDEX (the EOS is kept)."""
    if not eos_ids.numel():
        return tokens
    is_eos = torch.isin(tokens, eos_ids)  # (B, T)
    is_eos[:, 0] = False  # column 0 is the prompt's last token
    after_eos = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0  # (B, T)
    return tokens.masked_fill(after_eos, IGNORE_INDEX)


def head_labels(tokens: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, T) tokens -> (B, T, num_heads) labels: ``labels[b, t, i] = tokens[b, t + i + 2]`` or IGNORE_INDEX."""
    batch, length = tokens.shape
    labels = torch.full((batch, length, num_heads), IGNORE_INDEX, dtype=torch.long)  # (B, T, heads)
    for i in range(num_heads):
        shift = i + 2
        if shift < length:
            labels[:, : length - shift, i] = tokens[:, shift:]
    return labels


def _flat_examples(hidden: torch.Tensor, tokens: torch.Tensor, num_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep positions where at least head 0 has a label: ``(M, H)`` hidden, ``(M, num_heads)`` labels."""
    if hidden.shape[:2] != tokens.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} and tokens {tuple(tokens.shape)} must share (B, T)")
    labels = head_labels(tokens, num_heads).flatten(0, 1)  # (B * T, heads)
    keep = labels[:, 0] != IGNORE_INDEX  # (B * T,)
    return hidden.flatten(0, 1)[keep], labels[keep]


def _frozen(module: nn.Module | None) -> list[tuple[nn.Parameter, bool]]:
    """Stop gradients into a borrowed module (the target's lm_head); returns what to restore."""
    saved = [(p, p.requires_grad) for p in module.parameters()] if module is not None else []
    for p, _ in saved:
        p.requires_grad_(False)
    return saved


def train_medusa_heads(
    heads: MedusaHeads,
    hidden: torch.Tensor,
    tokens: torch.Tensor,
    *,
    steps: int,
    lr: float = 1e-3,
    batch_size: int = 64,
    seed: int = 0,
    device: torch.device | str | None = None,
    lm_head: nn.Module | None = None,
    head_decay: float | None = None,
    weight_decay: float = 0.0,
    progress: bool = True,
) -> list[float]:
    """Train ``heads`` in place (moved to ``device``) with AdamW; returns the loss of every step.

    The loss is cross-entropy summed over heads, head i weighted by ``head_decay ** i`` when
    given (Medusa's training used 0.8). Heads train in their own dtype: use float32 heads.
    """
    device = torch.device(device) if device is not None else next(heads.parameters()).device
    heads.to(device).train()
    num_heads = heads.config.num_heads
    inputs, labels = _flat_examples(hidden, tokens, num_heads)  # (M, H), (M, heads)
    if not len(inputs):
        raise ValueError("no training positions: every row is shorter than 3 tokens or ignored")
    dtype = next(heads.parameters()).dtype
    weights = [1.0 if head_decay is None else head_decay**i for i in range(num_heads)]
    optimizer = torch.optim.AdamW(heads.parameters(), lr=lr, weight_decay=weight_decay)
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(inputs), generator=generator)
    cursor, losses = 0, []
    restore = _frozen(lm_head)
    try:
        bar = tqdm(range(steps), desc="medusa heads", disable=not progress)
        for _ in bar:
            if cursor + batch_size > len(order):  # a new epoch: reshuffle
                order, cursor = torch.randperm(len(inputs), generator=generator), 0
            index = order[cursor : cursor + batch_size]
            cursor += batch_size
            x = inputs[index].to(device=device, dtype=dtype)  # (b, H)
            y = labels[index].to(device)  # (b, heads)
            logits = heads(x, lm_head)  # (heads, b, V)
            loss = sum(
                weights[i] * F.cross_entropy(logits[i].float(), y[:, i], ignore_index=IGNORE_INDEX, reduction="sum")
                / (y[:, i] != IGNORE_INDEX).sum().clamp_min(1)
                for i in range(num_heads)
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach().item())
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    finally:
        for p, requires_grad in restore:
            p.requires_grad_(requires_grad)
        heads.eval()
    return losses


@torch.no_grad()
def head_topk_accuracy(
    heads: MedusaHeads,
    hidden: torch.Tensor,
    tokens: torch.Tensor,
    k: int,
    *,
    lm_head: nn.Module | None = None,
    batch_size: int = 1024,
) -> torch.Tensor:
    """(num_heads, k) cumulative top-k accuracy: ``[i, r]`` = share of head i's labelled positions
    whose true token is among its r + 1 best candidates."""
    device = next(heads.parameters()).device
    dtype = next(heads.parameters()).dtype
    num_heads = heads.config.num_heads
    inputs, labels = _flat_examples(hidden, tokens, num_heads)  # (M, H), (M, heads)
    hits = torch.zeros(num_heads, k, dtype=torch.float64)  # (heads, k) true token at rank r
    for start in range(0, len(inputs), batch_size):
        x = inputs[start : start + batch_size].to(device=device, dtype=dtype)  # (b, H)
        y = labels[start : start + batch_size].to(device)  # (b, heads)
        topk = heads(x, lm_head).topk(k, dim=-1).indices  # (heads, b, k)
        match = topk == y.T.unsqueeze(-1)  # (heads, b, k); IGNORE_INDEX never matches
        hits += match.sum(dim=1).double().cpu()
    counts = (labels != IGNORE_INDEX).sum(dim=0).clamp_min(1).double()  # (heads,)
    return (hits.cumsum(dim=1) / counts[:, None]).float()
